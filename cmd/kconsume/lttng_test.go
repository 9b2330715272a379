package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/testenv"
)

// buildWorkload compiles testdata/kcwork.c, static so that the dynamic
// loader makes no read of its own.
func buildWorkload(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		testenv.Missing(t, "a C compiler is required for the workload (apt-get install gcc): %v", err)
	}
	bin := filepath.Join(t.TempDir(), "kcwork")
	if out, err := exec.Command(cc, "-static", "-O1", "-o", bin, "testdata/kcwork.c").CombinedOutput(); err != nil {
		t.Fatalf("building kcwork: %v\n%s", err, out)
	}
	return bin
}

// runAnalysis runs one of LTTng's analyses on the trace under dir and
// returns its output; a failure or a Python traceback fails t.
func runAnalysis(t *testing.T, tool, dir string, args ...string) string {
	t.Helper()
	p := testenv.LTTngAnalysis(t, tool)
	cmd := exec.Command(p, append(append([]string{"--no-progress"}, args...), dir)...)
	out, err := cmd.CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("Traceback")) || bytes.Contains(out, []byte("Error:")) {
		t.Fatalf("%s %s: %v\n%s", tool, dir, err, out)
	}
	return string(out)
}

// schedRuntime returns the nanoseconds pid has run (/proc/PID/schedstat).
func schedRuntime(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	n, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// irqCounts returns /proc/interrupts' count of each numbered IRQ over
// all CPUs.
func irqCounts(t *testing.T) map[int]uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]uint64{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		irq, err := strconv.Atoi(strings.TrimSuffix(f[0], ":"))
		if err != nil {
			continue
		}
		for _, v := range f[1:] {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				break
			}
			out[irq] += n
		}
	}
	return out
}

// waitRunning waits for a session's state file to read running: loading
// the programs takes seconds in a TCG guest, more than waitFor waits.
func waitRunning(t *testing.T, state string) {
	t.Helper()
	for i := 0; i < 1200; i++ {
		if b, _ := os.ReadFile(state); strings.TrimSpace(string(b)) == "running" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never read running", state)
}

var (
	reTimerange = regexp.MustCompile(`Timerange: \[(\S+ \S+), (\S+ \S+)\]`)
	reRead      = regexp.MustCompile(`(?m)^ - read\s+(\d+)\s`)
	reIRQ       = regexp.MustCompile(`(?m)^(\d+): <[^>]*>\s+(\d+)\s`)
)

// TestLTTngAnalyses records known workloads with --profile lttng and holds
// the figures of LTTng's own analyses (python3-lttnganalyses) against the
// truth: a reader that opened a file before the recording and then reads
// it N times one byte at a time, and a CPU burner that runs all along.
func TestLTTngAnalyses(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	work := buildWorkload(t)
	tmp := t.TempDir()
	const n = 37
	file := filepath.Join(tmp, "known-file-opened-before.dat")
	if err := os.WriteFile(file, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	gofile := filepath.Join(tmp, "go")

	// The burner outlives the test (killed at cleanup): in a TCG guest the
	// recording takes many seconds to start.
	burner := exec.Command(work, "burn", "600")
	reader := exec.Command(work, "read", file, strconv.Itoa(n), gofile)
	for _, c := range []*exec.Cmd{burner, reader} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		c := c
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	// The reader has its file open before the recording starts: only the
	// statedump can name it.
	waitFor(t, func() bool {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", reader.Process.Pid))
		return l == file
	})

	out := filepath.Join(tmp, "lttng", "kernel")
	if err := os.MkdirAll(filepath.Dir(out), 0o750); err != nil {
		t.Fatal(err)
	}
	name := "lttng" + strconv.Itoa(os.Getpid())
	// No --duration: the window below and the reader's reads must fall
	// inside the recording, and in a TCG guest they outlast a fixed one
	// (it was 5 s for 3 s of sleeps). It ends with Ctrl-C once the
	// reader is done, or is killed when the test fails first.
	rec := exec.Command(bin, "record", "-q", "--profile", "lttng", "-o", out, "--session", name,
		"-e", "sched:sched_switch,sched:sched_wakeup,sched:sched_waking,sched:sched_process_exec,sched:sched_process_exit,irq:*,syscalls:sys_enter_read,syscalls:sys_exit_read")
	var recOut bytes.Buffer
	rec.Stdout, rec.Stderr = &recOut, &recOut
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	recDone := make(chan error, 1)
	go func() { recDone <- rec.Wait() }()
	t.Cleanup(func() {
		if rec.Process.Kill() == nil {
			<-recDone
			_ = os.RemoveAll(filepath.Join("/run/kconsume", name))
		}
	})
	ctl := filepath.Join("/run/kconsume", name, "state")
	waitRunning(t, ctl)
	time.Sleep(1500 * time.Millisecond) // past the statedump
	// The burner's run time by the kernel's account over a window inside
	// the recording.
	irq0 := irqCounts(t)
	w0, run0 := time.Now(), schedRuntime(t, burner.Process.Pid)
	if err := os.WriteFile(gofile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	w1, run1 := time.Now(), schedRuntime(t, burner.Process.Pid)
	irq1 := irqCounts(t)
	if err := reader.Wait(); err != nil {
		t.Fatalf("reader: %v", err)
	}
	if err := rec.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := <-recDone; err != nil {
		t.Fatalf("record: %v\n%s", err, recOut.String())
	}
	testenv.RunBT2(t, out) // babeltrace2 reads it whole
	dir := filepath.Dir(out)

	// lttng-syscallstats: the reader's N reads.
	o := runAnalysis(t, "lttng-syscallstats", dir, "--tid", strconv.Itoa(reader.Process.Pid))
	m := reRead.FindStringSubmatch(o)
	if m == nil || m[1] != strconv.Itoa(n) {
		t.Errorf("lttng-syscallstats: reader's reads %v, want %d\n%s", m, n, o)
	} else {
		t.Logf("lttng-syscallstats: reader (tid %d) read count %s, truth %d", reader.Process.Pid, m[1], n)
	}

	// lttng-iousagetop: the file the statedump named, with its N bytes.
	o = runAnalysis(t, "lttng-iousagetop", dir, "--limit", "10000")
	reFile := regexp.MustCompile(`(\d+)\s+B ` + regexp.QuoteMeta(file) + `\s`)
	if m := reFile.FindStringSubmatch(o); m == nil || m[1] != strconv.Itoa(n) {
		t.Errorf("lttng-iousagetop: %s read %v bytes, want %d\n%s", file, m, n, o)
	} else {
		t.Logf("lttng-iousagetop: %s B %s (truth %d B, opened before the recording)", m[1], file, n)
	}

	// lttng-cputop over the window: the burner's share against the
	// kernel's own account of its run time in that window.
	const hms = "15:04:05.000000000"
	o = runAnalysis(t, "lttng-cputop", dir, "--limit", "10000", "--gmt", "--begin", w0.UTC().Format(hms), "--end", w1.UTC().Format(hms))
	tr := reTimerange.FindStringSubmatch(o)
	if tr == nil {
		t.Fatalf("lttng-cputop: no time range\n%s", o)
	}
	reBurn := regexp.MustCompile(`([\d.]+) %\s+kcwork \(` + strconv.Itoa(burner.Process.Pid) + `\)`)
	// No line is 0 %.
	var got float64
	if bm := reBurn.FindStringSubmatch(o); bm != nil {
		got, _ = strconv.ParseFloat(bm[1], 64)
	}
	// schedstat counts in the scheduler's clock and the window is wall
	// time: in a TCG guest the two drift apart by some percent, and the
	// burner's account came out at 104 %. One thread runs at most the
	// whole window.
	truth := min(100, 100*float64(run1-run0)/float64(w1.Sub(w0).Nanoseconds()))
	t.Logf("lttng-cputop: burner %.2f %% over %s; kernel schedstat %.2f %% (the machine is shared)", got, tr[0], truth)
	// Two TCG guests on a loaded 2-core host drifted 8 points apart
	// (93.3 % against 85.4 % in the 6.12 guest): the drift above grows
	// with the host's load.
	tol := 5.0
	if testenv.InGuest() {
		tol = 10
	}
	if got > truth+tol || got < truth-tol {
		t.Errorf("lttng-cputop: burner %.2f %%, kernel says %.2f %% (within %.0f points wanted)", got, truth, tol)
	}
	if truth < 10 {
		t.Errorf("the burner ran %.2f %% of the window by the kernel's account: the comparison says nothing", truth)
	}

	// lttng-schedlog: the reader's wakeups: at least the two sleeps it
	// takes after the go file, at most one per 10 ms poll of the 3 s
	// recording and its start-up.
	o = runAnalysis(t, "lttng-schedlog", dir, "--tid", strconv.Itoa(reader.Process.Pid))
	wakeups := strings.Count(o, fmt.Sprintf("kcwork (%d)", reader.Process.Pid))
	if max := 600; wakeups < 2 || wakeups > max {
		t.Errorf("lttng-schedlog: %d wakeups of the reader, want 2..%d\n%s", wakeups, max, o)
	}
	t.Logf("lttng-schedlog: %d wakeups of the reader", wakeups)

	// lttng-irqstats over the window: each hard IRQ's count against what
	// /proc/interrupts counted in it, give or take the interrupts on the
	// window's edges.
	o = runAnalysis(t, "lttng-irqstats", dir, "--gmt", "--begin", w0.UTC().Format(hms), "--end", w1.UTC().Format(hms))
	seen := map[int]uint64{}
	for _, m := range reIRQ.FindAllStringSubmatch(o, -1) {
		irq, _ := strconv.Atoi(m[1])
		seen[irq], _ = strconv.ParseUint(m[2], 10, 64)
	}
	total := 0
	for irq, c1 := range irq1 {
		truth, got := c1-irq0[irq], seen[irq]
		total += int(got)
		if slack := 2 + truth/50; got+slack < truth || got > truth+slack {
			t.Errorf("lttng-irqstats: IRQ %d seen %d times in the window, /proc/interrupts counted %d\n%s", irq, got, truth, o)
		}
	}
	t.Logf("lttng-irqstats: %d hard IRQs in the window, each within its /proc/interrupts count", total)
}

// TestCtlStatedump: kconsume ctl statedump writes a second statedump into
// a --profile lttng recording, on the CPU asked for; a session of the
// ftrace profile refuses it, and --profile lttng refuses --global.
func TestCtlStatedump(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	tmp := t.TempDir()
	if o, code := shell(t, bin+" record -q --profile lttng --global -o "+filepath.Join(tmp, "g")+" -e sched:sched_switch --duration 1s"); code != 2 || !strings.Contains(o, "drop --global") {
		t.Fatalf("--global: %d %s", code, o)
	}
	for _, prof := range []string{"lttng", "ftrace"} {
		out := filepath.Join(tmp, prof)
		name := "sd" + prof + strconv.Itoa(os.Getpid())
		// No --duration, which a loaded machine's statedump may outlast:
		// it ends with Ctrl-C, or is killed when the test fails first.
		rec := exec.Command(bin, "record", "-q", "--profile", prof, "--session", name, "-o", out, "-e", "sched:sched_switch")
		var recOut bytes.Buffer
		rec.Stdout, rec.Stderr = &recOut, &recOut
		if err := rec.Start(); err != nil {
			t.Fatal(err)
		}
		recDone := make(chan error, 1)
		go func() { recDone <- rec.Wait() }()
		t.Cleanup(func() {
			if rec.Process.Kill() == nil {
				<-recDone
				_ = os.RemoveAll(filepath.Join("/run/kconsume", name))
			}
		})
		ctl := filepath.Join("/run/kconsume", name, "state")
		waitRunning(t, ctl)
		o, code := shell(t, bin+" ctl --session "+name+" --cpu 1 statedump")
		// Stopped once the statedump answered, not at a duration a
		// loaded machine's statedump may outlast.
		if err := rec.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		if err := <-recDone; err != nil {
			t.Fatalf("record: %v\n%s", err, recOut.String())
		}
		if prof == "ftrace" {
			if code == 0 || !strings.Contains(o, "needs a session recording with --profile lttng") {
				t.Errorf("ctl statedump on an ftrace session: %d %s", code, o)
			}
			continue
		}
		if code != 0 || !strings.Contains(o, "statedump 2:") {
			t.Fatalf("ctl statedump: %d %s", code, o)
		}
		r, code := shell(t, bin+" report -e lttng_statedump_start,lttng_statedump_end "+out)
		lines := strings.Split(strings.TrimSpace(r), "\n")
		if code != 0 || len(lines) != 4 || !strings.Contains(lines[0], "cpu0 lttng_statedump_start: seq=1") || !strings.Contains(lines[2], "cpu1 lttng_statedump_start: seq=2") || !strings.Contains(lines[3], "cpu1 lttng_statedump_end: seq=2") {
			t.Errorf("statedumps in the trace:\n%s", r)
		}
	}
}

var reTIDStats = regexp.MustCompile(`(?m)^\S+ \(([\d?]+), TID: (\d+)\)`)

// reSkipped finds record's note that the kernel skipped the recorder.
var reSkipped = regexp.MustCompile(`the kernel skipped the recorder \d+ times`)

// TestLTTngFork: sched_process_fork, which the lttng profile builds with
// its own program, gives LTTng's analyses each new task's process: a
// workload started after the statedump forks processes that each start
// threads, and lttng-syscallstats must put every thread that called
// getppid(2) in the process the thread itself saw (getpid), on both
// transports. Without the event, or with ftrace's tids as pids, it says
// "?" or the thread's own id.
func TestLTTngFork(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	work := buildWorkload(t)
	const procs, threads = 3, 4
	for _, transport := range []string{"ringbuf", "perf"} {
		t.Run(transport, func(t *testing.T) {
			if transport == "ringbuf" {
				testenv.RequireKernel(t, 5, 8, "BPF ring buffers")
			}
			// Where tracepoint programs run preemptible (Linux 7.x), a
			// task preempted inside one holds the CPU's bpf_prog_active,
			// and the kernel skips every other such program there until it
			// runs again: the summary counts these as missed. A thread
			// whose getppid calls were skipped is then rightly absent, so
			// a recording with misses is made again, up to 3 times.
			var tmp, out, who string
			for try := 1; ; try++ {
				tmp = t.TempDir()
				out = filepath.Join(tmp, "lttng", "kernel")
				who = filepath.Join(tmp, "who")
				// One run names the trace's own directory, the other the
				// session's, into whose kernel/ record then writes it.
				arg := out
				if transport == "ringbuf" {
					arg = filepath.Dir(out)
				}
				o, code := shell(t, fmt.Sprintf("%s record --profile lttng --transport %s -o %s --session fork%s%d -e 'sched:sched_switch,sched:sched_process_*,syscalls:sys_enter_getppid,syscalls:sys_exit_getppid' -- %s fork %d %d %s",
					bin, transport, arg, transport, os.Getpid(), work, procs, threads, who))
				if code != 0 || strings.Contains(o, "keeps ftrace's fields") {
					t.Fatalf("record: %d\n%s", code, o)
				}
				if said := strings.Contains(o, "goes into "+out+", laid out as an LTTng session: give "+arg+" "); said != (arg != out) {
					t.Fatalf("record -o %s: said where the trace goes: %v, want %v\n%s", arg, said, arg != out, o)
				}
				if m := reSkipped.FindString(o); m == "" || try == 3 {
					break
				} else {
					t.Logf("try %d: %s; recording again", try, m)
				}
			}
			b, err := os.ReadFile(who)
			if err != nil {
				t.Fatal(err)
			}
			truth := map[string]string{} // tid → pid
			pids := map[string]bool{}
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				pid, tid, _ := strings.Cut(l, " ")
				truth[tid] = pid
				pids[pid] = true
			}
			if len(truth) != procs*(threads+1) || len(pids) != procs {
				t.Fatalf("workload: %d threads in %d processes, want %d in %d\n%s", len(truth), len(pids), procs*(threads+1), procs, b)
			}
			lines, _ := testenv.RunBT2(t, out)
			forks := 0
			for _, l := range lines {
				if strings.Contains(l, " sched_process_fork: ") {
					forks++
				}
			}
			if forks < procs*(threads+1) {
				t.Errorf("babeltrace2: %d sched_process_fork events, want at least %d", forks, procs*(threads+1))
			}
			// kconsume's reader takes the session's directory as
			// babeltrace2 and the analyses do (its LOST lines aside).
			if o, code := shell(t, bin+" report "+filepath.Dir(out)+" | grep -vc ' LOST '"); code != 0 || strings.TrimSpace(o) != strconv.Itoa(len(lines)) {
				t.Errorf("kconsume report %s: exit %d, %s lines, babeltrace2 %d", filepath.Dir(out), code, strings.TrimSpace(o), len(lines))
			}
			a := runAnalysis(t, "lttng-syscallstats", filepath.Dir(out))
			seen := map[string]string{}
			for _, m := range reTIDStats.FindAllStringSubmatch(a, -1) {
				seen[m[2]] = m[1]
			}
			threadsSeen := 0
			for tid, pid := range truth {
				if seen[tid] != pid {
					t.Errorf("lttng-syscallstats: TID %s in process %q, the thread saw %s", tid, seen[tid], pid)
				}
				if tid != pid && seen[tid] == pid {
					threadsSeen++
				}
			}
			if t.Failed() {
				t.Logf("lttng-syscallstats said:\n%s\nthe workload's tasks (pid tid):\n%s", a, b)
			}
			t.Logf("lttng-syscallstats: %d tasks in their %d processes (%d of them threads: child_pid != child_tid), as the tasks saw themselves", len(truth), len(pids), threadsSeen)
		})
	}
}

var (
	rePrevPrio = regexp.MustCompile(`prev_comm = "kcprio", prev_[pt]id = \d+, prev_prio = (-?\d+)`)
	reNextPrio = regexp.MustCompile(`next_comm = "kcprio", next_[pt]id = \d+, next_prio = (-?\d+)`)
	reTaskPrio = regexp.MustCompile(`[{,] comm = "kcprio", [pt]id = \d+, prio = (-?\d+)`)
	rePrevTID  = regexp.MustCompile(`prev_comm = "kcprio", prev_tid = (\d+)`)
)

// TestLTTngPriorities records a task that sets its nice value to 5 and
// sleeps: lttng-modules writes its priority as task->prio - MAX_RT_PRIO,
// 25, in sched_switch (prev_prio, next_prio), sched_waking, sched_wakeup
// and sched_process_exit, and lttng-cputop's Priorities column shows 25;
// the ftrace profile keeps the kernel's 125. Under lttng a --comm filter
// still applies to sched_switch: every switch recorded is the task's.
func TestLTTngPriorities(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	work := buildWorkload(t)
	const nice, sleeps = 5, 20
	for _, tc := range []struct {
		profile, filter string
		want            int
	}{
		{"lttng", "", 20 + nice},
		{"ftrace", "", 120 + nice},
		{"lttng", "--comm kcprio", 20 + nice},
	} {
		t.Run(strings.TrimSpace(tc.profile+" "+tc.filter), func(t *testing.T) {
			// A recording may lack a wakeup on our development VM (the
			// 6.18 PVM guest): the kernel skipped the recorder (another
			// BPF program ran on the CPU), or the wakeup came while the
			// machine's own agent thread ran, where an ftrace instance
			// beside kconsume sees wakeups that no BPF program does,
			// tracepoint or tp_btf, and no counter counts. Record again, as TestLTTngFork does.
			var out, o string
			var lines []string
			var counts map[string]int
			short := func() bool {
				return counts["sched_switch"] < sleeps || counts["sched_process_exit"] != 1 || tc.filter == "" && (counts["sched_waking"] < sleeps || counts["sched_wakeup"] < sleeps)
			}
			for try := 1; ; try++ {
				out = filepath.Join(t.TempDir(), "kernel")
				var code int
				o, code = shell(t, fmt.Sprintf("%s record --profile %s %s -o %s --session prio%d -e 'sched:sched_switch,sched:sched_waking,sched:sched_wakeup,sched:sched_process_exit' -- %s prio %d %d",
					bin, tc.profile, tc.filter, out, os.Getpid(), work, nice, sleeps))
				if code != 0 {
					t.Fatalf("record: %d\n%s", code, o)
				}
				lines, _ = testenv.RunBT2(t, out)
				counts = map[string]int{}
				for _, l := range lines {
					ev := ""
					for _, e := range []string{"sched_switch", "sched_waking", "sched_wakeup", "sched_process_exit"} {
						if strings.Contains(l, e+": ") {
							ev = e
						}
					}
					if ev == "" {
						continue
					}
					if tc.profile == "lttng" && strings.Contains(l, "sched:") || tc.profile == "ftrace" && !strings.Contains(l, "sched:") {
						t.Fatalf("profile %s, event named otherwise: %s", tc.profile, l)
					}
					if tc.filter != "" && ev == "sched_switch" && !rePrevPrio.MatchString(l) {
						t.Errorf("--comm kcprio: a switch from another task was recorded: %s", l)
					}
					for _, re := range []*regexp.Regexp{rePrevPrio, reNextPrio, reTaskPrio} {
						for _, m := range re.FindAllStringSubmatch(l, -1) {
							if p, _ := strconv.Atoi(m[1]); p != tc.want {
								t.Errorf("priority %d, want %d: %s", p, tc.want, l)
							}
							counts[ev]++
						}
					}
				}
				t.Logf("try %d: kcprio's priorities in %v", try, counts)
				if !short() || try == 3 {
					break
				}
				t.Logf("try %d: too few of kcprio's events (%s); recording again", try, reSkipped.FindString(o))
			}
			// Each sleep switches out and back in; the wakeups come from
			// other tasks' contexts, which a comm filter leaves out.
			if short() {
				t.Errorf("too few of kcprio's events: %v (%d sleeps)\nrecord: %s", counts, sleeps, o)
			}
			if tc.profile != "lttng" || tc.filter != "" {
				return
			}
			// The analyses name the task as it was forked (kconsume):
			// find its row by its thread id. Its priorities are nice 0's
			// until setpriority, then the one wanted.
			var tid string
			for _, l := range lines {
				if m := rePrevTID.FindStringSubmatch(l); m != nil {
					tid = m[1]
					break
				}
			}
			a := runAnalysis(t, "lttng-cputop", filepath.Dir(out), "--limit", "100000")
			row := regexp.MustCompile(`\(` + tid + `\)[^\n]*`).FindString(a)
			if !strings.HasSuffix(row, fmt.Sprintf("[20, %d]", tc.want)) {
				t.Errorf("lttng-cputop: task %s's row %q, want Priorities [20, %d]\n%s", tid, row, tc.want, a)
			}
		})
	}
}

// loopDevice attaches a loop device to a new file of size bytes and
// returns its path and its dev_t as the kernel encodes it (major << 20 |
// minor, as block events carry it), with no I/O scheduler; it is
// detached when t ends. It skips
// t where the kernel has no loop devices (no /dev/loop-control: the loop
// module is not loaded).
func loopDevice(t *testing.T, size int64) (string, uint64) {
	t.Helper()
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices for the block I/O workload (the loop module): %v", err)
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		testenv.Missing(t, "losetup is required for the block I/O workload (apt-get install util-linux): %v", err)
	}
	file := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup --find --show %s: %v\n%s", file, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v\n%s", dev, err, out)
		}
	})
	// No I/O scheduler, so the submitter issues its request itself (as
	// Linux 6.x does for loop devices): with one (5.10's mq-deadline)
	// kblockd's workers issue them, and the requests are theirs.
	sched := filepath.Join("/sys/block", filepath.Base(dev), "queue", "scheduler")
	if err := os.WriteFile(sched, []byte("none"), 0o644); err != nil {
		t.Fatalf("%s: %v", sched, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return dev, uint64(unix.Major(st.Rdev))<<20 | uint64(unix.Minor(st.Rdev))
}

var (
	reBlockRq  = regexp.MustCompile(`(block_rq_issue|block_rq_complete): .*? (?:tid|common_pid) = (\d+), dev = (\d+), sector = (\d+), nr_sector = (\d+), (?:bytes = (\d+)|error = (-?\d+)), (?:ioprio = \d+, )?rwbs = ("?\w*"?)`)
	reDiskRow  = regexp.MustCompile(`(?m)^[█ ]*(\d+) (requests|sectors) (\S+)$`)
	reBlockRow = regexp.MustCompile(`(?m)^[█ ]*([\d.]+) (B|KiB|MiB) \S+ \(pid=(?:(\d+)|unknown \(tid=(\d+)\))\)$`)
)

// iousageBytes returns lttng-iousagetop's Block I/O bytes of section
// ("Block I/O Read" or "Block I/O Write") in its output a, by thread: a
// row names a task by pid when the analyses know its process, else by
// tid. It fails t when the section is missing.
func iousageBytes(t *testing.T, a, section string) map[string]float64 {
	t.Helper()
	i := strings.Index(a, section)
	if i < 0 {
		t.Fatalf("lttng-iousagetop has no %s section\n%s", section, a)
	}
	rest := a[i:]
	if j := strings.Index(rest, "\n\n"); j >= 0 {
		rest = rest[:j]
	}
	out := map[string]float64{}
	for _, m := range reBlockRow.FindAllStringSubmatch(rest, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		v *= map[string]float64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[m[2]]
		out[m[3]+m[4]] += v
	}
	return out
}

// TestLTTngBlock writes 8 blocks of 64 KiB to a loop device with O_DIRECT
// and reads them back, recorded with --profile lttng (with the sched
// events the analyses need to know the tasks): babeltrace2 shows
// block_rq_issue and block_rq_complete as lttng-modules names them, 8 of
// each direction on the device, of 128 sectors and 65536 bytes, with an
// integer rwbs (the write bit set for the writes, the read bit for the
// reads) and the issuing task's tid; lttng-iousagetop counts 16 requests
// and 2048 sectors on the device, and the bytes it files under each task
// that issued them are the bytes of the completed requests that task
// issued (the workload on Linux 6.x, kblockd's workers on 5.10). The
// ftrace profile keeps ftrace's names and rwbs text.
func TestLTTngBlock(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	work := buildWorkload(t)
	const n, size = 8, 64 << 10
	for _, prof := range []string{"lttng", "ftrace"} {
		t.Run(prof, func(t *testing.T) {
			dev, devt := loopDevice(t, 2*n*size)
			out := filepath.Join(t.TempDir(), "kernel")
			o, code := shell(t, fmt.Sprintf("%s record -q --profile %s -o %s --session block%d -e 'block:block_rq_issue,block:block_rq_complete,block:block_rq_insert,block:block_bio_queue,sched:sched_switch,sched:sched_process_fork,sched:sched_process_exec' -- %s dio %s %d %d",
				bin, prof, out, os.Getpid(), work, dev, n, size))
			if code != 0 {
				t.Fatalf("record: %d\n%s", code, o)
			}
			lines, _ := testenv.RunBT2(t, out)
			type key struct {
				ev    string
				write bool
			}
			type rq struct{ dev, sector, nr string }
			counts := map[key]int{}
			issued := map[rq]string{}             // request → "tid write?"
			done := map[string]map[bool]float64{} // tid → write → bytes of completed requests
			issuers := map[string]bool{}          // of the loop device's requests
			for _, l := range lines {
				if strings.Contains(l, "block:") != (prof == "ftrace") && strings.Contains(l, "block_") {
					t.Fatalf("profile %s, event named otherwise: %s", prof, l)
				}
				m := reBlockRq.FindStringSubmatch(l)
				if m == nil {
					if strings.Contains(l, "block_rq_issue:") || strings.Contains(l, "block_rq_complete:") {
						t.Fatalf("unexpected block event: %s", l)
					}
					continue
				}
				ev, tid, r, bytes, errno, rwbs := m[1], m[2], rq{m[3], m[4], m[5]}, m[6], m[7], m[8]
				var write bool
				if prof == "lttng" {
					v, err := strconv.Atoi(rwbs)
					if err != nil {
						t.Fatalf("rwbs %s is not an integer: %s", rwbs, l)
					}
					// lttng-modules' RWBS_FLAG_WRITE and _READ.
					write = v&1 != 0
					if r.dev == strconv.FormatUint(devt, 10) && write == (v&4 != 0) {
						t.Errorf("rwbs %d: want a read or a write: %s", v, l)
					}
				} else {
					write = strings.HasPrefix(rwbs, `"W`)
					if r.dev == strconv.FormatUint(devt, 10) && !write && !strings.HasPrefix(rwbs, `"R`) {
						t.Errorf("rwbs %s: want R or W: %s", rwbs, l)
					}
				}
				if ev == "block_rq_issue" {
					issued[r] = tid
				} else if who, ok := issued[r]; ok && r.nr != "0" {
					// As the analyses: a completion counts for the
					// request issued at that sector with as many sectors.
					nr, _ := strconv.Atoi(r.nr)
					if done[who] == nil {
						done[who] = map[bool]float64{}
					}
					done[who][write] += float64(nr * 512)
					delete(issued, r)
				}
				if r.dev != strconv.FormatUint(devt, 10) {
					continue
				}
				if r.nr != strconv.Itoa(size/512) || ev == "block_rq_issue" && bytes != strconv.Itoa(size) || ev == "block_rq_complete" && errno != "0" {
					t.Errorf("want %d sectors, %d bytes, no error: %s", size/512, size, l)
				}
				if ev == "block_rq_issue" {
					issuers[tid] = true
				}
				counts[key{ev, write}]++
			}
			t.Logf("requests on %s (%d): %v, issued by threads %v", dev, devt, counts, issuers)
			for _, ev := range []string{"block_rq_issue", "block_rq_complete"} {
				if counts[key{ev, true}] != n || counts[key{ev, false}] != n {
					t.Errorf("%s: %d writes and %d reads of %s, want %d of each", ev, counts[key{ev, true}], counts[key{ev, false}], dev, n)
				}
			}
			if prof != "lttng" {
				return
			}
			// Without --no-intersection: the analyses keep by default only
			// the span every stream covers, which holds the whole trace
			// because every stream begins at the start and ends at the
			// stop, as LTTng's do (relayfmt's Channel.Begin and Close); a
			// stream ending at its CPU's last event cut the requests off
			// in 1 run of 6.
			a := runAnalysis(t, "lttng-iousagetop", filepath.Dir(out), "--limit", "100000")
			name := filepath.Base(dev)
			disk := map[string]string{}
			for _, m := range reDiskRow.FindAllStringSubmatch(a, -1) {
				if m[3] == name {
					disk[m[2]] = m[1]
				}
			}
			t.Logf("lttng-iousagetop: %s: %v", name, disk)
			if want := strconv.Itoa(2 * n); disk["requests"] != want {
				t.Errorf("lttng-iousagetop: %s requests on %s, want %s\n%s", disk["requests"], name, want, a)
			}
			if want := strconv.Itoa(2 * n * size / 512); disk["sectors"] != want {
				t.Errorf("lttng-iousagetop: %s sectors on %s, want %s\n%s", disk["sectors"], name, want, a)
			}
			for _, dir := range []struct {
				section string
				write   bool
			}{{"Block I/O Read", false}, {"Block I/O Write", true}} {
				got := iousageBytes(t, a, dir.section)
				for tid := range issuers {
					// iousagetop prints 2 decimals of its unit.
					if want := done[tid][dir.write]; got[tid] < want*0.999 || got[tid] > want*1.001 {
						t.Errorf("lttng-iousagetop: %s: %.0f bytes by thread %s, the trace's completed requests of it %.0f\n%s", dir.section, got[tid], tid, want, a)
					} else {
						t.Logf("lttng-iousagetop: %s: %.0f bytes by thread %s, as the trace", dir.section, got[tid], tid)
					}
				}
			}
		})
	}
}
