package consumer

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// switchStateText renders prev_state as sched_switch's print_fmt does
// (include/trace/events/sched.h, the same from 4.14 to 7.x): the flags of
// the low byte by letter, "R" for none, "+" for TASK_REPORT_MAX (0x100,
// preempted).
func switchStateText(v int64) string {
	letters := "SDTtXZPI"
	var flags []string
	for i := range 8 {
		if v&(1<<i) != 0 {
			flags = append(flags, letters[i:i+1])
		}
	}
	s := strings.Join(flags, "|")
	if s == "" {
		s = "R"
	}
	if v&0x100 != 0 {
		s += "+"
	}
	return s
}

// schedText renders an event of ours as ftrace's text output prints it
// (the events' print_fmt), or "" for another event.
func schedText(name string, vals []relayfmt.Value) string {
	str := func(f string) string { return string(field(vals, f).Text()) }
	num := func(f string) int64 { return field(vals, f).Int(0) }
	switch name {
	case "sched_switch":
		return fmt.Sprintf("sched_switch: prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s ==> next_comm=%s next_pid=%d next_prio=%d",
			str("prev_comm"), num("prev_pid"), num("prev_prio"), switchStateText(num("prev_state")), str("next_comm"), num("next_pid"), num("next_prio"))
	case "sched_waking", "sched_wakeup", "sched_wakeup_new":
		return fmt.Sprintf("%s: comm=%s pid=%d prio=%d target_cpu=%03d", name, str("comm"), num("pid"), num("prio"), num("target_cpu"))
	}
	return ""
}

var (
	ftraceLine = regexp.MustCompile(`^\s*.*-(\d+)\s+\[(\d+)\].*? ((?:sched_switch|sched_waking|sched_wakeup|sched_wakeup_new): .*)$`)
	prevState  = regexp.MustCompile(` prev_state=\S+ `)
	targetCPU  = regexp.MustCompile(` target_cpu=\d+$`)
)

// TestBTFEventsMatchFtrace: sched_switch, sched_waking, sched_wakeup and
// sched_wakeup_new recorded by the recorder's own tp_btf programs equal,
// event for event on every CPU, what the kernel's own events write into
// an ftrace instance recording at the same time: comms, pids, priorities,
// target CPUs and prev_state, for preempted and sleeping tasks, forks and
// exits. Compared are the events whose current task is the test's own
// (its threads and children): elsewhere, on our development VM (a PVM
// guest, kernel 6.18), ftrace and BPF disagree both ways, whichever BPF
// path records (KC_NO_BTF=1 runs the test through the tracepoints):
// events of the idle task that ftrace lacks, and wakeups raised while
// another host agent's thread runs that only ftrace has.
func TestBTFEventsMatchFtrace(t *testing.T) {
	testenv.RequireRoot(t)
	recorder.Testing.NoBTF = os.Getenv("KC_NO_BTF") != ""
	defer func() { recorder.Testing.NoBTF = false }()
	requireBTFPath(t)
	names := []string{"sched_switch", "sched_waking", "sched_wakeup", "sched_wakeup_new"}
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, n := range names {
		events = append(events, "sched:"+n)
	}
	inst, enable := ftraceInstance(t, fs, "btf", events)
	if err := os.WriteFile(filepath.Join(inst, "buffer_size_kb"), []byte("8192"), 0); err != nil {
		t.Fatal(err)
	}
	s, dir := newTestSession(t, Config{Events: events, Transport: Ringbuf})
	got, why := s.BTFEvents()
	if os.Getenv("KC_NO_BTF") != "" {
		got = events
	}
	if !slices.Equal(got, events) {
		t.Fatalf("on the BTF path: %v, want %v (%v)", got, events, why)
	}
	// Two shells spinning on CPU 0 preempt each other (R+); sleeps give
	// S, forks sched_wakeup_new, exits Z. They spin together at any
	// speed: each says it is ready and waits for a line, which the test
	// writes to both once both said so; started apart, as they were, the
	// first could finish before the second ran on a fast machine. Each
	// spins for 50 ms of CPU or more, sized on this machine before the
	// recording starts, where a fixed count was a fixed time on one
	// machine only: a dozen or more of the scheduler's ticks, in which
	// two tasks runnable on one CPU preempt each other.
	n, _ := testenv.LoopCPU(t, 50*time.Millisecond)
	spin := "echo ready; read -r _; " + testenv.ShellLoop(n)
	if err := enable("1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	ourPids := map[int64]bool{}
	var cmds []*exec.Cmd
	var gos []io.WriteCloser
	for range 2 {
		c := exec.Command("taskset", "-c", "0", "sh", "-c", spin)
		in, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		c.Stdout = pw
		err = c.Start()
		pw.Close()
		if err != nil {
			pr.Close()
			t.Fatal(err)
		}
		// A test that fails before the go leaves no shell waiting.
		t.Cleanup(func() { _ = c.Process.Kill() })
		cmds = append(cmds, c)
		gos = append(gos, in)
		ourPids[int64(c.Process.Pid)] = true
		ready, err := bufio.NewReader(pr).ReadString('\n')
		pr.Close()
		if ready != "ready\n" {
			t.Fatalf("shell %d: %q, %v; want ready", c.Process.Pid, ready, err)
		}
	}
	for _, in := range gos {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			t.Fatal(err)
		}
		in.Close()
	}
	for range 20 {
		c := exec.Command("sleep", "0.01")
		if err := c.Run(); err != nil {
			t.Fatal(err)
		}
		ourPids[int64(c.Process.Pid)] = true
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tasks {
		var tid int64
		if _, err := fmt.Sscan(e.Name(), &tid); err == nil {
			ourPids[tid] = true
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := enable("0"); err != nil {
		t.Fatal(err)
	}

	ours := map[uint32][]string{}
	counts := map[string]int{}
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Fatalf("%v in the trace", it.Kind)
		}
		name := strings.TrimPrefix(it.Class.Name, "sched:")
		counts[name]++
		if ourPids[field(vals, "common_pid").Int(0)] {
			ours[it.CPU] = append(ours[it.CPU], schedText(name, vals))
		}
	})
	text, err := os.ReadFile(filepath.Join(inst, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	theirs := map[uint32][]string{}
	for _, line := range strings.Split(string(text), "\n") {
		if strings.Contains(line, "LOST") && !strings.HasPrefix(line, "#") {
			t.Fatalf("the ftrace instance lost events: %s", line)
		}
		if m := ftraceLine.FindStringSubmatch(line); m != nil {
			var pid int64
			var cpu uint32
			fmt.Sscan(m[1], &pid)
			fmt.Sscan(m[2], &cpu)
			if ourPids[pid] {
				theirs[cpu] = append(theirs[cpu], m[3])
			}
		}
	}
	arg, err := recorder.SwitchStateArg()
	if err != nil {
		t.Fatal(err)
	}
	racy := !arg
	total, moved, wakings := 0, 0, 0
	states := map[string]bool{}
	for cpu, evs := range ours {
		total += len(evs)
		for _, e := range evs {
			if m := prevState.FindString(e); m != "" {
				states[strings.TrimSpace(strings.TrimPrefix(m, " prev_state="))] = true
			}
		}
		ft := theirs[cpu]
		// Ours start later and stop sooner: a run of ftrace's events. A
		// task sleeping again and again repeats its events, so the run
		// starts where the most of ours match.
		at, best := -1, -1
		for j := range ft {
			if k := matchSched(evs, ft[j:], racy); k > best {
				at, best = j, k
			}
		}
		if k := matchSched(evs, ft[max(at, 0):], racy); k < len(evs) {
			var ctx strings.Builder
			for i := max(0, k-3); i < min(len(evs), k+4); i++ {
				fmt.Fprintf(&ctx, "ours   %d %s\n", i, evs[i])
			}
			for j := max(0, at+k-3); j < min(len(ft), at+k+4); j++ {
				fmt.Fprintf(&ctx, "ftrace %d %s\n", j-at, ft[j])
			}
			t.Fatalf("CPU %d, event %d has no match in ftrace's run:\n%s", cpu, k, ctx.String())
		}
		for i, e := range evs {
			if strings.HasPrefix(e, "sched_wak") {
				wakings++
			}
			if f := ft[at+i]; e != f && targetCPU.ReplaceAllString(e, "") == targetCPU.ReplaceAllString(f, "") {
				moved++
			}
		}
	}
	// A moved task is a race of the kernel's, and rare; a program that
	// read the wrong CPU would differ in most wakeups.
	if moved > max(2, wakings/50) {
		t.Errorf("%d wakeups of %d read another target_cpu than ftrace's", moved, wakings)
	}
	for _, n := range names {
		if counts[n] == 0 {
			t.Errorf("no %s recorded", n)
		}
	}
	if total < 100 {
		t.Fatalf("%d events recorded, want at least 100", total)
	}
	for _, st := range []string{"R+", "S"} {
		if !states[st] {
			t.Errorf("no switch with prev_state %s among %d (states seen: %v)", st, counts["sched_switch"], states)
		}
	}
	t.Logf("%d events of the test's tasks on %d CPUs equal ftrace's (recorded: %v); prev_states seen: %v", total, len(ours), counts, states)
}

// matchSched returns how many of ours, from the first, equal ft's in
// order.
//
// With racy set, prev_state may also differ where one side has R: before
// 5.18 each probe reads the task's state itself, and a wakeup from
// another CPU can set it to TASK_WAKING between the two reads (the race
// commit fa2c3254d7cf closed by passing the state to the tracepoint).
//
// A wakeup's target_cpu may differ too (TestBTFEventsMatchFtrace counts
// how often): it is task_cpu(p), which each probe reads, and on 6.12 a
// task that had just slept on CPU 1 read 1 in ours and 0 in ftrace's
// sched_waking. The task moved between the two reads; a task that sleeps
// can stay queued since 6.12 (delayed dequeue), where another CPU may
// take it while the waker holds only its pi_lock.
//
// On every kernel, a dead task's last switch may read Z on one side and
// X on the other: the tracepoint passes the task's state but not its
// exit_state, which each probe reads (__trace_sched_switch_state, in
// include/trace/events/sched.h), and a parent reaping the zombie on
// another CPU turns it from EXIT_ZOMBIE into EXIT_DEAD between the two
// reads.
func matchSched(ours, ft []string, racy bool) int {
	exitState := func(s string) bool {
		return strings.Contains(s, " prev_state=Z ") || strings.Contains(s, " prev_state=X ")
	}
	same := func(a, b string) bool {
		if a == b {
			return true
		}
		switch {
		case targetCPU.MatchString(a) && targetCPU.ReplaceAllString(a, "") == targetCPU.ReplaceAllString(b, ""):
			return true
		case exitState(a) && exitState(b):
		case !racy || !strings.Contains(a, " prev_state=R ") && !strings.Contains(b, " prev_state=R "):
			return false
		}
		return prevState.ReplaceAllString(a, " ") == prevState.ReplaceAllString(b, " ")
	}
	n := 0
	for n < len(ours) && n < len(ft) && same(ft[n], ours[n]) {
		n++
	}
	return n
}
