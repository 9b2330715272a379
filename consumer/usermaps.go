package consumer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/elfsym"
	"github.com/kconsume/kconsume/internal/procmap"
)

// UserSymbols is the file, in a trace's directory, that names the user
// call chains' frames after the processes and their files are gone: the
// address spaces of the processes that appear in user call chains (what
// they mapped, and when) and the functions of the files they mapped,
// gzip-compressed JSON (userSymbolFile). CTF readers skip it.
const UserSymbols = ".usersyms.gz"

// userSymbolFile is UserSymbols' content.
type userSymbolFile struct {
	Model   *procmap.Model `json:"model"`
	Objects []userObject   `json:"objects"`
}

// userObject is a mapped file's symbols, as elfsym reads them.
type userObject struct {
	Path     string           `json:"path"`
	BuildID  string           `json:"build_id,omitempty"`
	Segments []elfsym.Segment `json:"segments"`
	Symbols  []userSymbol     `json:"symbols"`
}

type userSymbol struct {
	Name  string `json:"n"`
	Value uint64 `json:"v"`
	Size  uint64 `json:"s,omitempty"`
}

// MaxHeldFiles bounds the mapped files held open, so that their symbols
// can be read at the end even if they are deleted meanwhile.
const MaxHeldFiles = 4096

// userMaps follows, while user call chains are recorded, what processes
// map, fork and exec, from the kernel's side-band records of a dummy
// perf event on every CPU (as perf record does), after a walk of /proc
// for the processes already running.
type userMaps struct {
	mu    sync.Mutex
	model *procmap.Model
	held  map[int]*os.File // by object index
	rings []*sideRing
	lost  atomic.Uint64 // records the kernel dropped: mappings unknown
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once // closes stop
	wake  int       // an eventfd halt and catchUp write, to end loop's poll
	// caughtUp takes catchUp's requests, each closed once loop has
	// read every record the rings held when it was sent.
	caughtUp chan chan struct{}
	// started is set once loop runs.
	started bool
	// enc caches objectMember's entries, by object index: an object's
	// file does not change (its inode is checked when held).
	enc map[int][]byte
	// changes counts the drains that applied records; changed is
	// signalled (without blocking) after each (the saver's wakeup).
	changes atomic.Uint64
	changed chan struct{}
	// unheld counts the objects not held open because MaxHeldFiles were;
	// unread, the objects of the last snapshot whose file could not be
	// read (gone before it was held, or not ELF).
	unheld, unread int
}

// catchUp has the loop apply every record the rings hold now, and waits
// for it: the loop may not have read yet what a chunk's processes just
// mapped, and the model would lag by that.
func (u *userMaps) catchUp() {
	if !u.started {
		return
	}
	done := make(chan struct{})
	select {
	case u.caughtUp <- done:
	case <-u.done:
		return
	}
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(u.wake, one[:])
	select {
	case <-done:
	case <-u.done:
	}
}

// halt stops the loop, and waits for its last read.
func (u *userMaps) halt() {
	u.once.Do(func() {
		close(u.stop)
		var one [8]byte
		one[0] = 1
		_, _ = unix.Write(u.wake, one[:])
	})
	<-u.done
}

// startUserMaps dumps the running processes' mappings and starts
// following the kernel's records of new ones, stamped on the clock
// clockID (the trace's). It fails when the perf events cannot be opened.
func startUserMaps(ncpu int, clockID int32) (*userMaps, error) {
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("following processes' mappings for user call chains: eventfd: %w", err)
	}
	u := &userMaps{model: procmap.New(), held: map[int]*os.File{}, stop: make(chan struct{}), done: make(chan struct{}), wake: wake, caughtUp: make(chan chan struct{}, 1), enc: map[int][]byte{}, changed: make(chan struct{}, 1)}
	for cpu := range ncpu {
		r, err := openSideRing(cpu, clockID)
		if errors.Is(err, unix.ENODEV) {
			continue // offline
		}
		if err != nil {
			u.close()
			return nil, fmt.Errorf("following processes' mappings for user call chains: %w", err)
		}
		u.rings = append(u.rings, r)
	}
	// The records start before the walk: a mapping made meanwhile is in
	// one or the other, or both.
	if fs, err := procfs.NewDefaultFS(); err == nil {
		_ = u.model.Dump(fs)
		for i, o := range u.model.Objects {
			u.hold(i, o)
		}
	}
	u.started = true
	go u.loop()
	return u, nil
}

// loop reads the rings until stop, then once more.
func (u *userMaps) loop() {
	defer close(u.done)
	// It sleeps until the kernel has a record (the events wake at each)
	// or halt writes the eventfd: an idle machine does not wake it.
	fds := make([]unix.PollFd, len(u.rings)+1)
	for i, r := range u.rings {
		fds[i] = unix.PollFd{Fd: int32(r.fd), Events: unix.POLLIN}
	}
	fds[len(u.rings)] = unix.PollFd{Fd: int32(u.wake), Events: unix.POLLIN}
	for {
		select {
		case <-u.stop:
			u.drain()
			return
		default:
		}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			// Poll cannot fail on these descriptors; should it, a
			// period keeps the records read.
			_, _ = unix.Poll(nil, 100)
		}
		select {
		case done := <-u.caughtUp:
			var buf [8]byte
			_, _ = unix.Read(u.wake, buf[:]) // the eventfd readable no more
			u.drain()
			close(done)
			continue
		default:
		}
		u.drain()
	}
}

// drain applies every record the rings hold, in time order.
func (u *userMaps) drain() {
	var recs []sideRecord
	for _, r := range u.rings {
		recs = r.read(recs, &u.lost)
	}
	if len(recs) == 0 {
		return
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].time < recs[j].time })
	u.mu.Lock()
	defer func() {
		u.mu.Unlock()
		u.changes.Add(1)
		select {
		case u.changed <- struct{}{}:
		default:
		}
	}()
	for _, rec := range recs {
		switch rec.kind {
		case unix.PERF_RECORD_MMAP2:
			o := procmap.Object{Path: rec.path, Dev: rec.dev, Ino: rec.ino}
			i := u.model.Object(o)
			u.hold(i, o)
			u.model.Mmap(rec.pid, rec.time, rec.addr, rec.length, rec.pgoff, i)
		case unix.PERF_RECORD_FORK:
			u.model.Fork(rec.pid, rec.tid, rec.ppid, rec.time)
		case unix.PERF_RECORD_EXIT:
			u.model.Exit(rec.pid, rec.tid)
		case unix.PERF_RECORD_COMM:
			u.model.Exec(rec.pid, rec.time)
		}
	}
}

// hold opens object i's file, if it is still the one mapped (the same
// inode number), and keeps it open.
func (u *userMaps) hold(i int, o procmap.Object) {
	if _, ok := u.held[i]; ok {
		return
	}
	if len(u.held) >= MaxHeldFiles {
		u.unheld++
		return
	}
	f, err := os.Open(o.Path)
	if err != nil {
		u.held[i] = nil
		return
	}
	// The inode's number tells the file mapped from one put in its
	// place since; its device may not: on overlayfs (containers, the
	// vmtest guests' /tmp) stat gives the overlay's and perf's record
	// the underlying file system's (file_inode of the mapping).
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Ino != o.Ino {
		f.Close()
		u.held[i] = nil
		return
	}
	u.held[i] = f
}

// finish stops following, and returns the symbol file for the processes
// pids (those with user call chains) and their threads.
func (u *userMaps) finish(pids []int32) *symbolSnapshot {
	u.halt()
	return u.snapshot(pids)
}

// symbolSnapshot is UserSymbols' content as snapshot takes it: the model
// of the processes, and each object's entry already encoded, a gzip
// member of its JSON (userObject), which writeUserSymbols puts together.
type symbolSnapshot struct {
	model   *procmap.Model
	objects [][]byte
}

// snapshot returns the symbol file for the processes pids as they are
// known now: finish's, while following goes on (a rewind's, a
// rotation's, the saver's).
func (u *userMaps) snapshot(pids []int32) *symbolSnapshot {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := procmap.New()
	procs := map[int32]bool{}
	for _, pid := range pids {
		procs[pid] = true
	}
	for tid, pid := range u.model.Threads {
		if procs[pid] {
			m.Threads[tid] = pid
		}
	}
	used := u.model.Used(slices.Collect(func(yield func(int32) bool) {
		for p := range procs {
			if !yield(p) {
				return
			}
		}
	}))
	// The saved model numbers its objects anew: only those used.
	renum := map[int]int{}
	out := &symbolSnapshot{model: m}
	u.unread = 0
	for _, i := range used {
		o := u.model.Objects[i]
		renum[i] = m.Object(o)
		member, read := u.objectMember(i, o)
		if !read && !anonymous(o.Path) {
			u.unread++
		}
		out.objects = append(out.objects, member)
	}
	for pid := range procs {
		for _, img := range u.model.Procs[pid] {
			maps := make([]procmap.Mapping, 0, len(img.Maps))
			for _, mp := range img.Maps {
				mp.Obj = renum[mp.Obj]
				maps = append(maps, mp)
			}
			m.Procs[pid] = append(m.Procs[pid], procmap.Image{Since: img.Since, Maps: maps})
		}
	}
	return out
}

// anonymous reports whether a mapping's path names no file that could
// have been held: shared memory (memfd_create, SysV segments) or a
// device.
func anonymous(path string) bool {
	return strings.HasPrefix(path, "/memfd:") || strings.HasPrefix(path, "/SYSV") || strings.HasPrefix(path, "/dev/")
}

// objectMember returns object i's entry of UserSymbols, a gzip member of
// its JSON, and whether its symbols could be read. A read entry is
// kept for the next snapshot: symbols do not change, and a save then
// costs the model's encoding alone.
func (u *userMaps) objectMember(i int, o procmap.Object) ([]byte, bool) {
	if b, ok := u.enc[i]; ok {
		return b, true
	}
	uo := u.objectSymbols(i, o)
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	_ = json.NewEncoder(z).Encode(uo) // to memory: cannot fail
	_ = z.Close()
	read := uo.Segments != nil
	if read {
		u.enc[i] = buf.Bytes()
	}
	return buf.Bytes(), read
}

// prune forgets the processes that exited and are not among those with
// user call chains, which procs returns (sorted): no chain of theirs can
// come, so the symbol file never needs them. procs is read under the
// lock that the side-band reader takes to apply records, after every
// exit applied so far: a process's chains are noted before it exits. It
// returns how many processes it forgot and the processes procs gave,
// or procs' error.
func (u *userMaps) prune(procs func() ([]int32, error)) (int, []int32, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	keep, err := procs()
	if err != nil {
		return 0, nil, err
	}
	return u.model.Prune(func(pid int32) bool {
		_, found := slices.BinarySearch(keep, pid)
		return found
	}), keep, nil
}

// objectSymbols reads object i's functions, from the file held open or
// else from its path; none when neither can be read.
func (u *userMaps) objectSymbols(i int, o procmap.Object) userObject {
	from := o.Path
	if f := u.held[i]; f != nil {
		from = "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	}
	uo := userObject{Path: o.Path}
	obj, err := elfsym.OpenAt(o.Path, from)
	if err != nil {
		return uo
	}
	uo.BuildID, uo.Segments = obj.BuildID, obj.Segments()
	for _, s := range obj.Symbols() {
		uo.Symbols = append(uo.Symbols, userSymbol{Name: s.Name, Value: s.Value, Size: s.Size})
	}
	return uo
}

// close stops the loop and releases the rings and the files held.
func (u *userMaps) close() {
	if u.started {
		u.halt()
	}
	for _, r := range u.rings {
		r.close()
	}
	u.rings = nil
	for _, f := range u.held {
		if f != nil {
			f.Close()
		}
	}
	u.held = nil
	if u.wake > 0 {
		_ = unix.Close(u.wake)
		u.wake = -1
	}
}

// writeUserSymbols writes f into dir as UserSymbols: a JSON document
// (userSymbolFile) in gzip members, the objects' as snapshot encoded
// them, which a gzip reader reads as one stream.
func writeUserSymbols(dir string, f *symbolSnapshot) error {
	return writeAtomic(dir, UserSymbols, "the user symbols", func(w io.Writer) error {
		member := func(write func(io.Writer) error) error {
			z := gzip.NewWriter(w)
			if err := write(z); err != nil {
				return err
			}
			return z.Close()
		}
		text := func(s string) func(io.Writer) error {
			return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
		}
		err := member(func(w io.Writer) error {
			if _, err := io.WriteString(w, `{"model":`); err != nil {
				return err
			}
			if err := json.NewEncoder(w).Encode(f.model); err != nil {
				return err
			}
			_, err := io.WriteString(w, `,"objects":[`)
			return err
		})
		for k, o := range f.objects {
			if err == nil && k > 0 {
				err = member(text(","))
			}
			if err == nil {
				_, err = w.Write(o)
			}
		}
		if err == nil {
			err = member(text("]}\n"))
		}
		return err
	})
}

// UserSymbolTable names the frames of a trace's user call chains
// (UserSymbols).
type UserSymbolTable struct {
	model   *procmap.Model
	objects []*elfsym.Object
}

// ReadUserSymbols returns the user symbols saved in the trace in dir. It
// fails with ErrNoSymbols when there are none, or when the file is
// unreadable or corrupt.
func ReadUserSymbols(dir string) (*UserSymbolTable, error) {
	var uf userSymbolFile
	err := readGzip(dir, UserSymbols, "the trace's user symbols", func(r io.Reader) error {
		if err := json.NewDecoder(r).Decode(&uf); err != nil {
			return err
		}
		if uf.Model == nil || uf.Model.Procs == nil || len(uf.Objects) != len(uf.Model.Objects) {
			return errors.New("not a table of processes and objects")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	t := &UserSymbolTable{model: uf.Model}
	if t.model.Threads == nil {
		t.model.Threads = map[int32]int32{}
	}
	for _, o := range uf.Objects {
		syms := make([]elfsym.Symbol, len(o.Symbols))
		for i, s := range o.Symbols {
			syms[i] = elfsym.Symbol{Name: s.Name, Value: s.Value, Size: s.Size}
		}
		t.objects = append(t.objects, elfsym.Saved(o.Path, o.BuildID, o.Segments, syms))
	}
	return t, nil
}

// Resolve returns the function that held addr in thread tid at time t
// (on the trace's clock), addr's offset in it and the file it is in; fn
// is "" when the file is known but not the function, and ok false when
// no mapping of the process held addr.
func (t *UserSymbolTable) Resolve(tid int32, when, addr uint64) (fn string, off uint64, path string, ok bool) {
	mp, ok := t.model.Find(tid, when, addr)
	if !ok || mp.Obj < 0 || mp.Obj >= len(t.objects) {
		return "", 0, "", false
	}
	o := t.objects[mp.Obj]
	if s, off, found := o.Resolve(addr, mp.Start, mp.Pgoff); found {
		return s.Name, off, o.Path, true
	}
	return "", addr - mp.Start + mp.Pgoff, o.Path, true
}
