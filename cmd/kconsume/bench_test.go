package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/testenv"
)

// BenchmarkPeakRSS runs `kconsume record` for 3 s in overwrite mode while
// every CPU floods getpid, so every sub-buffer fills and is reused, and
// reports the command's peak resident set against the channel buffers it
// was configured with (n_subbufs × subbuf_size × possible CPUs). The BPF
// rings (--ring-size per CPU) are mapped into the process too and count
// in its RSS as the consumer touches them.
func BenchmarkPeakRSS(b *testing.B) {
	testenv.RequireRoot(b)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		subbuf string
		size   int
		n      int
	}{{"256K", 256 << 10, 8}, {"1M", 1 << 20, 16}, {"4M", 4 << 20, 16}} {
		b.Run(fmt.Sprintf("%sx%d", c.subbuf, c.n), func(b *testing.B) {
			bin := testenv.KconsumeBin(b)
			var peak int64
			for range b.N {
				cmd := exec.Command(bin, "record", "-q", "-e", "syscalls:sys_enter_getpid", "--mode", "overwrite",
					"--subbuf-size", c.subbuf, "--n-subbufs", fmt.Sprint(c.n), "--duration", "3s", "-o", filepath.Join(b.TempDir(), "t"))
				var out strings.Builder
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				var stop atomic.Bool
				var wg sync.WaitGroup
				for range runtime.NumCPU() {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for !stop.Load() {
							unix.Getpid()
						}
					}()
				}
				err := cmd.Wait()
				stop.Store(true)
				wg.Wait()
				if err != nil {
					b.Fatalf("record: %v\n%s", err, out.String())
				}
				peak = max(peak, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) // KiB
			}
			bufs := float64(c.size*c.n*ncpu) / (1 << 20)
			b.ReportMetric(float64(peak)/1024, "peak-MiB")
			b.ReportMetric(bufs, "buffers-MiB")
			b.ReportMetric(float64(peak)/1024-bufs, "excess-MiB")
		})
	}
}

// BenchmarkStartStop runs `kconsume record -e EVENTS --duration 1s` and
// reports the wall time of the whole command over the 1 s it records:
// what starting (resolving the events, writing the metadata, loading and
// attaching) and stopping (detaching, flushing) cost. syscalls:* declares
// some 700 event classes and, where the raw syscall path cannot take a
// syscall (newer than its table), attaches its tracepoints one by one
// (and detaches them, each waiting for an RCU grace period).
func BenchmarkStartStop(b *testing.B) {
	testenv.RequireRoot(b)
	for _, c := range []struct{ name, events string }{{"syscalls", "syscalls:*"}, {"sched_switch", "sched:sched_switch"}} {
		b.Run(c.name, func(b *testing.B) {
			bin := testenv.KconsumeBin(b)
			var total time.Duration
			for range b.N {
				cmd := exec.Command(bin, "record", "-q", "-e", c.events, "--duration", "1s", "-o", filepath.Join(b.TempDir(), "t"))
				var out strings.Builder
				cmd.Stdout, cmd.Stderr = &out, &out
				t0 := time.Now()
				if err := cmd.Run(); err != nil {
					b.Fatalf("record: %v\n%s", err, out.String())
				}
				total += time.Since(t0) - time.Second
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "over-s")
		})
	}
}

// BenchmarkIdle records sched:sched_switch for 5 s on a machine left to
// itself, with kconsume and with trace-cmd in turn in each iteration,
// and reports for each what it adds to what it watches: the context
// switches of its own threads in its trace (prev_comm or next_comm its
// own name) per second, and its own context switches as the kernel
// counted them (voluntary and involuntary, with its reaped children:
// trace-cmd's per-CPU recorders) per second. A recorder that sleeps
// while nothing needs it adds a few at its start and its end.
func BenchmarkIdle(b *testing.B) {
	testenv.RequireRoot(b)
	tc, err := exec.LookPath("trace-cmd")
	if err != nil {
		testenv.Missing(b, "trace-cmd is required (apt-get install trace-cmd): %v", err)
	}
	bin := testenv.KconsumeBin(b)
	restore := testenv.SaveTracing(b)
	defer restore()
	const secs = 5
	var kcOwn, tcOwn, kcCS, tcCS, kcEvents, tcEvents float64
	for range b.N {
		dir := filepath.Join(b.TempDir(), "t")
		kc := exec.Command(bin, "record", "-q", "-e", "sched:sched_switch", "--duration", fmt.Sprintf("%ds", secs), "-o", dir)
		if out, err := kc.CombinedOutput(); err != nil {
			b.Fatalf("kconsume record: %v\n%s", err, out)
		}
		kcCS += switches(kc.ProcessState)
		out, err := exec.Command(bin, "report", "--trace-seconds", dir).Output()
		if err != nil {
			b.Fatalf("kconsume report: %v", err)
		}
		own, n := countOwn(string(out), regexp.MustCompile(`(prev|next)_comm="`+regexp.QuoteMeta(comm(bin))+`" `))
		kcOwn, kcEvents = kcOwn+own, kcEvents+n

		dat := filepath.Join(b.TempDir(), "trace.dat")
		// -d: no function tracer, which Debian's kernels here refuse.
		t := exec.Command(tc, "record", "-d", "--no-filter", "-o", dat, "-e", "sched:sched_switch", "sleep", fmt.Sprint(secs))
		if out, err := t.CombinedOutput(); err != nil && !strings.Contains(string(out), "data recorded") {
			b.Fatalf("trace-cmd record: %v\n%s", err, out)
		}
		tcCS += switches(t.ProcessState)
		out, err = exec.Command(tc, "report", "-i", dat).Output()
		if err != nil {
			b.Fatalf("trace-cmd report: %v", err)
		}
		// trace-cmd prints a switch as "prev:pid [prio] S ==> next:pid [prio]".
		own, n = countOwn(string(out), regexp.MustCompile(`(^|\s)trace-cmd:\d+ \[`))
		tcOwn, tcEvents = tcOwn+own, tcEvents+n
	}
	per := float64(b.N) * secs
	b.ReportMetric(kcOwn/per, "kconsume-own/s")
	b.ReportMetric(tcOwn/per, "trace-cmd-own/s")
	b.ReportMetric(kcCS/per, "kconsume-cs/s")
	b.ReportMetric(tcCS/per, "trace-cmd-cs/s")
	b.ReportMetric(kcEvents/per, "kconsume-events/s")
	b.ReportMetric(tcEvents/per, "trace-cmd-events/s")
}

// comm returns the task name the kernel gives a program run from path.
func comm(path string) string {
	c := filepath.Base(path)
	if len(c) > 15 {
		c = c[:15]
	}
	return c
}

// countOwn counts, in a text report, the sched_switch lines in whose
// event text (after "sched_switch:") own matches, and all of them.
func countOwn(report string, own *regexp.Regexp) (mine, all float64) {
	for _, l := range strings.Split(report, "\n") {
		_, ev, ok := strings.Cut(l, "sched_switch:")
		if !ok {
			continue
		}
		all++
		if own.MatchString(ev) {
			mine++
		}
	}
	return mine, all
}

// switches returns the context switches of a finished command and its
// reaped children.
func switches(ps *os.ProcessState) float64 {
	ru := ps.SysUsage().(*syscall.Rusage)
	return float64(ru.Nvcsw + ru.Nivcsw)
}
