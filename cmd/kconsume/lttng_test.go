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

var (
	rePrevPrio = regexp.MustCompile(`prev_comm = "kcprio", prev_[pt]id = \d+, prev_prio = (-?\d+)`)
	reNextPrio = regexp.MustCompile(`next_comm = "kcprio", next_[pt]id = \d+, next_prio = (-?\d+)`)
	reTaskPrio = regexp.MustCompile(`[{,] comm = "kcprio", [pt]id = \d+, prio = (-?\d+)`)
	rePrevTID  = regexp.MustCompile(`prev_comm = "kcprio", prev_tid = (\d+)`)
)

var (
	reBlockRq  = regexp.MustCompile(`(block_rq_issue|block_rq_complete): .*? (?:tid|common_pid) = (\d+), dev = (\d+), sector = (\d+), nr_sector = (\d+), (?:bytes = (\d+)|error = (-?\d+)), (?:ioprio = \d+, )?rwbs = ("?\w*"?)`)
	reDiskRow  = regexp.MustCompile(`(?m)^[█ ]*(\d+) (requests|sectors) (\S+)$`)
	reBlockRow = regexp.MustCompile(`(?m)^[█ ]*([\d.]+) (B|KiB|MiB) \S+ \(pid=(?:(\d+)|unknown \(tid=(\d+)\))\)$`)
)
