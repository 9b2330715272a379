package consumer

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestCommFilter: only the task named in Comms is recorded.
func TestCommFilter(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 3000
	c := startChild(t, "getpid", n)
	s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, Comms: []string{childComm}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if counts, lost := countEvents(t, dir); counts["syscalls:sys_enter_getpid"] != n || lost != 0 {
		t.Fatalf("comm filter: %v, %d lost; want %d", counts, lost, n)
	}
}

// TestCgroupFilter: only tasks in the cgroup v2 subtree are recorded.
func TestCgroupFilter(t *testing.T) {
	testenv.RequireRoot(t)
	root := cgroup2Root(t)
	cg := filepath.Join(root, "kconsume-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	c := startChild(t, "getpid", n)
	t.Cleanup(func() {
		// The child is gone by then; an empty cgroup can be removed.
		_ = os.Remove(cg)
	})
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(c.cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, Cgroup: cg})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if counts, lost := countEvents(t, dir); counts["syscalls:sys_enter_getpid"] != n || lost != 0 {
		t.Fatalf("cgroup filter: %v, %d lost; want %d", counts, lost, n)
	}
}

func cgroup2Root(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	testenv.Missing(t, "no cgroup v2 hierarchy mounted")
	return ""
}

// TestStopStartCPU: a stopped CPU records nothing, the gate stops all,
// and Start resumes; Stats counts what was emitted.
func TestStopStartCPU(t *testing.T) {
	testenv.RequireRoot(t)
	onOwnThread(t, testStopStartCPU)
}

func testStopStartCPU(t *testing.T, tid int) {
	s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{tid}})
	ncpu := s.CPUs()
	for cpu := 0; cpu < ncpu; cpu++ {
		if err := s.StopCPU(cpu); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	getpids(100)
	for cpu := 0; cpu < ncpu; cpu++ {
		if err := s.StartCPU(cpu); err != nil {
			t.Fatal(err)
		}
	}
	getpids(100)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	getpids(100)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	stats, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	var emitted, written uint64
	for _, st := range stats {
		emitted += st.Emitted
		written += st.Channel.Records
	}
	if emitted != 100 || written != 100 {
		t.Fatalf("emitted %d, written %d; want 100 (only the middle burst)", emitted, written)
	}
	if err := s.StopCPU(ncpu); err == nil {
		t.Fatal("StopCPU past the last CPU: no error")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Flush(); err != ErrClosed {
		t.Fatalf("Flush after Close: %v, want ErrClosed", err)
	}
	if counts, _ := countEvents(t, dir); counts["syscalls:sys_enter_getpid"] != 100 {
		t.Fatalf("trace has %v, want 100", counts)
	}
}

// onOwnThread runs fn locked to a thread that is not the process's main
// thread, with that thread's id, so a pid filter on it sees only fn's
// calls. The Go runtime itself calls getpid when it signals threads, and
// the main thread's id is the process id, which every thread's calls
// match.
func onOwnThread(t *testing.T, fn func(t *testing.T, tid int)) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if tid := unix.Gettid(); tid != unix.Getpid() {
		fn(t, tid)
		return
	}
	// Held locked here, the main thread cannot run the subtest.
	t.Run("off-main-thread", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		fn(t, unix.Gettid())
	})
}

// getpids makes n getpid calls on this thread.
func getpids(n int) {
	for i := 0; i < n; i++ {
		os.Getpid()
	}
}

// TestReset drops what was recorded before it.
func TestReset(t *testing.T) {
	testenv.RequireRoot(t)
	onOwnThread(t, testReset)
}

func testReset(t *testing.T, tid int) {
	s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{tid}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	getpids(500)
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	getpids(70)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if counts, _ := countEvents(t, dir); counts["syscalls:sys_enter_getpid"] != 70 {
		t.Fatalf("after reset: %v, want 70", counts)
	}
}

// TestDataLoc records sched_process_exec, whose filename is a __data_loc
// string: it must read back as the path that was executed.
func TestDataLoc(t *testing.T) {
	testenv.RequireRoot(t)
	s, dir := newTestSession(t, Config{Events: []string{"sched:sched_process_exec"}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, "getpid", 1)
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	found := false
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if string(field(vals, "filename").Text()) == os.Args[0] {
			found = true
		}
	})
	if !found {
		t.Fatalf("no sched_process_exec with filename %q", os.Args[0])
	}
	lines, _ := testenv.RunBT2(t, dir)
	if !strings.Contains(strings.Join(lines, "\n"), `filename = "`+os.Args[0]+`"`) {
		t.Fatalf("babeltrace2 does not show filename %q", os.Args[0])
	}
}
