package consumer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kconsume/kconsume/consumer/recorder"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// The test binary doubles as the traced child: with KC_CHILD set it prints
// its thread id, waits for a line on stdin, runs the named load and exits;
// with KC_HOLD_CPU0 set it holds CPU 0 (holdCPU0); with KC_TICK_CPU1 set
// it sleeps in a loop on CPU 1 (tickCPU1).
func TestMain(m *testing.M) {
	if mode := os.Getenv("KC_CHILD"); mode != "" {
		os.Exit(child(mode))
	}
	if d := os.Getenv("KC_HOLD_CPU0"); d != "" {
		os.Exit(holdChild(d))
	}
	if d := os.Getenv("KC_TICK_CPU1"); d != "" {
		os.Exit(tickChild(d))
	}
	code := m.Run()
	testenv.RemoveBin()
	testenv.SweepPins()
	os.Exit(code)
}

// closeBase is the first fd the "close" child closes: far above any open
// fd, so each close fails fast with EBADF and its fd argument numbers the
// event.
const closeBase = 1 << 20

// childComm is the command name the child gives itself.
const childComm = "kc-test-child"

func child(mode string) int {
	runtime.LockOSThread()
	n, _ := strconv.Atoi(os.Getenv("KC_CHILD_N"))
	if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&append([]byte(childComm), 0)[0])), 0, 0, 0); err != nil {
		return 5
	}
	pid := int32(os.Getpid()) // before the test starts recording
	fmt.Println(unix.Gettid())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 3
	}
	// Pinned only now: the CPU may have been offline until the test said go.
	if c, err := strconv.Atoi(os.Getenv("KC_CHILD_CPU")); err == nil {
		var set unix.CPUSet
		set.Set(c)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return 6
		}
	}
	switch mode {
	case "getpid":
		// KC_CHILD_GAP spaces the calls by that long, spinning.
		gap, _ := time.ParseDuration(os.Getenv("KC_CHILD_GAP"))
		for i := 0; i < n; i++ {
			syscall.Getpid()
			// Not even time.Now without a gap: where the guest's clock
			// source has no vDSO read, it is two clock_gettime calls.
			if gap > 0 {
				for t0 := time.Now(); time.Since(t0) < gap; {
				}
			}
		}
	case "close":
		for i := 0; i < n; i++ {
			_ = unix.Close(closeBase + i)
		}
	case "rename":
		// task:task_rename, whose 46-byte record ends in a short.
		for i := 0; i < n; i++ {
			if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&renameComm(i)[0])), 0, 0, 0); err != nil {
				return 8
			}
		}
	case "sleep":
		for i := 0; i < n; i++ {
			time.Sleep(time.Millisecond)
		}
	case "syscalls":
		// Calls that fail at once, with arguments that number them.
		for i := 0; i < n; i++ {
			_ = unix.Close(closeBase + i)
			_, _, _ = unix.Syscall6(unix.SYS_MMAP, mmapArgs(i, 0), mmapArgs(i, 1), mmapArgs(i, 2), mmapArgs(i, 3), mmapArgs(i, 4), mmapArgs(i, 5))
		}
	case "sysuser":
		return sysUserCalls()
	case "openat":
		// Opens that fail at once, of names that number them.
		for i := 0; i < n; i++ {
			_, _ = unix.Openat(unix.AT_FDCWD, fmt.Sprintf("/nonexistent-kcprobe/%d", i), unix.O_RDONLY|i%2*unix.O_CLOEXEC, 0)
		}
	case "int80":
		// 32-bit getpid through int $0x80, then one close as a marker.
		for i := 0; i < n; i++ {
			if r := testenv.Int80(int80Getpid); r != pid {
				return 7
			}
		}
		_ = unix.Close(closeBase)
	default:
		return 4
	}
	return 0
}

// tracedChild starts the helper child; it runs its load when go is called.
type tracedChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	tid   int
}

func startChild(t testing.TB, mode string, n int, env ...string) *tracedChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// No async preemption or GC: the Go runtime must make no syscall that
	// the test counts.
	cmd.Env = append(os.Environ(), "KC_CHILD="+mode, "KC_CHILD_N="+strconv.Itoa(n), "GODEBUG=asyncpreemptoff=1", "GOGC=off")
	cmd.Env = append(cmd.Env, env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	tid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("child said %q", line)
	}
	return &tracedChild{cmd: cmd, stdin: stdin, tid: tid}
}

func (c *tracedChild) run(t testing.TB) {
	t.Helper()
	if err := c.finish(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

// finish tells the child to run its load and returns how it ended.
func (c *tracedChild) finish() error {
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		return err
	}
	return c.cmd.Wait()
}

// recordChild starts s, runs c's load, closes s and returns its stats.
func recordChild(t *testing.T, s *Session, c *tracedChild) []CPUStats {
	t.Helper()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// newTestSession starts a session into a fresh directory; Close runs at
// cleanup if the test did not close it.
func newTestSession(t *testing.T, cfg Config) (*Session, string) {
	t.Helper()
	testenv.RequireRoot(t)
	if cfg.Dir == "" && cfg.Sink == nil {
		cfg.Dir = t.TempDir()
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, cfg.Dir
}

// walkTrace reads dir with our reader in merged order, failing t if time
// goes back, and calls fn for every item with its decoded fields (nil for
// a notice).
func walkTrace(t *testing.T, dir string, fn func(it *relayfmt.Item, vals []relayfmt.Value)) {
	t.Helper()
	tr, err := relayfmt.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tr.Merge()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var vals []relayfmt.Value
	var last uint64
	for m.Next() {
		it := m.Item()
		if it.Time < last {
			t.Fatalf("merged trace goes back in time: %d after %d", it.Time, last)
		}
		last = it.Time
		if it.Kind != relayfmt.EventItem {
			fn(it, nil)
			continue
		}
		if vals, err = it.Fields(vals); err != nil {
			t.Fatal(err)
		}
		fn(it, vals)
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
}

// ftraceInstance creates the ftrace instance kc-NAME-PID, which the
// test's cleanup disables and removes, and returns its directory and a
// function that writes v ("1" or "0") to the enable file of each of
// events ("system:name").
func ftraceInstance(t testing.TB, fs tracefs.FS, name string, events []string) (string, func(v string) error) {
	t.Helper()
	inst := filepath.Join(fs.Root, "instances", fmt.Sprintf("kc-%s-%d", name, os.Getpid()))
	if err := os.Mkdir(inst, 0o755); err != nil {
		t.Fatalf("creating an ftrace instance: %v", err)
	}
	enable := func(v string) error {
		for _, e := range events {
			ev, err := tracefs.ParseEvent(e)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(inst, "events", ev.System, ev.Name, "enable"), []byte(v), 0); err != nil {
				return err
			}
		}
		return nil
	}
	t.Cleanup(func() {
		_ = enable("0")
		if err := os.Remove(inst); err != nil {
			t.Errorf("removing the ftrace instance: %v", err)
		}
	})
	return inst, enable
}

// field returns the value of the named field, or a zero Value.
func field(vals []relayfmt.Value, name string) relayfmt.Value {
	for _, v := range vals {
		if v.Field.Name == name {
			return v
		}
	}
	return relayfmt.Value{}
}

// countEvents reads dir with our reader: events by name and discarded.
func countEvents(t *testing.T, dir string) (map[string]int, uint64) {
	t.Helper()
	counts := map[string]int{}
	var lost uint64
	walkTrace(t, dir, func(it *relayfmt.Item, _ []relayfmt.Value) {
		switch it.Kind {
		case relayfmt.DiscardedEvents:
			lost += it.Count
		case relayfmt.EventItem:
			counts[it.Class.Name]++
		}
	})
	return counts, lost
}

func transports(t *testing.T) []Transport {
	out := []Transport{Perf}
	if _, err := chooseTransport(Ringbuf); err == nil {
		out = append(out, Ringbuf)
	} else if kernelAtLeast(t, 5, 8) {
		t.Fatalf("kernel 5.8+ without BPF ring buffers: %v", err)
	}
	return out
}

// requireBTFPath skips t on a kernel before 5.8, which has no BPF ring
// buffers and so no BTF event programs, and fails it on a newer kernel
// without them.
func requireBTFPath(t *testing.T) {
	t.Helper()
	if _, err := chooseTransport(Ringbuf); err != nil {
		if kernelAtLeast(t, 5, 8) {
			t.Fatalf("kernel 5.8+ without BPF ring buffers: %v", err)
		}
		t.Skipf("kernel before 5.8: no BPF ring buffers, so no BTF event path: %v", err)
	}
}

func kernelAtLeast(t testing.TB, major, minor int) bool {
	a, b, _ := testenv.KernelRelease()
	return a > major || a == major && b >= minor
}

// TestGetpidExact: a child making exactly N getpid calls, filtered to its
// thread, gives exactly N events, by our reader and by babeltrace2.
func TestGetpidExact(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 5000
	type variant struct {
		name     string
		tr       Transport
		global   bool
		noCookie bool
		noRaw    bool
		perf     bool // the raw path from perf tracepoints (recorder.Testing.RawFromPerf)
	}
	var vs []variant
	for _, tr := range transports(t) {
		vs = append(vs, variant{tr.String(), tr, false, false, false, false}, variant{tr.String() + "/patched", tr, false, true, true, false})
		if tr == Ringbuf {
			vs = append(vs, variant{"ringbuf/global", tr, true, false, false, false}, variant{"ringbuf/tracepoint", tr, false, false, true, false}, variant{"ringbuf/raw-perf", tr, false, false, false, true})
		}
	}
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			recorder.Testing.NoCookie, recorder.Testing.RawFromPerf = v.noCookie, v.perf
			defer func() { recorder.Testing.NoCookie, recorder.Testing.RawFromPerf = false, false }()
			sys := SyscallsAuto
			switch {
			case v.noRaw:
				sys = SyscallsTracepoint
			case v.tr == Ringbuf && rawSysExpected(t):
				sys = SyscallsRaw
			}
			c := startChild(t, "getpid", n)
			s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{c.tid}, Transport: v.tr, Global: v.global, Syscalls: sys})
			if s.rec.UsesCookie() == v.noCookie && kernelAtLeast(t, 5, 15) {
				t.Fatalf("useCookie %v on a 5.15+ kernel with recorder.Testing.NoCookie %v", s.rec.UsesCookie(), v.noCookie)
			}
			// The raw syscall path where it runs; otherwise
			// sys_enter_getpid's 12 bytes take kc_record_small where
			// there are cookies and ring buffers.
			want := "kc_tp_0"
			switch {
			case v.tr == Ringbuf && !v.noRaw && rawSysExpected(t):
				want = gen.RingbufProgKcSysEnter
			case s.rec.UsesCookie() && v.tr == Ringbuf:
				want = "kc_tp_s12"
			case s.rec.UsesCookie():
				want = gen.RingbufProgKcTracepoint
			}
			if want == gen.RingbufProgKcSysEnter && s.rec.RawFromPerf() != (v.perf || recorder.Preemptibility().On) {
				t.Fatalf("raw path from perf tracepoints: %v, want %v", s.rec.RawFromPerf(), v.perf || recorder.Preemptibility().On)
			}
			if s.rec.Progs()[0] != want {
				t.Fatalf("recorded by %s, want %s (raw syscall path: %v)", s.rec.Progs()[0], want, s.rec.Why(recorder.PathRawSys))
			}
			if raw, why := s.RawSyscalls(); (len(raw) == 1) != (want == gen.RingbufProgKcSysEnter) || sys == SyscallsTracepoint && why == nil {
				t.Fatalf("RawSyscalls: %q, %v with %s", raw, why, want)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			counts, lost := countEvents(t, dir)
			st, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			// A recorder run the kernel skipped (Missed: another BPF
			// program on the CPU, which kernels whose syscall
			// tracepoints run preemptibly make likelier) is the only
			// excuse for a missing event, and it is counted.
			rec, missed := counts["syscalls:sys_enter_getpid"], int(st[0].Missed)
			if lost != 0 || rec > n || rec < n && rec+missed < n {
				t.Fatalf("our reader: %v, %d lost, %d runs missed; want %d events", counts, lost, missed, n)
			}
			if rec < n {
				t.Logf("%d of %d events missing, %d recorder runs missed by the kernel", n-rec, n, missed)
			}
			lines, discards := testenv.RunBT2(t, dir)
			got := 0
			for _, l := range lines {
				if strings.Contains(l, "syscalls:sys_enter_getpid:") && strings.Contains(l, "common_pid = "+strconv.Itoa(c.tid)) && strings.Contains(l, "__syscall_nr = "+strconv.Itoa(unix.SYS_GETPID)) {
					got++
				}
			}
			if got != rec || len(lines) != rec || len(discards) != 0 {
				t.Fatalf("babeltrace2: %d matching of %d lines, discards %v; want %d\nfirst: %q", got, len(lines), discards, rec, lines[0])
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cases := map[string]Config{
		"no events":     {Dir: dir},
		"unknown event": {Dir: dir, Events: []string{"nosuch:event"}},
		"bad pattern":   {Dir: dir, Events: []string{"sched:["}},
		"ring size":     {Dir: dir, Events: []string{"sched:sched_switch"}, RingSize: 12345},
		"subbuf size":   {Dir: dir, Events: []string{"sched:sched_switch"}, SubbufSize: 1000},
		"one subbuf":    {Dir: dir, Events: []string{"sched:sched_switch"}, NSubbufs: 1},
		"pid":           {Dir: dir, Events: []string{"sched:sched_switch"}, PIDs: []int{-1}},
		"comm":          {Dir: dir, Events: []string{"sched:sched_switch"}, Comms: []string{"0123456789abcdefg"}},
		"cgroup":        {Dir: dir, Events: []string{"sched:sched_switch"}, Cgroup: "/proc"},
		"latency":       {Dir: dir, Events: []string{"sched:sched_switch"}, Latency: 10},
		"no dir":        {Events: []string{"sched:sched_switch"}},
		"global perf":   {Dir: dir, Events: []string{"sched:sched_switch"}, Global: true, Transport: Perf},
		"syscalls":      {Dir: dir, Events: []string{"sched:sched_switch"}, Syscalls: 7},
		"raw perf":      {Dir: dir, Events: []string{"syscalls:sys_enter_getpid"}, Syscalls: SyscallsRaw, Transport: Perf},
		// Rotation: a negative interval, a flight recorder, a size under
		// a sub-buffer per stream, an output that writes no chunks.
		"rotate interval":  {Dir: dir, Events: []string{"sched:sched_switch"}, RotateInterval: -time.Second},
		"rotate overwrite": {Dir: dir, Events: []string{"sched:sched_switch"}, RotateSize: 64 << 20, Mode: relayfmt.Overwrite},
		"rotate size":      {Dir: dir, Events: []string{"sched:sched_switch"}, RotateSize: 4096},
		"rotate dir":       {Dir: dir, Events: []string{"sched:sched_switch"}, RotateInterval: time.Minute},
	}
	for name, cfg := range cases {
		s, err := New(cfg)
		if err == nil {
			s.Close()
			t.Errorf("%s: no error", name)
			continue
		}
		if !errors.Is(err, ErrConfig) && !errors.Is(err, ErrUnknownEvent) {
			t.Errorf("%s: error %v is neither ErrConfig nor ErrUnknownEvent", name, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Fatalf("%s: failed session left files: %v", name, entries)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed sessions left files: %v", entries)
	}
}
