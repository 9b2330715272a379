package consumer

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// trigCond is the condition of the tests' triggers: an openat of
// kctrig's miss mode that failed with ENOENT. The comm keeps other
// programs' failed opens on the shared machine out of it.
const trigCond = `ret == -2 && comm == "kctrig-miss"`

// trigWork is kctrig (testdata/kctrig.c), built once per test.
type trigWork struct {
	bin, file, missing string
}

func newTrigWork(t *testing.T) *trigWork {
	t.Helper()
	dir := t.TempDir()
	w := &trigWork{bin: testenv.BuildC(t, "testdata/kctrig.c", "-O1", "-static"), file: filepath.Join(dir, "there"), missing: filepath.Join(dir, "kconsume-trigger-nonexistent")}
	if err := os.WriteFile(w.file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return w
}

// busy starts kctrig busy for d, gap apart per CPU; wait returns its
// per-CPU counts of opens.
func (w *trigWork) busy(t *testing.T, d time.Duration, gapUS int) (wait func() []int64) {
	t.Helper()
	cmd := exec.Command(w.bin, "busy", w.file, strconv.FormatFloat(d.Seconds(), 'f', 3, 64), strconv.Itoa(gapUS))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return func() []int64 {
		t.Helper()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("kctrig busy: %v", err)
		}
		var counts []int64
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var cpu int
			var n int64
			if _, err := fmt.Sscan(l, &cpu, &n); err != nil {
				t.Fatalf("kctrig busy printed %q", out.String())
			}
			counts = append(counts, n)
		}
		return counts
	}
}

// miss runs kctrig miss: n failing opens gap apart, and with unlinkAfter
// set a failing unlink that long after. It returns the process id and
// the times of the first and last open.
func (w *trigWork) miss(t *testing.T, n, gapUS int, unlinkAfter time.Duration) (pid int, first, last uint64) {
	t.Helper()
	args := []string{"miss", w.missing, strconv.Itoa(n), strconv.Itoa(gapUS)}
	if unlinkAfter > 0 {
		args = append(args, strconv.FormatInt(unlinkAfter.Microseconds(), 10))
	}
	cmd := exec.Command(w.bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kctrig miss: %v", err)
	}
	if _, err := fmt.Sscan(string(out), &first, &last); err != nil {
		t.Fatalf("kctrig miss printed %q", out)
	}
	return cmd.Process.Pid, first, last
}

// closeCounts returns the session's trigger counts, then closes it.
func closeCounts(t *testing.T, s *Session) []TriggerCount {
	t.Helper()
	counts, err := s.TriggerCounts()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return counts
}

// trigEvent is one event line of babeltrace2's output.
type trigEvent struct {
	ts            uint64
	name          string
	cpu, pid, ret int64
}

var trigLine = regexp.MustCompile(`^\[(\d+)\] \S+ (\S+): \{ cpu_id = (\d+) \}.*common_pid = (\d+).*ret = (-?\d+)`)

// bt2Events returns the events babeltrace2 reads in dir that have a
// ret field, and its discard warnings.
func trigEvents(t *testing.T, dir string) ([]trigEvent, []testenv.Discard) {
	t.Helper()
	lines, discards := testenv.RunBT2(t, dir)
	var evs []trigEvent
	for _, l := range lines {
		m := trigLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		ts, _ := strconv.ParseUint(m[1], 10, 64)
		cpu, _ := strconv.ParseInt(m[3], 10, 64)
		pid, _ := strconv.ParseInt(m[4], 10, 64)
		ret, _ := strconv.ParseInt(m[5], 10, 64)
		evs = append(evs, trigEvent{ts: ts, name: strings.TrimSuffix(m[2], ":"), cpu: cpu, pid: pid, ret: ret})
	}
	if len(evs) == 0 && len(lines) > 0 {
		t.Fatalf("no event line of babeltrace2's parsed; first: %q", lines[0])
	}
	return evs, discards
}

// TestTriggerSnapshot records a busy workload that never stops in
// overwrite mode, with a snapshot trigger on one failed openat: the
// snapshot the trigger saved, copied out of the trace directory while
// the recording goes on (nothing reaches the files in overwrite mode
// but snapshots), holds that event and the second of the workload
// before it, whole, read by babeltrace2.
func TestTriggerSnapshot(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireKernel(t, 5, 12, "triggers (BPF compare-and-swap)")
	w := newTrigWork(t)
	s, dir := newTestSession(t, Config{
		Events: []string{"syscalls:sys_exit_openat"}, Comms: []string{"kctrig-busy", "kctrig-miss"},
		Mode: relayfmt.Overwrite, SubbufSize: 64 << 10, NSubbufs: 8,
		Triggers: []Trigger{{Event: "syscalls:sys_exit_openat", Expr: trigCond, Action: TriggerSnapshot}},
	})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	// Some 5,000 opens a second a CPU, 20 bytes each: the 512 KiB a
	// CPU holds take seconds.
	wait := w.busy(t, 6*time.Second, 100)
	time.Sleep(3 * time.Second)
	pid, _, _ := w.miss(t, 1, 0, 0)
	snaps, serr := s.TriggerSnapshots()
	for deadline := time.Now().Add(30 * time.Second); snaps == 0 && serr == nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		snaps, serr = s.TriggerSnapshots()
	}
	if serr != nil || snaps != 1 {
		t.Fatalf("%d snapshots written (%v); want 1", snaps, serr)
	}
	saved := t.TempDir()
	files, err := filepath.Glob(filepath.Join(dir, "trace*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, filepath.Join(dir, "metadata")) {
		b, err := os.ReadFile(f)
		if err == nil {
			err = os.WriteFile(filepath.Join(saved, filepath.Base(f)), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	wait()
	counts := closeCounts(t, s)
	if len(counts) != 1 || counts[0].Matched != 1 || counts[0].Fired != 1 {
		t.Fatalf("trigger counts %+v; want 1 match, 1 action", counts)
	}
	evs, _ := trigEvents(t, saved)
	var trig, latest uint64
	for _, e := range evs {
		latest = max(latest, e.ts)
		if e.pid == int64(pid) {
			if trig != 0 || e.ret != -2 {
				t.Fatalf("events of kctrig miss: another %+v", e)
			}
			trig = e.ts
		}
	}
	if trig == 0 {
		t.Fatalf("the trigger's event (pid %d) is not in the snapshot (%d events)", pid, len(evs))
	}
	// The second before the trigger, whole: on every CPU, events
	// from its start, no pause of the workload in it longer than a
	// quarter of it, and (below) no loss in it.
	var before int
	earliest, prev, gap := map[int64]uint64{}, map[int64]uint64{}, uint64(0)
	for _, e := range evs {
		if e.pid == int64(pid) || e.ts > trig || trig-e.ts > uint64(time.Second) {
			continue
		}
		before++
		if _, ok := earliest[e.cpu]; !ok {
			earliest[e.cpu] = e.ts
		}
		if p, ok := prev[e.cpu]; ok {
			gap = max(gap, e.ts-p)
		}
		prev[e.cpu] = e.ts
	}
	if len(earliest) != runtime.NumCPU() {
		t.Fatalf("the second before the trigger has events of CPUs %v, want all %d", earliest, runtime.NumCPU())
	}
	for cpu, first := range earliest {
		if trig-first < uint64(900*time.Millisecond) || gap > uint64(250*time.Millisecond) {
			t.Fatalf("the workload's events in the second before the trigger: %d; CPU %d's from %v before it; at most %v apart on a CPU; want from 1s before, none 250ms apart",
				before, cpu, time.Duration(trig-first), time.Duration(gap))
		}
	}
	walkTrace(t, saved, func(it *relayfmt.Item, _ []relayfmt.Value) {
		if it.Kind == relayfmt.DiscardedEvents && it.End > trig-uint64(time.Second) && it.Begin < trig {
			t.Errorf("events lost in the second before the trigger: %d between %d and %d", it.Count, it.Begin, it.End)
		}
	})
	// The whole trace has the event too.
	final, _ := trigEvents(t, dir)
	found := false
	for _, e := range final {
		found = found || e.pid == int64(pid) && e.ts == trig
	}
	if !found {
		t.Fatal("the trigger's event is not in the trace at the end")
	}
	t.Logf("snapshot: %d events, %d in the second before the trigger (at most %v apart), the last %v after it",
		len(evs), before, time.Duration(gap), time.Duration(latest-trig))
}

// TestTriggerStopStart stops recording on one failed openat and starts
// it again on one failed unlinkat of the same process, a second later,
// while a workload opens files on every CPU back to back: the two
// events are recorded, and between them nothing of the workload but
// what was under way on another CPU as the gate closed.
func TestTriggerStopStart(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireKernel(t, 5, 12, "triggers (BPF compare-and-swap)")
	w := newTrigWork(t)
	s, dir := newTestSession(t, Config{
		Events: []string{"syscalls:sys_exit_openat", "syscalls:sys_exit_unlinkat"}, Comms: []string{"kctrig-busy", "kctrig-miss"},
		Triggers: []Trigger{
			{Event: "syscalls:sys_exit_openat", Expr: trigCond, Action: TriggerStop},
			{Event: "syscalls:sys_exit_unlinkat", Expr: trigCond, Action: TriggerStart},
		},
	})
	// The raw path evaluates the triggers of its events on the perf
	// tracepoints where programs run preemptibly, whose runs the
	// kernel never skips: a syscall tracepoint's program would miss
	// the trigger's event now and then there, preempted on the CPU.
	if raw, why := s.RawSyscalls(); len(raw) != 2 {
		t.Fatalf("the raw path records %v (%v); want both events", raw, why)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	wait := w.busy(t, 2500*time.Millisecond, 0)
	time.Sleep(500 * time.Millisecond)
	pid, _, _ := w.miss(t, 1, 0, time.Second)
	wait()
	counts := closeCounts(t, s)
	if len(counts) != 2 || counts[0].Fired != 1 || counts[1].Fired != 1 {
		t.Fatalf("trigger counts %+v; want one stop and one start", counts)
	}
	evs, discards := trigEvents(t, dir)
	var stop, start uint64
	for _, e := range evs {
		if e.pid != int64(pid) {
			continue
		}
		switch {
		case e.name == "syscalls:sys_exit_openat" && stop == 0:
			stop = e.ts
		case e.name == "syscalls:sys_exit_unlinkat" && start == 0:
			start = e.ts
		default:
			t.Fatalf("events of kctrig miss: another %+v", e)
		}
	}
	if stop == 0 || start == 0 || start < stop+uint64(time.Second/2) {
		t.Fatalf("stop's event at %d, start's at %d: want both, a second apart (discarded: %v)", stop, start, discards)
	}
	var between, before, after int
	for _, e := range evs {
		switch {
		case e.pid == int64(pid):
		case e.ts < stop:
			before++
		case e.ts > start:
			after++
		default:
			between++
		}
	}
	// A program that passed the gate on another CPU before it closed
	// still stamps its record after the trigger's: at most one a CPU.
	if between > runtime.NumCPU()-1 || before == 0 || after == 0 {
		t.Fatalf("workload's events: %d before the stop, %d between stop and start (at most %d), %d after", before, between, runtime.NumCPU()-1, after)
	}
	t.Logf("workload's events: %d before the stop, %d between, %d after the start", before, between, after)
}

// TestTriggerRateLimit fires a storm of matches, 2000 failed opens over
// about a second, at a snapshot trigger limited to one action per
// 200 ms: every match is counted, and the actions are at most
// ceil(duration/interval)+1.
func TestTriggerRateLimit(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireKernel(t, 5, 12, "triggers (BPF compare-and-swap)")
	w := newTrigWork(t)
	const interval = 200 * time.Millisecond
	const n = 2000
	s, _ := newTestSession(t, Config{
		Events: []string{"syscalls:sys_exit_openat"}, Comms: []string{"kctrig-miss"}, Mode: relayfmt.Overwrite,
		Triggers: []Trigger{{Event: "syscalls:sys_exit_openat", Expr: trigCond, Action: TriggerSnapshot, Interval: interval}},
	})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	_, first, last := w.miss(t, n, 500, 0)
	counts := closeCounts(t, s)
	snaps, serr := s.TriggerSnapshots()
	if serr != nil {
		t.Fatal(serr)
	}
	d := time.Duration(last - first)
	most := uint64(math.Ceil(float64(d)/float64(interval))) + 1
	c := counts[0]
	if c.Matched != n || c.Fired < 2 || c.Fired > most || snaps < 1 || snaps > c.Fired {
		t.Fatalf("over %v: %d matches, %d actions, %d snapshots; want %d matches, 2 to %d actions, 1 to that many snapshots", d, c.Matched, c.Fired, snaps, n, most)
	}
	t.Logf("over %v: %d matches, %d actions (at most %d), %d snapshots", d, c.Matched, c.Fired, most, snaps)
}

// TestTriggerKeptAcrossFilterChange: a field filter changed while
// recording (ctl filter) loads a new program copy for the event, which
// keeps the event's trigger.
func TestTriggerKeptAcrossFilterChange(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireKernel(t, 5, 12, "triggers (BPF compare-and-swap)")
	w := newTrigWork(t)
	s, _ := newTestSession(t, Config{
		Events: []string{"syscalls:sys_exit_openat"}, Comms: []string{"kctrig-miss"},
		Triggers: []Trigger{{Event: "syscalls:sys_exit_openat", Expr: trigCond, Action: TriggerStop}},
	})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetFilter("syscalls:sys_exit_openat", "ret != 12345"); err != nil {
		t.Fatal(err)
	}
	w.miss(t, 1, 0, 0)
	counts, err := s.TriggerCounts()
	if err != nil {
		t.Fatal(err)
	}
	if counts[0].Fired != 1 || s.Running() {
		t.Fatalf("after the filter change: %+v, running %v; want one stop", counts, s.Running())
	}
}
