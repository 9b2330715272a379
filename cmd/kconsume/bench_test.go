package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
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
