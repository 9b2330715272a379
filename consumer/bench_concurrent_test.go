package consumer

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/perf"
	ciliumrb "github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/relayfmt"
)

// BenchmarkConcurrent runs the producer at full speed on CPU 1 for b.N
// milliseconds while a consumer on CPU 0 reads: kconsume's own drainer
// (epoll, watermark wakeups, latency tick, transcoding into relayfmt)
// against cilium/ebpf's ringbuf.Reader (Read, ReadInto) and, for the perf
// transport, perf.Reader. Reported: records delivered per second, the
// share lost in the kernel (ring full), and the consumer thread's CPU use
// as a share of one core.
func BenchmarkConcurrent(b *testing.B) {
	if runtime.NumCPU() < 2 {
		b.Skip("needs 2 CPUs")
	}
	for _, payload := range []int{32, 64, 256} {
		for _, rd := range []string{"kconsume", "cilium-ReadInto", "cilium-Read"} {
			b.Run(fmt.Sprintf("%s/%dB", rd, payload), func(b *testing.B) { benchConcurrent(b, Ringbuf, payload, rd) })
		}
	}
	for _, rd := range []string{"kconsume-perf", "cilium-perf.Reader"} {
		b.Run(rd+"/64B", func(b *testing.B) { benchConcurrent(b, Perf, 64, rd) })
	}
}

func benchConcurrent(b *testing.B, tr Transport, payload int, reader string) {
	const ring = 8 << 20
	own := reader == "kconsume" || reader == "kconsume-perf"
	r := newRig(b, tr, payload, ring, relayfmt.Overwrite, nil, own)
	var read uint64
	var next func() error
	// flush, where set, makes the reader hand over what is left once the
	// producer stopped: perf.Reader is woken only at its watermark, and
	// the records below it would otherwise stay unread.
	var flush func() error
	if !own {
		if tr == Perf {
			// perf.Reader opens its own perf events into the array.
			for _, st := range r.s.dr.streams {
				st.src.close()
			}
			rd, err := perf.NewReaderWithOptions(r.s.rec.Collection().Maps[gen.PerfMapKcPerf], ring, perf.ReaderOptions{Watermark: ring / 4})
			if err != nil {
				b.Fatal(err)
			}
			defer rd.Close()
			var rec perf.Record
			flush = rd.Flush
			next = func() error {
				rd.SetDeadline(time.Now().Add(10 * time.Millisecond))
				return rd.ReadInto(&rec)
			}
		} else {
			rd, err := ciliumrb.NewReader(r.s.rec.Ring(1))
			if err != nil {
				b.Fatal(err)
			}
			defer rd.Close()
			var rec ciliumrb.Record
			next = func() error {
				rd.SetDeadline(time.Now().Add(10 * time.Millisecond))
				if reader == "cilium-Read" {
					_, err := rd.Read()
					return err
				}
				return rd.ReadInto(&rec)
			}
		}
	}
	var stop, produced atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer produced.Store(true)
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(1)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- err
			return
		}
		if tr == Ringbuf {
			_ = r.n.Set(uint32(1 << 16))
		}
		for !stop.Load() {
			if _, err := r.prog.Run(&ebpf.RunOptions{}); err != nil {
				errc <- err
				return
			}
		}
	}()
	// The consumer on CPU 0, the producer on CPU 1: a consumer woken onto
	// the producer's CPU would wait out a whole bpf_loop run, which keeps
	// preemption off for milliseconds.
	var cpu time.Duration
	var readerDone chan struct{}
	var tid int // the drainer's thread
	if own {
		tid = pinDrainer(b, r.s, 0)
	} else {
		readerDone = make(chan struct{})
		go func() {
			defer close(readerDone)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(0)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errc <- err
				return
			}
			c0 := threadCPU()
			defer func() { cpu = threadCPU() - c0 }()
			for {
				err := next()
				switch {
				case err == nil:
					read++
				case errors.Is(err, os.ErrDeadlineExceeded):
					if !produced.Load() {
						break
					}
					if flush == nil {
						return // producer stopped and the ring is empty
					}
					if err := flush(); err != nil {
						errc <- err
						return
					}
					flush = nil
				case errors.Is(err, perf.ErrFlushed):
					return // the records left below the watermark, read
				default:
					errc <- err
					return
				}
			}
		}()
	}
	cpu0 := threadCPUTime(tid)
	start := time.Now()
	time.Sleep(time.Duration(b.N) * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if own {
		if err := r.s.Flush(); err != nil {
			b.Fatal(err)
		}
		cpu = threadCPUTime(tid) - cpu0
		for cpu := 0; cpu < r.s.ncpu; cpu++ {
			cs, _ := r.s.ch.StatsCPU(cpu)
			read += cs.Records
		}
	} else {
		<-readerDone
	}
	elapsed := time.Since(start)
	select {
	case err := <-errc:
		b.Fatal(err)
	default:
	}
	lost, emitted := r.lost()
	b.ReportMetric(float64(read)/elapsed.Seconds(), "rec/s")
	b.ReportMetric(100*float64(lost)/float64(max(emitted+lost, 1)), "lost-%")
	b.ReportMetric(100*cpu.Seconds()/elapsed.Seconds(), "consumer-%cpu")
	if own {
		// How much later than it asked to the drainer ran, at worst: a
		// loss with an overrun near the ring's span is the host's.
		b.ReportMetric(float64(r.s.Drainer().LongestOverrun)/1e6, "overrun-ms")
	}
	if read != emitted {
		b.Fatalf("read %d records, the producer emitted %d", read, emitted)
	}
}
