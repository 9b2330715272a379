package consumer

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
	"golang.org/x/sys/unix"
)

// BenchmarkTracepointCost measures what tracing adds to a traced event: a
// tight getpid loop of b.N calls untraced, under `kconsume record -e
// syscalls:sys_enter_getpid` (the command, trace to disk), under
// `trace-cmd record -d --no-filter -e syscalls:sys_enter_getpid`, and
// under `perf record -a -e syscalls:sys_enter_getpid` (Debian's
// linux-perf, when installed), in rounds A/B/C/D so the machine's noise
// hits all alike. Reported: median ns per call of each, events lost, and
// kconsume's added cost as a ratio of trace-cmd's (median, min and max of
// the rounds' ratios). The host's tracing state is restored after
// trace-cmd.
func BenchmarkTracepointCost(b *testing.B) {
	testenv.RequireRoot(b)
	tc, err := exec.LookPath("trace-cmd")
	if err != nil {
		testenv.Missing(b, "trace-cmd is required (apt-get install trace-cmd): %v", err)
	}
	pf, perfErr := exec.LookPath("perf")
	bin := testenv.KconsumeBin(b)
	restore := testenv.SaveTracing(b)
	defer restore()
	// make bench runs one round per invocation and pairs the rounds itself.
	rounds := benchRounds(5)
	var base, ours, theirs, perfs, ratios []float64
	var lost, tcLost, perfLost uint64
	for r := 0; r < rounds; r++ {
		mb := timeGetpid(b.N)
		base = append(base, mb)
		var l uint64
		mo := withKconsume(b, bin, func() float64 { return timeGetpid(b.N) }, &l)
		ours = append(ours, mo)
		lost += l
		mt := withTracer(b, "trace-cmd", []string{tc, "record", "-d", "--no-filter", "-e", "syscalls:sys_enter_getpid", "-o", filepath.Join(b.TempDir(), "trace.dat")}, func() float64 { return timeGetpid(b.N) }, &l)
		theirs = append(theirs, mt)
		tcLost += l
		restore()
		ratios = append(ratios, (mo-mb)/(mt-mb))
		if perfErr == nil {
			perfs = append(perfs, withTracer(b, "perf", []string{pf, "record", "-a", "-e", "syscalls:sys_enter_getpid", "-o", filepath.Join(b.TempDir(), "perf.data")}, func() float64 { return timeGetpid(b.N) }, &l))
			perfLost += l
		}
	}
	mb := median(base)
	b.ReportMetric(mb, "untraced-ns/call")
	b.ReportMetric(median(ours)-mb, "kconsume-added-ns")
	b.ReportMetric(median(theirs)-mb, "trace-cmd-added-ns")
	if perfErr == nil {
		b.ReportMetric(median(perfs)-mb, "perf-added-ns")
		b.ReportMetric(float64(perfLost), "perf-lost")
	} else {
		b.Logf("perf record not measured: %v (apt-get install linux-perf)", perfErr)
	}
	b.ReportMetric(median(ratios), "added-cost-ratio")
	b.ReportMetric(slices.Min(ratios), "added-cost-ratio-min")
	b.ReportMetric(slices.Max(ratios), "added-cost-ratio-max")
	b.ReportMetric(float64(lost), "kconsume-lost")
	b.ReportMetric(float64(tcLost), "trace-cmd-lost")
}

// withKconsume runs fn while `kconsume record` records sys_enter_getpid
// into a temporary directory, and sets *lost to the events the trace
// reports discarded.
func withKconsume(b *testing.B, bin string, fn func() float64, lost *uint64) float64 {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "t")
	name := fmt.Sprintf("kc-bench-%d", os.Getpid())
	cmd := exec.Command(bin, "record", "-q", "-e", "syscalls:sys_enter_getpid", "-o", dir, "--session", name)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := os.ReadFile(filepath.Join(control.DefaultRoot, name, "state"))
		if strings.TrimSpace(string(st)) == "running" {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			b.Fatalf("kconsume record did not start:\n%s", log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	v := fn()
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		b.Fatalf("kconsume record: %v\n%s", err, log.String())
	}
	tr, err := relayfmt.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	m, err := tr.Merge()
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	*lost = 0
	for m.Next() {
		if it := m.Item(); it.Kind == relayfmt.DiscardedEvents {
			*lost += it.Count
		}
	}
	if *lost != 0 {
		// Which layer lost them: the summary's per-CPU columns.
		b.Logf("kconsume record lost %d events:\n%s", *lost, log.String())
	}
	return v
}

// startLogged starts cmd with its stdout and stderr gathered, and
// returns a function that waits until that output has ended (cmd exited
// or was killed) and returns it.
func startLogged(b *testing.B, cmd *exec.Cmd) (output func() string) {
	b.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var log strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
		}
	}()
	return func() string {
		<-done
		return log.String()
	}
}

// withTracer runs fn while the tracer command args (trace-cmd or perf
// record) records sys_enter_getpid, and sets *lost to what it reports
// lost (trace-cmd's per-CPU overruns, perf's lost samples).
func withTracer(b *testing.B, tool string, args []string, fn func() float64, lost *uint64) float64 {
	b.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	output := startLogged(b, cmd)
	if tool == "trace-cmd" {
		// trace-cmd's stdout is a pipe, so its "Hit Ctrl^C" line stays in
		// its buffer: wait for the event to be enabled and tracing on.
		enable := "/sys/kernel/tracing/events/syscalls/sys_enter_getpid/enable"
		deadline := time.Now().Add(30 * time.Second)
		for {
			e, _ := os.ReadFile(enable)
			on, _ := os.ReadFile("/sys/kernel/tracing/tracing_on")
			if strings.TrimSpace(string(e)) == "1" && strings.TrimSpace(string(on)) == "1" {
				break
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				text := output()
				_ = cmd.Wait()
				b.Fatalf("trace-cmd did not start:\n%s", text)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// trace-cmd's per-CPU recorders start right after; perf says nothing
	// before it stops.
	time.Sleep(500 * time.Millisecond)
	v := fn()
	_ = cmd.Process.Signal(os.Interrupt)
	text := output()
	err := cmd.Wait()
	*lost = 0
	switch tool {
	case "trace-cmd":
		// Debian's trace-cmd exits 1 here after recording, because it
		// cannot open set_ftrace_filter (no function tracer): judge by
		// its report.
		if !strings.Contains(text, "data recorded") {
			b.Fatalf("trace-cmd: %v\n%s", err, text)
		}
		for _, m := range regexp.MustCompile(`(?m)^overrun: (\d+)`).FindAllStringSubmatch(text, -1) {
			n, _ := strconv.ParseUint(m[1], 10, 64)
			*lost += n
		}
	case "perf":
		if !strings.Contains(text, "perf record: Captured") {
			b.Fatalf("perf record: %v\n%s", err, text)
		}
		if m := regexp.MustCompile(`lost (\d+) chunks`).FindStringSubmatch(text); m != nil {
			n, _ := strconv.ParseUint(m[1], 10, 64)
			*lost += n
		}
	}
	return v
}

// timeGetpid returns the ns per call of n getpid calls on one thread.
func timeGetpid(n int) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	for i := 0; i < n; i++ {
		unix.Getpid()
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}
