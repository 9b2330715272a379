package consumer

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// int80Getpid is getpid's 32-bit number (arch/x86/entry/syscalls/syscall_32.tbl);
// 20 is writev on x86_64.
const int80Getpid = 20

// mmapArgs returns argument k of the "syscalls" child's i-th mmap: six
// values that tell the arguments and the calls apart. Flags 0 asks for no
// mapping type and a file, and the fd is not open, so the call fails.
func mmapArgs(i, k int) uintptr {
	return [6]uintptr{0x100000 + uintptr(i)<<12, 0x2000 + uintptr(i), unix.PROT_READ, 0, closeBase + uintptr(i), uintptr(i) << 12}[k]
}

// rawSysExpected reports whether this machine should record syscall
// events through the raw syscall path: x86_64 with BPF ring buffers and
// the kernel's BTF.
func rawSysExpected(t *testing.T) bool {
	if runtime.GOARCH != "amd64" || !kernelAtLeast(t, 5, 8) {
		return false
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Logf("no kernel BTF: %v", err)
		return false
	}
	return true
}

func TestSysShape(t *testing.T) {
	fs, err := tracefs.Find()
	if err != nil {
		t.Skip(err)
	}
	cases := map[string]bool{
		"syscalls:sys_enter_getpid": true,  // no argument: 12 bytes
		"syscalls:sys_enter_mmap":   true,  // six
		"syscalls:sys_exit_close":   true,  // ret
		"sched:sched_switch":        false, // not a syscall
	}
	for name, want := range cases {
		ev, err := tracefs.ParseEvent(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := fs.Format(ev)
		if err != nil {
			t.Fatal(err)
		}
		exit, ok := recorder.SysShape(f)
		if ok != want || exit != strings.Contains(name, "exit") {
			t.Errorf("%s: sysShape = %v, %v; want %v, %v", name, exit, ok, strings.Contains(name, "exit"), want)
		}
		if !want {
			continue
		}
		// One field too many or moved: not the kernel's layout.
		g := *f
		g.Fields = append(slices.Clone(f.Fields), tracefs.Field{Name: "x", Offset: f.FixedSize(), Size: 8})
		if _, ok := recorder.SysShape(&g); ok {
			t.Errorf("%s with an extra field: accepted", name)
		}
		if len(f.Fields) > 1 {
			g.Fields = slices.Clone(f.Fields)
			g.Fields[1].Offset += 8
			if _, ok := recorder.SysShape(&g); ok {
				t.Errorf("%s with a moved argument: accepted", name)
			}
		}
	}
}

// TestSyscallRaw records a child's close and mmap calls, entry and exit,
// through the raw syscall path (from its BTF tracepoint programs, and
// from the perf tracepoints it takes where tracing programs run
// preemptibly, forced here, and from BTF again with that forced but
// KCONSUME_RAW_FROM_PERF=0's switch on) and through the syscall
// tracepoints: the
// traces must hold the same records, field for field, and those the
// arguments and results the child passed and got.
func TestSyscallRaw(t *testing.T) {
	testenv.RequireRoot(t)
	if !rawSysExpected(t) {
		t.Skip("the raw syscall path needs x86_64, Linux 5.8 and kernel BTF")
	}
	const n = 2000
	events := []string{"syscalls:sys_enter_close", "syscalls:sys_exit_close", "syscalls:sys_enter_mmap", "syscalls:sys_exit_mmap"}
	variants := []struct {
		name      string
		sys       Syscalls
		forcePerf bool
		forceBTF  bool // the raw path kept on tp_btf (KCONSUME_RAW_FROM_PERF=0)
	}{{"tracepoints", SyscallsTracepoint, false, false}, {"raw", SyscallsRaw, false, false}, {"raw from perf", SyscallsRaw, true, false},
		// Preemptible (forced), yet on tp_btf: the path without its fix.
		{"raw from tp_btf", SyscallsRaw, true, true}}
	runs := make([][]string, len(variants))
	missed := make([]int, len(variants))
	ids := map[string]uint32{}
	for k, v := range variants {
		raw := v.sys == SyscallsRaw
		recorder.Testing.RawFromPerf, recorder.Testing.RawFromBTF = v.forcePerf, v.forceBTF
		c := startChild(t, "syscalls", n)
		s, dir := newTestSession(t, Config{Events: events, PIDs: []int{c.tid}, Transport: Ringbuf, Syscalls: v.sys})
		recorder.Testing.RawFromPerf, recorder.Testing.RawFromBTF = false, false
		if raw {
			for _, f := range s.Events() {
				ids[f.FullName()] = f.ID
			}
			if s.rec.RawFromPerf() != (!v.forceBTF && (v.forcePerf || recorder.Preemptibility().On)) {
				t.Fatalf("%s: raw path from perf tracepoints %v, preemptible %+v", v.name, s.rec.RawFromPerf(), recorder.Preemptibility())
			}
		}
		for i, p := range s.rec.Progs() {
			want := strings.HasPrefix(p, "kc_sys_")
			if want != raw || raw && (p == gen.RingbufProgKcSysExit) != strings.Contains(events[i], "exit") {
				t.Fatalf("%s: %s recorded by %s (raw syscall path: %v)", v.name, events[i], p, s.rec.Why(recorder.PathRawSys))
			}
			// The raw programs leave out the padding after nr: their
			// records go into the trace as they are.
			if raw && s.w.direct[i] < 0 {
				t.Errorf("%s: recorded raw, but its layout is not direct: %+v", events[i], s.w.layouts[i].Ops)
			}
		}
		for _, cs := range recordChild(t, s, c) {
			missed[k] += int(cs.Missed)
		}
		runs[k] = childSyscalls(t, v.name, dir, c, n)
	}
	full := -1
	for k := range runs {
		if len(runs[k]) == 4*n {
			full = k
		}
	}
	if full < 0 {
		t.Fatalf("no run has all %d records: %v records, %v runs missed", 4*n, lens(runs), missed)
	}
	for k := range runs {
		// A recorder run the kernel skipped is the only excuse for a
		// missing record, and it is counted (Stats.Missed): where
		// tracing programs run preemptibly, a program preempted on a
		// busy guest makes the next runs on that CPU miss. A short run
		// must then be the full one with records left out.
		if len(runs[k]) < 4*n {
			if 4*n-len(runs[k]) > missed[k] {
				t.Fatalf("%s: %d records, %d runs missed; want %d", variants[k].name, len(runs[k]), missed[k], 4*n)
			}
			t.Logf("%s: %d records short, %d runs missed", variants[k].name, 4*n-len(runs[k]), missed[k])
			j := 0
			for _, line := range runs[full] {
				if j < len(runs[k]) && runs[k][j] == line {
					j++
				}
			}
			if j != len(runs[k]) {
				t.Fatalf("%s: record %d, %q, is not in the full run", variants[k].name, j, runs[k][j])
			}
			continue
		}
		for i := range runs[k] {
			if runs[k][i] != runs[full][i] {
				t.Fatalf("record %d: %s %q, %s %q", i, variants[k].name, runs[k][i], variants[full].name, runs[full][i])
			}
		}
	}
	// The values themselves, from a full trace (the full ones are equal).
	checkChildSyscalls(t, runs[full], events, ids, n)
}

// lens returns the lengths of runs.
func lens(runs [][]string) []int {
	out := make([]int, len(runs))
	for i, r := range runs {
		out[i] = len(r)
	}
	return out
}

// childSyscalls returns the records in dir of the "syscalls" child c's n
// rounds of calls, as lines "EVENT FIELD=VALUE ...", common_pid checked
// and left out, having checked that babeltrace2 reads as many events as
// our reader and no loss. what names the run in messages.
func childSyscalls(t *testing.T, what, dir string, c *tracedChild, n int) []string {
	t.Helper()
	var lines []string
	// The Go runtime of the child maps memory now and then (more under
	// the race detector): an anonymous mmap, fd -1, and its exit are not
	// the child's calls.
	total, runtimeMmap := 0, false
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Fatalf("%s: %v in the trace", what, it.Kind)
		}
		total++
		switch it.Class.Name {
		case "syscalls:sys_enter_mmap":
			if fd := field(vals, "fd").Uint(0); fd < closeBase || fd >= closeBase+uint64(n) {
				runtimeMmap = true
				return
			}
		case "syscalls:sys_exit_mmap":
			if runtimeMmap {
				runtimeMmap = false
				return
			}
		}
		line := it.Class.Name
		for _, v := range vals {
			switch {
			case v.Field.Name != "common_pid":
				line += fmt.Sprintf(" %s=%d", v.Field.Name, v.Int(0))
			case v.Int(0) != int64(c.tid):
				t.Fatalf("%s: common_pid %d, want %d", what, v.Int(0), c.tid)
			}
		}
		lines = append(lines, line)
	})
	if total != len(lines) {
		t.Logf("%s: %d records of the Go runtime's mmap calls left out", what, total-len(lines))
	}
	bt, discards := testenv.RunBT2(t, dir)
	if len(bt) != total || len(discards) != 0 {
		t.Fatalf("%s: babeltrace2 read %d events and %v discarded, our reader %d", what, len(bt), discards, total)
	}
	return lines
}

// checkChildSyscalls checks that lines (childSyscalls) are the records
// of the "syscalls" child's n rounds of close and mmap, each entered and
// exited (events in that order), with the values the child passed and
// the errors it got; ids are the events' trace ids.
func checkChildSyscalls(t *testing.T, lines, events []string, ids map[string]uint32, n int) {
	t.Helper()
	if len(lines) != 4*n {
		t.Fatalf("%d records, want %d", len(lines), 4*n)
	}
	head := func(ev string) string {
		return fmt.Sprintf("%s common_type=%d __syscall_nr=", ev, ids[ev])
	}
	for i := 0; i < n; i++ {
		want := []string{
			head(events[0]) + fmt.Sprintf("%d fd=%d", unix.SYS_CLOSE, closeBase+i),
			head(events[1]) + fmt.Sprintf("%d ret=%d", unix.SYS_CLOSE, -int(syscall.EBADF)),
			head(events[2]) + fmt.Sprintf("%d addr=%d len=%d prot=%d flags=%d fd=%d off=%d",
				unix.SYS_MMAP, mmapArgs(i, 0), mmapArgs(i, 1), mmapArgs(i, 2), mmapArgs(i, 3), mmapArgs(i, 4), mmapArgs(i, 5)),
			head(events[3]) + fmt.Sprintf("%d ret=%d", unix.SYS_MMAP, -int(syscall.EBADF)),
		}
		for j, w := range want {
			if got := lines[4*i+j]; got != w {
				t.Fatalf("record %d: %q, want %q", 4*i+j, got, w)
			}
		}
	}
}

// TestSyscallCompat: 32-bit syscalls are not syscall events, on the raw
// path and the function path, as with the tracepoints; their numbers
// mean other x86_64 syscalls (20 is writev), and a syscall without
// arguments has one function for both ABIs.
func TestSyscallCompat(t *testing.T) {
	testenv.RequireRoot(t)
	if !rawSysExpected(t) {
		t.Skip("the raw and fentry syscall paths need x86_64, Linux 5.8 and kernel BTF")
	}
	if err := int80Probe(t); err != nil {
		t.Skipf("the kernel runs no 32-bit syscalls here: a child's int $0x80 getpid: %v", err)
	}
	const n = 1000
	events := []string{"syscalls:sys_enter_writev", "syscalls:sys_enter_getpid", "syscalls:sys_enter_close"}
	for _, path := range []Syscalls{SyscallsRaw, SyscallsFentry} {
		onPath(t, path, func(t *testing.T) {
			c := startChild(t, "int80", n)
			s, dir := syscallSession(t, path, events, c)
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			counts, lost := countEvents(t, dir)
			if want := map[string]int{"syscalls:sys_enter_close": 1}; fmt.Sprint(counts) != fmt.Sprint(want) || lost != 0 {
				t.Fatalf("recorded %v, %d lost; want %v", counts, lost, want)
			}
		})
	}
}

// TestSyscallUntracedRuns: while sys_enter_close is recorded, n
// untraced getpid calls run the recorder's programs at least n times on
// the raw path, whose sys_enter sees every syscall, and hardly at all on
// the function path, which attaches to close's functions alone: there
// an untraced syscall runs no BPF and costs nothing (issue 26). The
// kernel's run counts (BPF_ENABLE_STATS, on for this test only) tell.
func TestSyscallUntracedRuns(t *testing.T) {
	testenv.RequireRoot(t)
	if !rawSysExpected(t) {
		t.Skip("the raw and fentry syscall paths need x86_64, Linux 5.8 and kernel BTF")
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("BPF run-time statistics (Linux 5.8): %v", err)
	}
	defer stats.Close()
	const n = 20000
	events := []string{"syscalls:sys_enter_close"}
	for _, path := range []Syscalls{SyscallsRaw, SyscallsFentry} {
		onPath(t, path, func(t *testing.T) {
			c := startChild(t, "getpid", n)
			s, _ := syscallSession(t, path, events, c)
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			before := programRuns(t, s)
			c.run(t)
			after := programRuns(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			var runs uint64
			by := map[string]uint64{}
			for name, r := range after {
				if d := r - before[name]; d > 0 {
					runs += d
					by[name] = d
				}
			}
			t.Logf("%d getpid calls, %d program runs: %v", n, runs, by)
			// The few others are the closes of the guest's other processes.
			if path == SyscallsRaw && runs < n || path == SyscallsFentry && runs >= n/10 {
				t.Errorf("%d getpid calls ran the recorder's programs %d times", n, runs)
			}
		})
	}
	// auto with one event: the function path, else, where programs do
	// not run preemptibly, the event's tracepoint; either way an
	// untraced syscall runs no program.
	t.Run("auto", func(t *testing.T) {
		c := startChild(t, "getpid", n)
		s, _ := newTestSession(t, Config{Events: events, PIDs: []int{c.tid}, Transport: Ringbuf})
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		raw, why := s.RawSyscalls()
		preempt, _ := s.Preemptible()
		before := programRuns(t, s)
		c.run(t)
		after := programRuns(t, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		var runs uint64
		for name, r := range after {
			runs += r - before[name]
		}
		t.Logf("%d getpid calls, %d program runs; raw path: %v (%v)", n, runs, raw, why)
		switch {
		case len(raw) > 0 && !preempt.On:
			t.Errorf("auto took the raw path for one event (function path: %v)", s.rec.Why(recorder.PathFentry))
		case len(raw) == 0 && runs >= n/10:
			t.Errorf("%d getpid calls ran the recorder's programs %d times off the raw path", n, runs)
		}
	})
}

// programRuns returns how many times each of the session's programs has
// run since the statistics went on.
func programRuns(t *testing.T, s *Session) map[string]uint64 {
	t.Helper()
	runs := map[string]uint64{}
	for name, p := range s.rec.Collection().Programs {
		st, err := p.Stats()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		runs[name] = st.RunCount
	}
	return runs
}

// int80Probe makes one int $0x80 getpid in a child and returns how that
// failed, or nil. Kernels built without IA32 emulation or booted with it
// off, and some hypervisors' guests, kill the caller with SIGSEGV.
func int80Probe(t *testing.T) error {
	return startChild(t, "int80", 1).finish()
}

// syscallSession starts a session recording events for the child c on
// path, SyscallsRaw or SyscallsFentry (fentrySession, which may skip),
// and fails t unless the raw path records them.
func syscallSession(t *testing.T, path Syscalls, events []string, c *tracedChild) (*Session, string) {
	t.Helper()
	if path == SyscallsFentry {
		return fentrySession(t, events, c)
	}
	s, dir := newTestSession(t, Config{Events: events, PIDs: []int{c.tid}, Transport: Ringbuf, Syscalls: SyscallsRaw})
	if s.rec.Progs()[0] != gen.RingbufProgKcSysEnter {
		t.Fatalf("recorded by %s (raw syscall path: %v)", s.rec.Progs()[0], s.rec.Why(recorder.PathRawSys))
	}
	return s, dir
}

// fentrySession starts a session recording events through the function
// path for the child c, or skips the test where this machine's kernel
// refuses fentry programs with EPERM: a security policy (an LSM), not a
// missing feature, on our development VM.
func fentrySession(t *testing.T, events []string, c *tracedChild) (*Session, string) {
	t.Helper()
	if !rawSysExpected(t) {
		t.Skip("the fentry syscall path needs x86_64, Linux 5.8 and kernel BTF")
	}
	testenv.RequireRoot(t)
	dir := t.TempDir()
	s, err := New(Config{Events: events, PIDs: []int{c.tid}, Transport: Ringbuf, Syscalls: SyscallsFentry, Dir: dir})
	if errors.Is(err, unix.EPERM) {
		c.run(t)
		t.Skipf("this kernel refuses fentry programs to root (a security policy of the machine): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	got, why := s.FentrySyscalls()
	if !slices.Equal(got, events) {
		t.Fatalf("on the function path: %v, want %v (%v)", got, events, why)
	}
	return s, dir
}

// onPath runs fn as a subtest named after path, and on the function
// path in both its ways (eachFunctionPath).
func onPath(t *testing.T, path Syscalls, fn func(t *testing.T)) {
	t.Run(path.String(), func(t *testing.T) {
		if path == SyscallsFentry {
			eachFunctionPath(t, fn)
			return
		}
		fn(t)
	})
}

// eachFunctionPath runs fn as a subtest on the function path as the
// kernel takes it (fentry and fexit trampolines, or kprobes where
// trampolines run preemptibly) and as one on its kprobes
// (recorder.Testing.FuncKprobes). The kprobes subtest skips on kernels
// without kprobe.multi links, and fails on a preemptible one without.
func eachFunctionPath(t *testing.T, fn func(t *testing.T)) {
	t.Run("default", fn)
	t.Run("kprobes", func(t *testing.T) {
		if err := recorder.KprobeFuncs(); err != nil {
			if p := recorder.Preemptibility(); p.On {
				t.Fatalf("the function path on kprobes, which this kernel needs (%s): %v", p.Why, err)
			}
			t.Skipf("this kernel cannot run the function path on kprobes (kprobe.multi links need Linux 5.18 and CONFIG_FPROBE; Debian's 6.1 lacks it): %v", err)
		}
		recorder.Testing.FuncKprobes = true
		t.Cleanup(func() { recorder.Testing.FuncKprobes = false })
		fn(t)
	})
}

// TestSyscallFentry: the function path (fentry on __x64_sys_NAME, fexit
// for exit events, or kprobes and kretprobes there) records the same
// records as the tracepoints, as TestSyscallRaw checks them, and
// babeltrace2 reads them.
func TestSyscallFentry(t *testing.T) { eachFunctionPath(t, testSyscallFentry) }

func testSyscallFentry(t *testing.T) {
	const n = 2000
	events := []string{"syscalls:sys_enter_close", "syscalls:sys_exit_close", "syscalls:sys_enter_mmap", "syscalls:sys_exit_mmap"}
	c := startChild(t, "syscalls", n)
	s, dir := fentrySession(t, events, c)
	ids := map[string]uint32{}
	for i, f := range s.Events() {
		ids[f.FullName()] = f.ID
		if s.w.direct[i] < 0 {
			t.Errorf("%s: its layout is not direct: %+v", events[i], s.w.layouts[i].Ops)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkChildSyscalls(t, childSyscalls(t, "fentry", dir, c, n), events, ids, n)
}

// TestSyscallFentryNoArgs: a syscall without arguments, whose x86_64
// entry point is an alias BTF does not name, is recorded from the
// function it aliases, on entry and exit, on trampolines and kprobes.
func TestSyscallFentryNoArgs(t *testing.T) { eachFunctionPath(t, testSyscallFentryNoArgs) }

func testSyscallFentryNoArgs(t *testing.T) {
	const n = 1000
	events := []string{"syscalls:sys_enter_getpid", "syscalls:sys_exit_getpid"}
	c := startChild(t, "getpid", n)
	s, dir := fentrySession(t, events, c)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Fatalf("%v in the trace", it.Kind)
		}
		counts[it.Class.Name]++
		if nr := field(vals, "__syscall_nr").Int(0); nr != unix.SYS_GETPID {
			t.Fatalf("%s: __syscall_nr %d", it.Class.Name, nr)
		}
		if it.Class.Name == events[1] {
			if ret := field(vals, "ret").Int(0); ret != int64(c.cmd.Process.Pid) {
				t.Fatalf("ret %d, want the child's pid %d", ret, c.cmd.Process.Pid)
			}
		}
	})
	if counts[events[0]] != n || counts[events[1]] != n {
		t.Fatalf("recorded %v, want %d of each", counts, n)
	}
}
