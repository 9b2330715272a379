package consumer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/elfsym"
	"github.com/kconsume/kconsume/internal/kallsyms"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

var (
	// A babeltrace2 line's event name, pid fields and call chains.
	bt2Event = regexp.MustCompile(`^\[[^\]]*\] (?:\S+ )?(\S+): \{`)
	bt2Field = func(name string) *regexp.Regexp {
		return regexp.MustCompile(`\b` + name + ` = (\d+)`)
	}
	bt2Stack = regexp.MustCompile(`\bcallstack_kernel = \[((?:\s*\[\d+\] = 0x[0-9A-Fa-f]+,?)*)\s*\]`)
	bt2Addr  = regexp.MustCompile(`0x[0-9A-Fa-f]+`)
	// An ftrace event line (with its task's pid) and a stack frame.
	ftraceEvent = regexp.MustCompile(`^\s*.*-(\d+)\s+\[(\d+)\].*?: (sched_switch:|sys_clock_nanosleep\(|sys_wait4 ->|<stack trace>)`)
	ftraceCPU   = regexp.MustCompile(`^\s*.*-\d+\s+\[(\d+)\]`)
	ftraceFrame = regexp.MustCompile(`^ => (\S+?)(?:/0x[0-9a-f]+)?(?: \[\S+\])?$`)
)

// TestKernelStacksMatchFtrace: the kernel call chains kconsume records
// with --stack kernel equal, frame for frame below the tracing frames,
// those an ftrace instance records for the same events at the same time
// (its stacktrace option, as trace-cmd record -T sets it): the k-th event
// of each of the test's own tasks in one trace against the k-th in the
// other, symbolized with the kernel's symbol table, offsets included.
// Covered are a BTF-path event (sched_switch: sleeping, waiting,
// preempted and exiting tasks) and two syscall events (entry and exit),
// each moved to its tracepoint by the stack (kernels before 6.12 give
// no kernel chain at syscall events: there they are refused); on both
// transports.
// babeltrace2 reads our trace.
func TestKernelStacksMatchFtrace(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) { kernelStacksMatchFtrace(t, tr) })
	}
}

func kernelStacksMatchFtrace(t *testing.T, tr Transport) {
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	syms, err := kallsyms.Read()
	if err != nil {
		t.Fatal(err)
	}
	events := []string{"sched:sched_switch", "syscalls:sys_enter_clock_nanosleep", "syscalls:sys_exit_wait4"}
	if !kernelAtLeast(t, 6, 12) {
		// The syscall tracepoints hand BPF the user's registers there.
		_, err := New(Config{Events: events[1:], Dir: t.TempDir(), Transport: tr, Stacks: []EventStack{{Stack: StackKernel}}})
		if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "6.12") {
			t.Fatalf("kernel call chains of syscall events before 6.12: %v; want them refused", err)
		}
		events = events[:1]
	}
	inst, enable := ftraceInstance(t, fs, "stack-"+tr.String(), events)
	for file, v := range map[string]string{"buffer_size_kb": "8192", "options/stacktrace": "1", "options/sym-offset": "1"} {
		if err := os.WriteFile(filepath.Join(inst, file), []byte(v), 0); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	s, dir := newTestSession(t, Config{Events: events, Transport: tr, Stacks: []EventStack{{Stack: StackKernel}}})
	if err := enable("1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	// A shell that waits for sleeps (nanosleep, wait4) and spins a
	// little (preempted), then exits.
	n, _ := testenv.LoopCPU(t, 20*time.Millisecond)
	sh := exec.Command("sh", "-c", "for i in 1 2 3 4 5; do sleep 0.01; done; "+testenv.ShellLoop(n))
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("workload: %v: %s", err, out)
	}
	if err := enable("0"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// The workload's tasks: the shell, and the sleeps it forked.
	ftrace, ours := ftraceStacks(t, inst, syms), map[string][][]uint64{}
	tasks := map[string]bool{strconv.Itoa(sh.Process.Pid): true}
	lines, discards := testenv.RunBT2(t, dir)
	if len(discards) != 0 {
		t.Fatalf("babeltrace2: discards %v", discards)
	}
	pidField := bt2Field("common_pid")
	for _, l := range lines {
		ev, pid, st := bt2Event.FindStringSubmatch(l), pidField.FindStringSubmatch(l), bt2Stack.FindStringSubmatch(l)
		if ev == nil || pid == nil {
			t.Fatalf("babeltrace2 line without event or pid: %q", l)
		}
		if st == nil {
			t.Fatalf("babeltrace2 line without a kernel call chain: %q", l)
		}
		name := ev[1][strings.IndexByte(ev[1], ':')+1:]
		if name == "sched_switch" && strings.Contains(l, `prev_comm = "sleep"`) {
			tasks[pid[1]] = true
		}
		var frames []uint64
		for _, a := range bt2Addr.FindAllString(st[1], -1) {
			v, _ := strconv.ParseUint(a[2:], 16, 64)
			if _, _, ok := syms.Name(v); !ok {
				t.Fatalf("address %s in no kernel symbol: %q", a, l)
			}
			frames = append(frames, v)
		}
		key := pid[1] + " " + name
		ours[key] = append(ours[key], frames)
	}
	compared := map[string]int{}
	for key, list := range ours {
		if !tasks[strings.Fields(key)[0]] {
			continue
		}
		theirs := ftrace[key]
		if len(theirs) != len(list) {
			t.Errorf("%s: %d events with call chains, ftrace %d", key, len(list), len(theirs))
			continue
		}
		for k, o := range list {
			if err := sameBelowTracing(o, theirs[k], entryStub(syms)); err != nil {
				t.Errorf("%s, event %d: %v\nkconsume: %v\nftrace:   %v", key, k, err, frameNames(syms, o), frameNames(syms, theirs[k]))
			}
		}
		compared[strings.Fields(key)[1]] += len(list)
	}
	for _, e := range events {
		if compared[e[strings.IndexByte(e, ':')+1:]] == 0 {
			t.Errorf("no %s event of the workload compared: %v", e, compared)
		}
	}
	t.Logf("compared %v", compared)
}

// sameBelowTracing reports how ours, a call chain kconsume recorded,
// differs from theirs, ftrace's of the same event: below the tracing
// frames on top of each (at most 3 of ours, where the BPF program's
// caller differs from ftrace's), the frames must be the same, to the
// last.
//
// Kernels before 5.14 or so give the first frame twice to a tracepoint's
// BPF program (the caller regs' ip, then the unwinder's first frame):
// each of our first frames is tried in turn.
func sameBelowTracing(ours, theirs []uint64, stub func(uint64) bool) error {
	var first error
	for i := 0; i < len(ours) && i <= 3; i++ {
		j := slices.Index(theirs, ours[i])
		if j < 0 {
			continue
		}
		err := sameFrames(ours[i:], theirs[j:], i, stub)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = fmt.Errorf("no frame in common among the first 4")
	}
	return first
}

// sameFrames reports how ours, from frame at on, differs from theirs.
// The frame right below an interrupt's or exception's entry stub (stub)
// is the interrupted instruction, which the two unwinders may take one
// from the saved registers and the other from a guess on the stack (the
// 7.3 guest once gave two copies of the inline p4d_offset there): it is
// left out.
func sameFrames(ours, theirs []uint64, at int, stub func(uint64) bool) error {
	if len(ours) != len(theirs) {
		return fmt.Errorf("from frame %d (%#x) on: %d frames, ftrace %d", at, ours[0], len(ours), len(theirs))
	}
	for k := range ours {
		if ours[k] != theirs[k] && !(k > 0 && ours[k-1] == theirs[k-1] && stub(ours[k-1])) {
			return fmt.Errorf("frame %d: %#x, ftrace %#x", at+k, ours[k], theirs[k])
		}
	}
	return nil
}

// entryStub returns whether an address is in an interrupt's or
// exception's entry stub (asm_sysvec_*, asm_exc_*, asm_common_interrupt
// on x86), by the kernel's symbols syms.
func entryStub(syms *kallsyms.Table) func(uint64) bool {
	return func(a uint64) bool {
		n, _, ok := syms.Name(a)
		return ok && strings.HasPrefix(n, "asm_")
	}
}

// ftraceNames are the events' names by the start of their ftrace text.
var ftraceNames = map[string]string{"sched_switch:": "sched_switch", "sys_clock_nanosleep(": "sys_enter_clock_nanosleep", "sys_wait4 ->": "sys_exit_wait4"}

// frameNames returns the call chain as func+0xoff names.
func frameNames(syms *kallsyms.Table, frames []uint64) []string {
	var out []string
	for _, a := range frames {
		name, off, _ := syms.Name(a)
		out = append(out, fmt.Sprintf("%s+0x%x", name, off))
	}
	return out
}

// ftraceStacks reads the instance's trace: each event's call chain, its
// func+0xoff frames turned to addresses with syms (a function's aliases,
// __x64_sys_vfork and __do_sys_vfork, are one address), by "PID NAME".
func ftraceStacks(t *testing.T, inst string, syms *kallsyms.Table) map[string][][]uint64 {
	t.Helper()
	f, err := os.Open(filepath.Join(inst, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// An event's stack is the next entry on its CPU, but other CPUs'
	// entries may come between them in the merged text.
	out, keys := map[string][][]uint64{}, map[string]string{}
	var cur *[]uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if m := ftraceFrame.FindStringSubmatch(l); m != nil {
			if cur != nil {
				*cur = append(*cur, ftraceAddr(t, syms, m[1]))
			}
			continue
		}
		m := ftraceEvent.FindStringSubmatch(l)
		cur = nil
		switch {
		case m == nil:
			// Another event: its CPU's next stack is not ours.
			if c := ftraceCPU.FindStringSubmatch(l); c != nil {
				delete(keys, c[1])
			}
		case m[3] != "<stack trace>":
			keys[m[2]] = m[1] + " " + ftraceNames[m[3]]
		case keys[m[2]] != "":
			key := keys[m[2]]
			out[key] = append(out[key], nil)
			cur = &out[key][len(out[key])-1]
			delete(keys, m[2])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ftraceAddr returns the address of an ftrace frame, func+0xoff.
func ftraceAddr(t *testing.T, syms *kallsyms.Table, frame string) uint64 {
	t.Helper()
	name, off, ok := strings.Cut(frame, "+0x")
	o, err := strconv.ParseUint(off, 16, 64)
	start, _, found := syms.Lookup(name)
	if !ok || err != nil || !found {
		t.Fatalf("ftrace frame %q: not func+0xoff of a kernel symbol", frame)
	}
	return start + o
}

// TestUserStacks: the user call chains kconsume records with --stack
// user, for getpid calls a C program makes from kcstack_c, which main
// calls through kcstack_a and kcstack_b, resolve in the program's own
// symbols (elfsym, with its mappings read while it runs) to exactly that
// chain, when it keeps frame pointers: the kernel unwinds user stacks by
// them. Built without, the first frame still resolves to kcstack_c. The
// symbols the trace saved name every such frame alike, the program
// having exited and its file been deleted before the recording ended.
func TestUserStacks(t *testing.T) {
	testenv.RequireRoot(t)
	for _, fp := range []bool{true, false} {
		name := map[bool]string{true: "frame-pointers", false: "no-frame-pointers"}[fp]
		t.Run(name, func(t *testing.T) {
			// Optimising, gcc 12 leaves kcstack_c, a leaf, without a
			// frame even with -mno-omit-leaf-frame-pointer, and its
			// caller then drops out of the chain: -O0 keeps them all.
			bin := buildKCStack(t, map[bool][]string{true: {"-O0", "-fno-omit-frame-pointer"}, false: {"-O1", "-fomit-frame-pointer"}}[fp]...)
			want := []string{"kcstack_c", "kcstack_b", "kcstack_a", "main"}
			if !fp {
				want = want[:1]
			}
			got := userStacks(t, bin, 5)
			if len(got) != 5 {
				t.Fatalf("%d getpid events with user call chains, want 5", len(got))
			}
			for i, chain := range got {
				if len(chain) < len(want) || !slices.Equal(chain[:len(want)], want) {
					t.Errorf("event %d: call chain %v, want it to start %v", i, chain, want)
				}
			}
		})
	}
}

// userStacks runs bin, which makes a getpid call for each of n bytes it
// reads, under a session recording its getpid calls with user call
// chains, and returns each event's chain resolved in bin (frames
// outside bin as "?").
func userStacks(t *testing.T, bin string, n int) [][]string {
	t.Helper()
	s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, Comms: []string{"kcstack"}, Stacks: []EventStack{{Stack: StackUser}}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	cmd, in := startKCStack(t, bin)
	proc, err := procfs.NewProc(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var maps []*procfs.ProcMap
	// The mappings are whole once the loader is done: the program's
	// first read.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if stat, err := proc.Stat(); err == nil && stat.State == "S" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kcstack never waited for its input")
		}
	}
	if maps, err = proc.ProcMaps(); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	obj, err := elfsym.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	// The program is gone, and its file too, before the recording
	// ends: the trace names the frames by itself, from what the
	// session kept of the file while the program ran.
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	saved, err := ReadUserSymbols(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Fatalf("%v in the trace", it.Kind)
		}
		st := field(vals, "callstack_user")
		var chain []string
		for i := range st.Len() {
			a, name := st.Uint(i), "?"
			for _, m := range maps {
				if m.Pathname == bin && uint64(m.StartAddr) <= a && a < uint64(m.EndAddr) {
					if sym, _, ok := obj.Resolve(a, uint64(m.StartAddr), uint64(m.Offset)); ok {
						name = sym.Name
					}
				}
			}
			fn, _, path, ok := saved.Resolve(int32(field(vals, "common_pid").Int(0)), it.Time, a)
			if name != "?" && (!ok || fn != name || path != bin) {
				t.Errorf("frame %#x: the trace names it %q in %q (%v); the live process's symbols, %s", a, fn, path, ok, name)
			}
			chain = append(chain, name)
		}
		out = append(out, chain)
	})
	return out
}

// TestStackDepthCounted: with a depth below their length, every call
// chain is cut to the depth and counted as truncated, one for each
// event: none goes uncounted, none is counted twice.
func TestStackDepthCounted(t *testing.T) {
	s, dir := newTestSession(t, Config{Events: []string{"sched:sched_process_exec"}, Comms: []string{"sleep"},
		Stacks: []EventStack{{Stack: StackKernel}}, StackDepth: 2})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if out, err := exec.Command("sleep", "0.001").CombinedOutput(); err != nil {
			t.Fatalf("sleep: %v: %s", err, out)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	events := 0
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Fatalf("%v in the trace", it.Kind)
		}
		events++
		if n := field(vals, "callstack_kernel").Len(); n != 2 {
			t.Errorf("a call chain of %d frames, want 2", n)
		}
	})
	c, err := s.StackCounts()
	if err != nil {
		t.Fatal(err)
	}
	// An exec's chain is 6 deep or more: exec_binprm, bprm_execve,
	// do_execveat_common, __x64_sys_execve, do_syscall_64, the entry.
	if events < 3 || c.Truncated != uint64(events) || c.Failed != 0 {
		t.Fatalf("%d events, stack counts %+v; want 3 or more, each truncated", events, c)
	}
}

// TestContextsMatchProc: the contexts kconsume records with each getpid
// call of a C program, run niced in a new pid namespace, equal what
// /proc says of it while it runs: its name, pid and tid, parent,
// priority and nice value as lttng-modules writes them (prio - 100,
// /proc's priority field), its ids in its namespace (NSpid), its cgroup
// v2 id (the inode of a cgroup's directory it is moved to), and the CPU the record
// is on; a cpu-clock counter read on each CPU moves with the clock
// (within a factor of 4: guests' clocks drift apart).
func TestContextsMatchProc(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildKCStack(t, "-O1")
	ctxs := []string{"procname", "pid", "tid", "ppid", "prio", "nice", "vpid", "vtid", "vppid", "cpu_id", "cgroup", "perf:cpu:cpu-clock"}
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			// sched_process_exec has a pid field of its own: the
			// contexts are a scope apart.
			s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid", "sched:sched_process_exec"}, Comms: []string{"kcstack"}, Transport: tr, Contexts: ctxs})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			cmd, in := startKCStack(t, bin, "nice", "-n", "7", "unshare", "--pid", "--fork")
			root := cgroup2Root(t)
			cg := filepath.Join(root, "kconsume-ctx-"+tr.String()+"-"+strconv.Itoa(os.Getpid()))
			if err := os.Mkdir(cg, 0o755); err != nil {
				t.Fatal(err)
			}
			// The program is gone by then; an empty cgroup can be removed.
			t.Cleanup(func() { _ = os.Remove(cg) })
			want := procContexts(t, bin, root, cg)
			t.Logf("/proc: %v", want)
			if _, err := in.Write(make([]byte, 20)); err != nil {
				t.Fatal(err)
			}
			in.Close()
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			n, execs := 0, 0
			lastClock, lastTime := map[uint32]uint64{}, map[uint32]uint64{}
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					t.Fatalf("%v in the trace", it.Kind)
				}
				if it.Class.Name == "sched:sched_process_exec" {
					// The context's pid is the task's process, the
					// payload's the exec'ing task, here the same.
					if c, p := vals[1].Int(0), field(vals[it.Class.Context:], "pid").Int(0); vals[1].Field.Name != "pid" || c != p || c == 0 {
						t.Errorf("exec: context pid %d (%s), payload pid %d", c, vals[1].Field.Name, p)
					}
					execs++
					return
				}
				n++
				got := map[string]int64{}
				for _, c := range []string{"pid", "tid", "ppid", "prio", "nice", "vpid", "vtid", "vppid"} {
					got[c] = field(vals, c).Int(0)
				}
				got["cgroup"] = int64(field(vals, "cgroup").Uint(0))
				if name := string(field(vals, "procname").Text()); name != "kcstack" {
					t.Errorf("procname %q, want kcstack", name)
				}
				for c, v := range want {
					if got[c] != v {
						t.Errorf("%s = %d, /proc says %d", c, got[c], v)
					}
				}
				if cpu := field(vals, "cpu_id").Int(0); cpu != int64(it.CPU) {
					t.Errorf("cpu_id %d on CPU %d's stream", cpu, it.CPU)
				}
				clock := field(vals, "perf_cpu_cpu_clock").Uint(0)
				if prev, ok := lastClock[it.CPU]; ok {
					// cpu-clock runs on the scheduler's clock, which
					// in TCG guests drifts from CLOCK_MONOTONIC: by a
					// factor of 2 usually, of 7 once (882 µs against
					// 129 µs, two guests on two CPUs), and the other
					// way by 600 once (7.5 µs against 4.77 ms, on
					// 5.10). A counter that does not move, or runs
					// away, still fails.
					dc, dt := int64(clock-prev), int64(it.Time-lastTime[it.CPU])
					if dc <= 0 || dc > 16*dt+1_000_000 {
						t.Errorf("cpu-clock moved %d ns on CPU %d while the clock moved %d", dc, it.CPU, dt)
					}
				}
				lastClock[it.CPU], lastTime[it.CPU] = clock, it.Time
			})
			if n != 20 || execs != 1 {
				t.Errorf("%d getpid and %d exec events, want 20 and 1", n, execs)
			}
			lines, discards := testenv.RunBT2(t, dir)
			for _, l := range lines {
				if !strings.Contains(l, `{ procname = "kcstack", pid = `) || !strings.Contains(l, "perf_cpu_cpu_clock = ") {
					t.Errorf("babeltrace2 shows no event context: %s", l)
				}
			}
			if len(lines) != 21 || len(discards) != 0 {
				t.Errorf("babeltrace2: %d events, discards %v; want 21", len(lines), discards)
			}
		})
	}
}

// procContexts moves the running program bin into the cgroup cg, under
// the cgroup v2 hierarchy at root, once it
// waits for input, and returns what /proc then says of it: its contexts
// by name as lttng-modules writes them.
func procContexts(t *testing.T, bin, root, cg string) map[string]int64 {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		procs, err := procfs.AllProcs()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			exe, err := p.Executable()
			if err != nil || exe != bin {
				continue
			}
			st, err := p.Stat()
			if err != nil || st.State != "S" {
				continue
			}
			if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(p.PID)), 0); err != nil {
				t.Fatal(err)
			}
			status, err := p.NewStatus()
			if err != nil {
				t.Fatal(err)
			}
			cgs, err := p.Cgroups()
			if err != nil {
				t.Fatal(err)
			}
			var ino uint64
			for _, cg := range cgs {
				if cg.HierarchyID == 0 {
					fi, err := os.Stat(filepath.Join(root, cg.Path))
					if err != nil {
						t.Fatal(err)
					}
					ino = fi.Sys().(*syscall.Stat_t).Ino
				}
			}
			if len(status.NSpids) != 2 {
				t.Fatalf("NSpid %v: not in a pid namespace of its own", status.NSpids)
			}
			return map[string]int64{"pid": int64(p.PID), "tid": int64(p.PID), "ppid": int64(st.PPID), "prio": int64(st.Priority), "nice": int64(st.Nice),
				"vpid": int64(status.NSpids[1]), "vtid": int64(status.NSpids[1]), "vppid": 0, "cgroup": int64(ino)}
		}
	}
	t.Fatalf("%s never waited for its input", bin)
	return nil
}

// TestRewindKeepsSymbols: a rewind of a flight recorder with call chains
// carries the symbols of both kinds, so its frames are named as the
// session's are.
func TestRewindKeepsSymbols(t *testing.T) {
	s, dir := newTestSession(t, Config{Events: []string{"sched:sched_process_exec"}, Mode: relayfmt.Overwrite,
		Stacks: []EventStack{{Stack: StackKernel | StackUser}}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("true").CombinedOutput(); err != nil {
		t.Fatalf("true: %v: %s", err, out)
	}
	rw := dir + ".rewind"
	if err := s.Rewind(rw, -1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rw) })
	if _, err := ReadKernelSymbols(rw); err != nil {
		t.Errorf("kernel symbols of the rewind: %v", err)
	}
	if _, err := ReadUserSymbols(rw); err != nil {
		t.Errorf("user symbols of the rewind: %v", err)
	}
}

// buildKCStack compiles testdata/kcstack.c with flags into a temporary
// directory and returns the program's path; it skips t without a C
// compiler.
func buildKCStack(t *testing.T, flags ...string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "kcstack")
	if out, err := exec.Command(cc, append([]string{"-o", bin, "testdata/kcstack.c"}, flags...)...).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v: %s", err, out)
	}
	return bin
}

// startKCStack starts the kcstack program bin, which waits for its
// input, through the command before it in args when there are any (nice,
// unshare), and returns it and its input; it is killed at the end of t.
func startKCStack(t *testing.T, bin string, before ...string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	args := append(slices.Clone(before), bin)
	cmd := exec.Command(args[0], args[1:]...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, in
}

// TestKernelStackModuleFrames: the call chains of a module's tracepoint
// (9pnet's 9p_client_req, which the guests' root file system fires)
// resolve, from the symbols the trace saved, to the functions of the
// modules they ran in: 9pnet's client and the 9p file system's.
func TestKernelStackModuleFrames(t *testing.T) {
	if !testenv.InGuest() {
		t.Skip("needs a root file system on 9p: runs inside a vmtest guest (make vmtest)")
	}
	testenv.RequireRoot(t)
	s, dir := newTestSession(t, Config{Events: []string{"9p:9p_client_req"}, Stacks: []EventStack{{Stack: StackKernel}}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	// Files the guest has not read yet: 9p requests to the host.
	read := 0
	ents, _ := os.ReadDir("/usr/share/doc")
	for _, e := range ents {
		if _, err := os.ReadFile(filepath.Join("/usr/share/doc", e.Name(), "copyright")); err == nil {
			if read++; read == 20 {
				break
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	chains := namedKernelChains(t, dir)
	seen := map[string]string{} // module: a function of it in a chain
	for _, c := range chains {
		for _, f := range c {
			if f.name == "" {
				t.Fatalf("a frame in no kernel symbol: %v", c)
			}
			if f.module != "" {
				seen[f.module] = f.name
			}
		}
	}
	t.Logf("%d events (%d files read); module frames: %v", len(chains), read, seen)
	if !strings.HasPrefix(seen["9pnet"], "p9_") || !strings.HasPrefix(seen["9p"], "v9fs_") {
		t.Fatalf("module frames %v in %d events: want 9pnet's p9_* and 9p's v9fs_*", seen, len(chains))
	}
}

// namedFrame is a kernel frame as the trace's saved symbols name it;
// name is empty for an address in no symbol.
type namedFrame struct{ name, module string }

// namedKernelChains returns the kernel call chain of each event that
// babeltrace2 reads in the trace in dir, named from the symbols the trace
// saved (ReadKernelSymbols). An event without a chain fails t.
func namedKernelChains(t *testing.T, dir string) [][]namedFrame {
	t.Helper()
	syms, err := ReadKernelSymbols(dir)
	if err != nil {
		t.Fatal(err)
	}
	lines, _ := testenv.RunBT2(t, dir)
	var out [][]namedFrame
	for _, l := range lines {
		st := bt2Stack.FindStringSubmatch(l)
		if st == nil {
			t.Fatalf("babeltrace2 line without a kernel call chain: %q", l)
		}
		var chain []namedFrame
		for _, a := range bt2Addr.FindAllString(st[1], -1) {
			v, _ := strconv.ParseUint(a[2:], 16, 64)
			name, mod, _, _ := syms.Symbol(v)
			chain = append(chain, namedFrame{name, mod})
		}
		out = append(out, chain)
	}
	return out
}

// TestStacksMatchBpftrace has bpftrace judge the call chains: it runs
// beside a session on the same getpid calls of the kcstack program,
// printing each event's kstack(perf) and ustack(perf). Every user chain
// kconsume recorded equals bpftrace's of the same event, address for
// address (both ask the kernel's unwinder at the same tracepoint), and
// where the kernel gives syscall events a kernel chain (6.12 on), so do
// the kernel chains below the tracing frames.
func TestStacksMatchBpftrace(t *testing.T) {
	testenv.RequireRoot(t)
	bt, err := exec.LookPath("bpftrace")
	if err != nil {
		t.Fatalf("bpftrace, the judge (Debian's package): %v", err)
	}
	bin := buildKCStack(t, "-O0", "-fno-omit-frame-pointer")
	const n = 20
	kc, in := startKCStack(t, bin)
	prog := fmt.Sprintf(`tracepoint:syscalls:sys_enter_getpid /pid == %d/ { printf("K\n%%sU\n%%sE\n", kstack(perf), ustack(perf)); }`, kc.Process.Pid)
	judge := exec.Command(bt, "-e", prog)
	out, errOut := &testenv.Output{}, &testenv.Output{}
	judge.Stdout, judge.Stderr = out, errOut
	if err := judge.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = judge.Process.Kill() })
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(errOut.String()+out.String(), "Attaching 1 probe"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("bpftrace never attached:\n%s%s", out.String(), errOut.String())
		}
	}
	stacks := StackUser
	major, minor, _ := testenv.KernelRelease()
	if major > 6 || major == 6 && minor >= 12 {
		stacks |= StackKernel // before, session refuses them on syscall events
	}
	s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{kc.Process.Pid}, Stacks: []EventStack{{Stack: stacks}}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	in.Close()
	if err := testenv.WaitExit(kc, time.Minute, "kcstack"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// bpftrace prints as it reads its buffers, and may not read what is
	// left there once interrupted: its n events first, for a minute at
	// most.
	for deadline := time.Now().Add(time.Minute); strings.Count(out.String(), "\nE\n") < n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	_ = judge.Process.Signal(os.Interrupt)
	if err := testenv.WaitExit(judge, time.Minute, "bpftrace, interrupted,"); err != nil {
		t.Logf("%v (what it printed is judged)", err)
	}

	// bpftrace's events: K, the kernel frames, U, the user frames, E;
	// a frame is a tab, its address in hex, then its name.
	type chains struct{ kernel, user []uint64 }
	var theirs []chains
	var cur *[]uint64
	for _, l := range strings.Split(out.String(), "\n") {
		switch {
		case l == "K":
			theirs = append(theirs, chains{})
			cur = &theirs[len(theirs)-1].kernel
		case l == "U" && cur != nil:
			cur = &theirs[len(theirs)-1].user
		case l == "E":
			cur = nil
		case cur != nil && strings.HasPrefix(l, "\t"):
			f := strings.Fields(l)
			a, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				t.Fatalf("bpftrace frame %q: %v", l, err)
			}
			*cur = append(*cur, a)
		}
	}
	var ours []chains
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Fatalf("%v in the trace", it.Kind)
		}
		var c chains
		for _, f := range []struct {
			name string
			to   *[]uint64
		}{{"callstack_kernel", &c.kernel}, {"callstack_user", &c.user}} {
			if f.name == "callstack_kernel" && stacks&StackKernel == 0 {
				continue
			}
			st := field(vals, f.name)
			for i := range st.Len() {
				*f.to = append(*f.to, st.Uint(i))
			}
		}
		ours = append(ours, c)
	})
	if len(ours) != n || len(theirs) != n {
		t.Fatalf("%d events recorded, bpftrace printed %d; want %d each\nbpftrace:\n%s%s", len(ours), len(theirs), n, out.String(), errOut.String())
	}
	var syms *kallsyms.Table
	if stacks&StackKernel != 0 {
		if syms, err = ReadKernelSymbols(dir); err != nil {
			t.Fatal(err)
		}
	}
	kernels := 0
	for i := range ours {
		o, b := ours[i], theirs[i]
		if len(o.user) < 4 || !slices.Equal(o.user, b.user) {
			t.Errorf("event %d: user chain %#x, bpftrace %#x", i, o.user, b.user)
		}
		if len(o.kernel) == 0 {
			continue // the kernel gives none to syscall events before 6.12
		}
		kernels++
		if err := sameBelowTracing(o.kernel, b.kernel, entryStub(syms)); err != nil {
			t.Errorf("event %d: %v\nkconsume: %v\nbpftrace: %v", i, err, frameNames(syms, o.kernel), frameNames(syms, b.kernel))
		}
	}
	if stacks&StackKernel != 0 && kernels != n {
		t.Errorf("%d of %d events with a kernel chain on a kernel that gives them", kernels, n)
	}
	t.Logf("%d events: user chains equal, %d kernel chains equal below the tracing frames", n, kernels)
}

// TestKernelSymbolsOfModuleLoadedLater: a module loaded while the
// session records (loop, unloaded first) has its frames named from the
// trace's symbols, saved again at the end because the modules changed
// (refreshKernelSymbols): the block_rq_issue events of a read from a
// loop device hold loop_queue_rq [loop].
func TestKernelSymbolsOfModuleLoadedLater(t *testing.T) {
	if !testenv.InGuest() {
		t.Skip("unloads and loads a module: runs only inside a vmtest guest (make vmtest)")
	}
	testenv.RequireRoot(t)
	const ko = "/run/vmtest-modules/loop.ko"
	if _, err := os.Stat(ko); err != nil {
		if _, loaded := loadedModules()["loop"]; !loaded {
			if _, err := os.Stat("/sys/module/loop"); err == nil {
				t.Skip("loop is built into this kernel: no module to load")
			}
		}
		t.Fatalf("vmtest's init copies the guest's modules to /run/vmtest-modules: %v", err)
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		testenv.Missing(t, "losetup is required to read a loop device (apt-get install util-linux): %v", err)
	}
	load := func() error {
		f, err := os.Open(ko)
		if err != nil {
			return err
		}
		defer f.Close()
		return unix.FinitModule(int(f.Fd()), "", 0)
	}
	if _, ok := loadedModules()["loop"]; ok {
		if err := unix.DeleteModule("loop", 0); err != nil {
			t.Fatalf("unloading loop: %v", err)
		}
	}
	t.Cleanup(func() {
		if _, ok := loadedModules()["loop"]; !ok {
			if err := load(); err != nil {
				t.Errorf("loading loop back: %v", err)
			}
		}
	})
	s, dir := newTestSession(t, Config{Events: []string{"block:block_rq_issue"}, Stacks: []EventStack{{Stack: StackKernel}}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := load(); err != nil {
		t.Fatalf("loading loop: %v", err)
	}
	file := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	read := exec.Command("dd", "if="+dev, "of=/dev/null", "bs=64k", "iflag=direct")
	if out, err := read.CombinedOutput(); err != nil {
		t.Errorf("dd: %v: %s", err, out)
	}
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Errorf("losetup -d: %v: %s", err, out)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	chains := namedKernelChains(t, dir)
	named := 0
	for _, c := range chains {
		if slices.Contains(c, namedFrame{"loop_queue_rq", "loop"}) {
			named++
		}
	}
	t.Logf("%d of %d block_rq_issue events through loop_queue_rq [loop]", named, len(chains))
	if named == 0 {
		t.Fatalf("no frame named loop_queue_rq [loop] in %d events", len(chains))
	}
}

// TestUserMapsForgetExited: while user call chains are recorded, the
// processes that exit without one are forgotten (userMaps.prune), so a
// recording of days does not keep every process it saw; one that
// recorded a chain and exited is kept, and named in the trace's symbols.
func TestUserMapsForgetExited(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildKCStack(t, "-O0", "-fno-omit-frame-pointer")
	s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, Comms: []string{"kcstack"}, Stacks: []EventStack{{Stack: StackUser}}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	procs := func() int {
		s.umaps.mu.Lock()
		defer s.umaps.mu.Unlock()
		return len(s.umaps.model.Procs)
	}
	before := procs()
	kc := exec.Command(bin)
	kc.Stdin = strings.NewReader("abc")
	if out, err := kc.CombinedOutput(); err != nil {
		t.Fatalf("kcstack: %v: %s", err, out)
	}
	const n = 200
	sh := exec.Command("sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done", n))
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("sh: %v: %s", err, out)
	}
	for deadline := time.Now().Add(time.Minute); s.saver.pruned.Load() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes forgotten a minute after %d exited", s.saver.pruned.Load(), n+2)
		}
	}
	after := procs()
	s.umaps.mu.Lock()
	_, kept := s.umaps.model.Procs[int32(kc.Process.Pid)]
	s.umaps.mu.Unlock()
	if !kept {
		t.Errorf("kcstack (pid %d), which recorded user chains, was forgotten", kc.Process.Pid)
	}
	if after > before+n/4 {
		t.Errorf("%d processes in the model after %d exited, from %d at the start", after, n, before)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	saved, err := ReadUserSymbols(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := saved.model.Procs[int32(kc.Process.Pid)]; !ok {
		t.Errorf("kcstack (pid %d) not in the trace's user symbols", kc.Process.Pid)
	}
	t.Logf("%d processes at the start, %d after %d exited, %d forgotten", before, after, n+2, s.saver.pruned.Load())
}
