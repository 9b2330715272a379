package procmap

import (
	"os"
	"testing"

	"github.com/prometheus/procfs"
)

// TestModel: a process's mappings are found at the times they held:
// a fork starts with its parent's, an exec with none, a mapping over an
// old one cuts it, a thread resolves through its process, and what an
// earlier time saw stays as it was.
func TestModel(t *testing.T) {
	m := New()
	bin := m.Object(Object{Path: "/bin/a", Dev: 1, Ino: 10})
	lib := m.Object(Object{Path: "/lib/c.so", Dev: 1, Ino: 11})
	if m.Object(Object{Path: "/bin/a", Dev: 1, Ino: 10}) != bin {
		t.Fatal("one object, two indexes")
	}
	m.Mmap(100, 10, 0x1000, 0x3000, 0, bin)
	m.Fork(200, 200, 100, 20) // a child process
	m.Fork(100, 101, 100, 25) // a thread of 100
	m.Exec(200, 30)
	m.Mmap(200, 40, 0x2000, 0x1000, 0x5000, lib)
	m.Mmap(100, 50, 0x2000, 0x1000, 0x9000, lib) // over the middle of bin's
	cases := []struct {
		tid        int32
		t, addr    uint64
		ok         bool
		obj        int
		start, off uint64
	}{
		{100, 15, 0x2500, true, bin, 0x1000, 0},
		{101, 30, 0x2500, true, bin, 0x1000, 0}, // the thread, through its process
		{100, 55, 0x2500, true, lib, 0x2000, 0x9000},
		{100, 55, 0x3500, true, bin, 0x3000, 0x2000}, // the cut's upper half
		{100, 55, 0x1500, true, bin, 0x1000, 0},
		{200, 25, 0x1500, true, bin, 0x1000, 0}, // the fork's copy
		{200, 35, 0x1500, false, 0, 0, 0},       // after exec, nothing
		{200, 45, 0x2800, true, lib, 0x2000, 0x5000},
		{100, 5, 0x1500, false, 0, 0, 0}, // before anything was mapped
		{300, 50, 0x1500, false, 0, 0, 0},
	}
	for _, c := range cases {
		mp, ok := m.Find(c.tid, c.t, c.addr)
		if ok != c.ok || ok && (mp.Obj != c.obj || mp.Start != c.start || mp.Pgoff != c.off) {
			t.Errorf("Find(%d, %d, %#x) = %+v, %v; want obj %d at %#x from %#x", c.tid, c.t, c.addr, mp, ok, c.obj, c.start, c.off)
		}
	}
	if used := m.Used([]int32{200}); len(used) != 2 {
		t.Errorf("objects of 200: %v, want both", used)
	}
}

// TestDump: the walk of /proc finds this test's own executable mapped,
// as the kernel names it.
func TestDump(t *testing.T) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Fatal(err)
	}
	m := New()
	if err := m.Dump(fs); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var addr uint64
	for _, img := range m.Procs[int32(os.Getpid())] {
		for _, mp := range img.Maps {
			if m.Objects[mp.Obj].Path == exe {
				addr = mp.Start
			}
		}
	}
	if addr == 0 {
		t.Fatalf("no mapping of %s in the dump of this process", exe)
	}
	if _, ok := m.Find(int32(os.Getpid()), 1, addr); !ok {
		t.Errorf("Find of %#x in this process at time 1: none", addr)
	}
}

// TestPrune: Prune forgets exited processes that keep refuses, with
// their threads, and keeps the others; a pid forked again after its exit
// is a live process, not forgotten.
func TestPrune(t *testing.T) {
	m := New()
	obj := m.Object(Object{Path: "/bin/x", Ino: 1})
	for _, pid := range []int32{10, 11, 12} {
		m.Fork(pid, pid, 1, 100)
		m.Mmap(pid, 110, 0x1000, 0x1000, 0, obj)
	}
	m.Fork(10, 20, 10, 120) // a thread of 10
	m.Exit(10, 20)          // the thread alone: 10 lives on
	m.Exit(11, 11)
	m.Exit(12, 12)
	m.Exit(10, 10)
	m.Fork(12, 12, 1, 200) // pid 12 used again
	if n := m.Prune(func(pid int32) bool { return pid == 11 }); n != 1 {
		t.Fatalf("forgot %d, want 1 (pid 10)", n)
	}
	if _, ok := m.Procs[10]; ok {
		t.Error("pid 10 exited and was not kept, but is still there")
	}
	if _, ok := m.Threads[20]; ok {
		t.Error("thread 20 of the forgotten pid 10 is still there")
	}
	if _, ok := m.Find(11, 150, 0x1800); !ok {
		t.Error("pid 11, kept, lost its mapping")
	}
	if img := m.at(12, 250); img == nil || len(img.Maps) != 0 {
		t.Errorf("pid 12, forked again, has image %+v, want the new process's (no mappings)", img)
	}
	if n := m.Prune(func(int32) bool { return false }); n != 1 {
		t.Errorf("second prune forgot %d, want 1 (pid 11, no longer kept)", n)
	}
}
