package consumer

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// BenchmarkDrainPackets measures the drain of a real tracepoint's records
// as a recording takes them (issue 26 item 3): sys_enter_mmap events, a
// 64-byte trace record with six arguments, written by the raw syscall
// program into packet-mode rings, where BPF builds each CTF event in its
// packet and the consumer hands complete packets to the channel without
// reading a record. Two sinks: "discard" drops the packets, so the row is
// the consumer's own work; "file" writes them into trace files under the
// test's temporary directory (the page cache), as a recording does, and
// each round also writes the same ring elements with plain write(2)
// calls into another file there: the floor-ratio metric is the drain's
// CPU time over that floor's. (Packet mode is not taken in
// overwrite mode, BenchmarkDrain's rows' mode.)
//
// Each round a child pinned to CPU 0 makes failing mmap calls until CPU
// 0's ring is about three quarters full; then the drainer's own
// goroutine, kept from draining while they are made, drains the ring
// once. Figures are records per second of drain time and CPU ns per
// record of the draining thread; the fill is not timed.
func BenchmarkDrainPackets(b *testing.B) {
	b.Run("discard", func(b *testing.B) { benchPacketDrain(b, &relayfmt.DiscardSink{}, "") })
	b.Run("file", func(b *testing.B) {
		dir := b.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "trace"), 0o755); err != nil {
			b.Fatal(err)
		}
		sink, err := relayfmt.NewDirSink(filepath.Join(dir, "trace"))
		if err != nil {
			b.Fatal(err)
		}
		benchPacketDrain(b, sink, filepath.Join(dir, "floor"))
	})
}

// benchPacketDrain is BenchmarkDrainPackets into sink; with floor set, it
// also times plain writes of the drained bytes to that file.
func benchPacketDrain(b *testing.B, sink relayfmt.Sink, floor string) {
	testenv.RequireRoot(b)
	if !areaExpected(b) {
		b.Skip("packet mode needs kc_area rings: amd64 and Linux 5.12+")
	}
	s, err := New(Config{Events: []string{"syscalls:sys_enter_mmap"}, Sink: sink,
		SubbufSize: 256 << 10, NSubbufs: 4, RingSize: benchRing, Syscalls: SyscallsRaw})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Packets(); err != nil {
		b.Fatalf("packet mode not used: %v", err)
	}
	p, ok := s.dr.streams[0].src.(*pktRing)
	if !ok {
		b.Fatalf("CPU 0's source is a %T", s.dr.streams[0].src)
	}
	var f *os.File
	if floor != "" {
		if f, err = os.Create(floor); err != nil {
			b.Fatal(err)
		}
		defer f.Close()
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	// A 64-byte trace record loses its 8-byte common header in the
	// packet and gains the CTF event header: under 80 bytes an event.
	n := benchRing * 3 / 4 / 80
	var wall, cpu, floorCPU time.Duration
	var records, packets uint64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		c := startChild(b, "syscalls", n, "KC_CHILD_CPU=0")
		err := s.dr.do(func() error {
			// Thread CPU time needs the goroutine to stay on its thread
			// (the calls nest, should the drainer hold its own).
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := c.finish(); err != nil {
				return err
			}
			// The floor writes the same ring elements, before the drain
			// in even rounds and after it in odd ones, so that neither
			// always finds them in the cache.
			cons, k := p.cons, p.waiting()/p.esize
			writeFloor := func() error {
				c0 := threadCPU()
				for j := range k {
					o := (cons + j*p.esize) & p.mask
					if _, err := f.Write(p.data[o : o+p.esize]); err != nil {
						return err
					}
				}
				floorCPU += threadCPU() - c0
				return nil
			}
			if f != nil && i%2 == 0 {
				if err := writeFloor(); err != nil {
					return err
				}
			}
			got := p.got
			c0, t0 := threadCPU(), time.Now()
			p.drain(s.w, s.dr.loss, s.dr.streams[0], 0)
			wall += time.Since(t0)
			cpu += threadCPU() - c0
			records += p.got - got
			if p.cons-cons != k*p.esize {
				return fmt.Errorf("drained %d packets of the %d complete", (p.cons-cons)/p.esize, k)
			}
			packets += k
			if f != nil && i%2 == 1 {
				return writeFloor()
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	st, err := s.Stats()
	if err != nil {
		b.Fatal(err)
	}
	if st[0].KernelLost != 0 {
		b.Fatalf("%d records lost in CPU 0's ring: the fill is too large", st[0].KernelLost)
	}
	if records < uint64(b.N*n/2) {
		b.Fatalf("drained %d records in %d rounds of %d calls", records, b.N, n)
	}
	b.ReportMetric(float64(records)/wall.Seconds(), "rec/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(records), "cpu-ns/rec")
	b.ReportMetric(float64(records)/float64(packets), "rec/packet")
	if f != nil {
		b.ReportMetric(float64(cpu)/float64(floorCPU), "floor-ratio")
	}
	// The rounds' time is mostly the untimed fill.
	b.ReportMetric(0, "ns/op")
}
