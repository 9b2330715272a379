// Package procmap keeps what a process had mapped, and when, so that the
// user-space addresses of a trace resolve to the object and offset they
// fell in after the process is gone: each process's address spaces in
// time order (a new one at exec, a copy of the parent's at fork), filled
// by the kernel's mmap, fork and exec records (perf's PERF_RECORD_MMAP2,
// FORK and COMM with exec) and by a walk of /proc for the processes that
// ran before.
package procmap

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/procfs"
)

// Object is a mapped file: its path, and its device and inode, which
// tell one file from another of the same path.
type Object struct {
	Path     string `json:"path"`
	Dev, Ino uint64 `json:"-"`
}

// Mapping is an executable mapping of a process: Obj (an index in
// Model.Objects) mapped at [Start, End) from file offset Pgoff.
type Mapping struct {
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
	Pgoff uint64 `json:"pgoff"`
	Obj   int    `json:"obj"`
}

// Image is a process's address space from Since (a time on the trace's
// clock, 0 for "from before the recording") on, until its next image.
type Image struct {
	Since uint64    `json:"since"`
	Maps  []Mapping `json:"maps"`
}

// Model holds the address spaces of processes.
type Model struct {
	// Threads maps a thread id to its process id, where they differ.
	Threads map[int32]int32 `json:"threads"`
	// Procs holds each process's images, oldest first.
	Procs   map[int32][]Image `json:"procs"`
	Objects []Object          `json:"objects"`
	objs    map[Object]int
	// exited holds the processes that exited since they last forked,
	// which Prune may forget.
	exited map[int32]bool
}

// New returns an empty model.
func New() *Model {
	return &Model{Threads: map[int32]int32{}, Procs: map[int32][]Image{}, objs: map[Object]int{}, exited: map[int32]bool{}}
}

// Exit records that thread tid of process pid exited; the process has
// once its main thread (tid pid) has.
func (m *Model) Exit(pid, tid int32) {
	if pid != tid {
		return
	}
	if m.exited == nil {
		m.exited = map[int32]bool{}
	}
	m.exited[pid] = true
}

// Prune forgets the processes that exited for which keep reports false,
// and their threads, and returns how many it forgot. A process that
// ran before the model began and exited is forgotten alike.
func (m *Model) Prune(keep func(pid int32) bool) int {
	n := 0
	for pid := range m.exited {
		if keep(pid) {
			continue
		}
		delete(m.Procs, pid)
		delete(m.exited, pid)
		n++
	}
	if n > 0 {
		for tid, pid := range m.Threads {
			if _, ok := m.Procs[pid]; !ok {
				delete(m.Threads, tid)
			}
		}
	}
	return n
}

// Object returns the index of the object, adding it when new.
func (m *Model) Object(o Object) int {
	if m.objs == nil {
		m.objs = map[Object]int{}
	}
	if i, ok := m.objs[o]; ok {
		return i
	}
	m.Objects = append(m.Objects, o)
	m.objs[o] = len(m.Objects) - 1
	return len(m.Objects) - 1
}

// current returns pid's image at time t, a new one when its last began
// before t and fresh is set (an exec), or a copy of it when t is later
// than its start (so that what an earlier event saw stays as it was).
func (m *Model) current(pid int32, t uint64, fresh bool) *Image {
	imgs := m.Procs[pid]
	if len(imgs) == 0 || fresh {
		m.Procs[pid] = append(imgs, Image{Since: t})
		return &m.Procs[pid][len(m.Procs[pid])-1]
	}
	last := &imgs[len(imgs)-1]
	if last.Since < t {
		m.Procs[pid] = append(imgs, Image{Since: t, Maps: slices.Clone(last.Maps)})
		return &m.Procs[pid][len(m.Procs[pid])-1]
	}
	return last
}

// Mmap records that process pid mapped obj at [start, start+length) from
// pgoff at time t, over whatever it had mapped there.
func (m *Model) Mmap(pid int32, t, start, length, pgoff uint64, obj int) {
	img := m.current(pid, t, false)
	end := start + length
	var kept []Mapping
	for _, mp := range img.Maps {
		// What the new mapping covers of an old one is gone.
		if mp.End <= start || mp.Start >= end {
			kept = append(kept, mp)
			continue
		}
		if mp.Start < start {
			kept = append(kept, Mapping{Start: mp.Start, End: start, Pgoff: mp.Pgoff, Obj: mp.Obj})
		}
		if mp.End > end {
			kept = append(kept, Mapping{Start: end, End: mp.End, Pgoff: mp.Pgoff + (end - mp.Start), Obj: mp.Obj})
		}
	}
	kept = append(kept, Mapping{Start: start, End: end, Pgoff: pgoff, Obj: obj})
	sort.Slice(kept, func(i, j int) bool { return kept[i].Start < kept[j].Start })
	img.Maps = kept
}

// Exec records that process pid replaced its address space at time t.
func (m *Model) Exec(pid int32, t uint64) { m.current(pid, t, true) }

// Fork records that thread tid of process pid was created at time t by
// process ppid: a new process starts with a copy of its parent's
// address space; a new thread shares its process's.
func (m *Model) Fork(pid, tid, ppid int32, t uint64) {
	if tid != pid {
		m.Threads[tid] = pid
		return
	}
	delete(m.exited, pid) // a pid used again
	if pid == ppid {
		return
	}
	var maps []Mapping
	if img := m.at(ppid, t); img != nil {
		maps = slices.Clone(img.Maps)
	}
	m.Procs[pid] = append(m.Procs[pid], Image{Since: t, Maps: maps})
}

// at returns pid's image at time t, or nil.
func (m *Model) at(pid int32, t uint64) *Image {
	imgs := m.Procs[pid]
	i := sort.Search(len(imgs), func(i int) bool { return imgs[i].Since > t }) - 1
	if i < 0 {
		if len(imgs) > 0 && imgs[0].Since == 0 {
			return &imgs[0]
		}
		return nil
	}
	return &imgs[i]
}

// Process returns the process of thread tid.
func (m *Model) Process(tid int32) int32 {
	if pid, ok := m.Threads[tid]; ok {
		return pid
	}
	return tid
}

// Find returns the mapping that held addr in thread tid's process at
// time t, and false when none did.
func (m *Model) Find(tid int32, t, addr uint64) (Mapping, bool) {
	img := m.at(m.Process(tid), t)
	if img == nil {
		return Mapping{}, false
	}
	i := sort.Search(len(img.Maps), func(i int) bool { return img.Maps[i].End > addr })
	if i == len(img.Maps) || img.Maps[i].Start > addr {
		return Mapping{}, false
	}
	return img.Maps[i], true
}

// Used returns the objects the images of processes hold, by index.
func (m *Model) Used(procs []int32) []int {
	seen := map[int]bool{}
	for _, pid := range procs {
		for _, img := range m.Procs[pid] {
			for _, mp := range img.Maps {
				seen[mp.Obj] = true
			}
		}
	}
	out := make([]int, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// Dump adds to m what every process of fs has mapped now, its executable
// file mappings, as from before the recording (time 0), and every
// thread's process. A process that exits meanwhile is skipped. It fails
// when fs's processes cannot be listed.
func (m *Model) Dump(fs procfs.FS) error {
	procs, err := fs.AllProcs()
	if err != nil {
		return fmt.Errorf("listing processes: %w", err)
	}
	for _, p := range procs {
		maps, err := p.ProcMaps()
		if err != nil {
			continue
		}
		img := Image{}
		for _, mp := range maps {
			if mp.Perms == nil || !mp.Perms.Execute || !strings.HasPrefix(mp.Pathname, "/") {
				continue
			}
			obj := m.Object(Object{Path: mp.Pathname, Dev: mp.Dev, Ino: mp.Inode})
			img.Maps = append(img.Maps, Mapping{Start: uint64(mp.StartAddr), End: uint64(mp.EndAddr), Pgoff: uint64(mp.Offset), Obj: obj})
		}
		pid := int32(p.PID)
		if len(m.Procs[pid]) == 0 {
			m.Procs[pid] = []Image{img}
		}
		tasks, err := fs.AllThreads(p.PID)
		if err != nil {
			continue
		}
		for _, tk := range tasks {
			if tk.PID != p.PID {
				m.Threads[int32(tk.PID)] = pid
			}
		}
	}
	return nil
}
