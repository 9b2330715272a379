package consumer

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/consumer/layout"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/perf"
	ciliumrb "github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// rig is a session fed by the bench producer instead of tracepoints: the
// same rings, drain and transcode, one event class of fixed size.
type rig struct {
	s    *Session
	prog *ebpf.Program
	n    *ebpf.Variable
	seq  *ebpf.Variable
}

// newRig loads the bench producer for tr with payload-byte records. The
// drainer goroutine runs only when loop is set; otherwise the caller
// drains with drainAll on its own goroutine.
func newRig(tb testing.TB, tr Transport, payload, ringSize int, mode relayfmt.Mode, sink relayfmt.Sink, loop bool) *rig {
	tb.Helper()
	return newRigCfg(tb, tr, payload, Config{Sink: sink, Mode: mode, SubbufSize: 256 << 10, NSubbufs: 4, RingSize: ringSize, Transport: tr}, loop)
}

// newRigGlobal is a rig in global mode (one ring for all CPUs) writing
// to sink with the drainer running.
func newRigGlobal(tb testing.TB, sink relayfmt.Sink) *rig {
	return newRigCfg(tb, Ringbuf, 64, Config{Sink: sink, Global: true, RingSize: 16 << 20, Transport: Ringbuf}, true)
}

func newRigCfg(tb testing.TB, tr Transport, payload int, cfg Config, loop bool) *rig {
	tb.Helper()
	testenv.RequireRoot(tb)
	var spec *ebpf.CollectionSpec
	var err error
	prog := gen.BenchProgKcBench
	if tr == Perf {
		spec, err = gen.LoadBenchPerf()
		prog = gen.BenchPerfProgKcBenchPerf
	} else {
		testenv.RequireKernel(tb, 5, 17, "the bench producer's bpf_loop")
		spec, err = gen.LoadBench()
	}
	if err != nil {
		tb.Fatal(err)
	}
	if cfg.Sink == nil {
		cfg.Sink = &relayfmt.DiscardSink{}
	}
	if err := cfg.Check(); err != nil {
		tb.Fatal(err)
	}
	s, err := newSession(cfg, 1, &recorder.Options{Spec: spec, Vars: map[string]any{
		gen.BenchVarKcBenchLen: uint32(payload),
		gen.BenchVarKcBenchKey: uint32(0),
	}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	cls, err := s.ch.AddEventClass("bench", []relayfmt.Field{
		relayfmt.ScalarField("seq", relayfmt.U64),
		relayfmt.ArrayField("pad", relayfmt.U8, payload-8),
	})
	if err != nil {
		tb.Fatal(err)
	}
	s.w.setLayout(cls.ID, &layout.Layout{Name: "bench", Fixed: payload, Direct: true})
	if err := s.Start(); err != nil {
		tb.Fatal(err)
	}
	if loop {
		s.dr.start()
	}
	return &rig{s: s, prog: s.rec.Collection().Programs[prog], n: s.rec.Collection().Variables[gen.BenchVarKcBenchN], seq: s.rec.Collection().Variables[gen.BenchVarKcBenchSeq]}
}

// produce writes n records from the calling thread's CPU: one bpf_loop
// run for the ring buffer, one run per record for perf.
func (r *rig) produce(tb testing.TB, n int) {
	if r.s.rec.Transport() == Perf {
		for i := 0; i < n; i++ {
			if _, err := r.prog.Run(&ebpf.RunOptions{}); err != nil {
				tb.Fatal(err)
			}
		}
		return
	}
	for n > 0 {
		k := min(n, 1<<23) // bpf_loop's limit
		if err := r.n.Set(uint32(k)); err != nil {
			tb.Fatal(err)
		}
		if _, err := r.prog.Run(&ebpf.RunOptions{}); err != nil {
			tb.Fatal(err)
		}
		n -= k
	}
}

func (r *rig) lost() (lost, emitted uint64) {
	for cpu := 0; cpu < r.s.ncpu; cpu++ {
		lost += r.s.rec.KernelLost(cpu)
		emitted += r.s.rec.Emitted(cpu)
	}
	return lost, emitted
}

// pinCPU locks the goroutine to its thread and the thread to cpu.
func pinCPU(tb testing.TB, cpu int) {
	tb.Helper()
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		var all unix.CPUSet
		for i := 0; i < runtime.NumCPU(); i++ {
			all.Set(i)
		}
		_ = unix.SchedSetaffinity(0, &all)
		runtime.UnlockOSThread()
	})
}

// recordBytes is a record's footprint in a BPF ring buffer.
func recordBytes(payload int) int { return (rbHdrLen + recHdrLen + payload + 7) &^ 7 }

const benchRing = 4 << 20

// fillCount is how many records a pre-fill writes: 90% of the ring.
func fillCount(payload int) int { return benchRing / recordBytes(payload) * 9 / 10 }

// BenchmarkDrain measures draining a pre-filled ring of 64 B records (and
// 32 and 256) on one core: kconsume's consumer transcoding into relayfmt
// sub-buffers (overwrite mode, in memory) against cilium/ebpf's
// ringbuf.Reader Read and ReadInto loops, which only copy records out.
// Figures are records per second of drain time; the fill is not timed.
func BenchmarkDrain(b *testing.B) {
	for _, payload := range []int{32, 64, 256} {
		k := fillCount(payload)
		b.Run(fmt.Sprintf("kconsume/%dB", payload), func(b *testing.B) {
			benchKconsumeDrain(b, Ringbuf, payload, benchRing, k, drainDirect)
		})
		if payload == 64 {
			// sched_switch's record, 64 bytes in the kernel, is 62 in the
			// ring (layout.RingCut): a footprint of 64-byte records.
			b.Run("kconsume-sched_switch/64B", func(b *testing.B) {
				benchKconsumeDrain(b, Ringbuf, payload-layout.RingCut, benchRing, k, drainSchedSwitch)
			})
			b.Run("kconsume-transcoded/64B", func(b *testing.B) {
				benchKconsumeDrain(b, Ringbuf, payload, benchRing, k, drainTranscoded)
			})
			b.Run("kconsume-adjusted/64B", func(b *testing.B) {
				benchKconsumeDrain(b, Ringbuf, payload, benchRing, k, drainAdjusted)
			})
			b.Run("kconsume-global/64B", func(b *testing.B) {
				benchKconsumeDrain(b, Ringbuf, payload, benchRing, k, drainGlobal)
			})
		}
		for _, mode := range []string{"Read", "ReadInto"} {
			b.Run(fmt.Sprintf("cilium-%s/%dB", mode, payload), func(b *testing.B) {
				pinCPU(b, 0)
				r := newRig(b, Ringbuf, payload, benchRing, relayfmt.Overwrite, nil, false)
				rd, err := ciliumrb.NewReader(r.s.rec.Ring(0))
				if err != nil {
					b.Fatal(err)
				}
				defer rd.Close()
				var rec ciliumrb.Record
				var cpu time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					r.produce(b, k)
					rd.SetDeadline(time.Now().Add(time.Second))
					c0 := threadCPU()
					b.StartTimer()
					for j := 0; j < k; j++ {
						if mode == "Read" {
							rec, err = rd.Read()
						} else {
							err = rd.ReadInto(&rec)
						}
						if err != nil {
							lost, emitted := r.lost()
							b.Fatalf("record %d of %d: %v (emitted %d, lost %d)", j, k, err, emitted, lost)
						}
					}
					b.StopTimer()
					cpu += threadCPU() - c0
					b.StartTimer()
				}
				b.StopTimer()
				reportRate(b, k, cpu)
			})
		}
	}
}

// BenchmarkDrainFloor is the least any consumer of a pre-filled ring of
// 64 B records must do, timed like BenchmarkDrain: walk the records
// (acquire-load each header) and copy each payload behind a 4-byte header
// into a 1 MiB output area, reused in a loop. No reorder window, no class
// check, no packets. It is not a consumer: it bounds what the drain can
// reach on this machine, to set BenchmarkDrain's figures against.
func BenchmarkDrainFloor(b *testing.B) {
	const payload = 64
	pinCPU(b, 0)
	k := fillCount(payload)
	r := newRig(b, Ringbuf, payload, benchRing, relayfmt.Overwrite, nil, false)
	rb := r.s.dr.streams[0].src.(*ringbuf)
	out := make([]byte, 1<<20)
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		r.produce(b, k)
		c0 := threadCPU()
		b.StartTimer()
		prod, off, got := rb.producer(), 0, 0
		for {
			o, n, _, ok := rb.next(prod)
			if !ok {
				break
			}
			rec := rb.data[o : o+n]
			if off+4+payload > len(out) {
				off = 0
			}
			binary.LittleEndian.PutUint32(out[off:], uint32(binary.LittleEndian.Uint64(rec)))
			copy(out[off+4:off+4+payload], rec[recHdrLen:])
			off += 4 + payload
			got++
		}
		rb.release(rb.cons)
		b.StopTimer()
		cpu += threadCPU() - c0
		if got != k {
			b.Fatalf("walked %d records, want %d", got, k)
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportRate(b, k, cpu)
}

// BenchmarkDrainPerf is BenchmarkDrain for the perf transport: kconsume's
// consumer against cilium/ebpf's perf.Reader on a pre-filled perf ring.
func BenchmarkDrainPerf(b *testing.B) {
	const payload = 64
	const ring = 16 << 20
	k := ring / (8 + 4 + recHdrLen + payload + 4) * 9 / 10
	b.Run("kconsume/64B", func(b *testing.B) {
		benchKconsumeDrain(b, Perf, payload, ring, k, drainDirect)
	})
	b.Run("cilium-perf.Reader/64B", func(b *testing.B) {
		pinCPU(b, 0)
		r := newRig(b, Perf, payload, ring, relayfmt.Overwrite, nil, false)
		// perf.Reader opens its own perf events into the array.
		r.s.dr.streams[0].src.close()
		rd, err := perf.NewReaderWithOptions(r.s.rec.Collection().Maps[gen.PerfMapKcPerf], ring, perf.ReaderOptions{Watermark: ring / 4})
		if err != nil {
			b.Fatal(err)
		}
		defer rd.Close()
		var rec perf.Record
		var cpu time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			r.produce(b, k)
			c0 := threadCPU()
			b.StartTimer()
			rd.SetDeadline(time.Now().Add(time.Second))
			for j := 0; j < k; j++ {
				if err := rd.ReadInto(&rec); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cpu += threadCPU() - c0
			b.StartTimer()
		}
		b.StopTimer()
		reportRate(b, k, cpu)
	})
}

// What a drain benchmark's records are like.
const (
	drainDirect      = iota // a class whose payload is the record as it is
	drainTranscoded         // copied in two runs, as a tracepoint with a hole between its fields is
	drainGlobal             // direct, in one ring shared by all CPUs
	drainAdjusted           // drainTranscoded with two 4-byte deltas, as sched_switch under --profile lttng
	drainSchedSwitch        // sched_switch's layout, as layout.New builds it from the running kernel's format
)

// benchKconsumeDrain fills a ring of transport tr with k records of
// payload bytes and drains it with the session's own drain, timing the
// drain only; every record must reach the channel. drainSchedSwitch
// gives the bench class sched_switch's layout, which must be direct: the
// recorder leaves the common fields BPF cannot see out of the ring
// record. drainTranscoded gives it a layout of two runs, as a tracepoint
// with a hole between its fields has (a syscall event through its
// tracepoint: 4 bytes after __syscall_nr), with the bench's output:
// common_type's 2 bytes, then the rest.
func benchKconsumeDrain(b *testing.B, tr Transport, payload, ring, k, variant int) {
	pinCPU(b, 0)
	cfg := Config{Sink: &relayfmt.DiscardSink{}, Mode: relayfmt.Overwrite, SubbufSize: 256 << 10, NSubbufs: 4, RingSize: ring, Transport: tr, Global: variant == drainGlobal}
	r := newRigCfg(b, tr, payload, cfg, false)
	if variant == drainSchedSwitch {
		fs, err := tracefs.Find()
		if err != nil {
			b.Fatal(err)
		}
		f, err := fs.Format(tracefs.Event{System: "sched", Name: "sched_switch"})
		if err != nil {
			b.Fatal(err)
		}
		l, err := layout.New(f, nil)
		if err != nil {
			b.Fatal(err)
		}
		if !l.Direct || l.Fixed != payload {
			b.Fatalf("sched_switch's layout is not %d bytes direct (of a %d-byte trace record): %+v", payload, f.FixedSize(), l)
		}
		r.s.w.setLayout(0, l)
	}
	if variant == drainTranscoded {
		r.s.w.setLayout(0, &layout.Layout{Name: "bench", Fixed: payload, Ops: []layout.Op{{Kind: layout.OpCopy, N: 2}, {Kind: layout.OpCopy, Off: 2, N: payload - 2}}})
	}
	if variant == drainAdjusted {
		// sched_switch's prev_prio and next_prio: at 28 and at the end
		// (lttng-modules' priorities, Config.Adjust).
		r.s.w.setLayout(0, &layout.Layout{Name: "bench", Fixed: payload, Ops: []layout.Op{{Kind: layout.OpCopy, N: 2}, {Kind: layout.OpCopy, Off: 2, N: 30}, {Kind: layout.OpAdd, Off: 4, N: -100}, {Kind: layout.OpCopy, Off: 32, N: payload - 32}, {Kind: layout.OpAdd, Off: 4, N: -100}}})
	}
	st := r.s.dr.streams[0]
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		r.produce(b, k)
		c0 := threadCPU()
		b.StartTimer()
		if tr == Perf {
			st.src.drain(r.s.w, r.s.dr.loss, st, ^uint64(0))
		} else {
			st.src.drain(r.s.w, r.s.dr.loss, st, ^uint64(0))
		}
		b.StopTimer()
		cpu += threadCPU() - c0
		b.StartTimer()
	}
	b.StopTimer()
	reportRate(b, k, cpu)
	if lost, _ := r.lost(); lost != 0 {
		b.Fatalf("%d records lost in the kernel", lost)
	}
	if cs, _ := r.s.ch.StatsCPU(0); cs.Records != uint64(k*b.N) {
		b.Fatalf("channel took %d records, want %d", cs.Records, k*b.N)
	}
}

// reportRate reports records per second of drain time and the consumer
// thread's CPU time per record.
func reportRate(b *testing.B, perIter int, cpu time.Duration) {
	total := float64(perIter) * float64(b.N)
	b.ReportMetric(total/b.Elapsed().Seconds(), "rec/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/rec")
	b.ReportMetric(float64(cpu.Nanoseconds())/total, "cpu-ns/rec")
}

// threadCPU returns the calling thread's CPU time.
func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// pinDrainer locks s's drainer goroutine to the thread it runs on, for
// the rest of its life, binds that thread to cpu and returns its id: a
// test that places the drainer, or reads its CPU time, needs one thread
// to hold it. The drainer runs unlocked otherwise.
func pinDrainer(tb testing.TB, s *Session, cpu int) int {
	tb.Helper()
	var tid int
	err := s.dr.do(func() error {
		runtime.LockOSThread()
		tid = unix.Gettid()
		var set unix.CPUSet
		set.Set(cpu)
		return unix.SchedSetaffinity(0, &set)
	})
	if err != nil {
		tb.Fatalf("pinning the drainer to CPU %d: %v", cpu, err)
	}
	return tid
}

// threadCPUTime returns the CPU time of thread tid of this process so
// far, or 0 when it cannot be read.
func threadCPUTime(tid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", tid))
	if err != nil {
		return 0
	}
	var ns int64
	if _, err := fmt.Sscan(string(b), &ns); err != nil {
		return 0
	}
	return time.Duration(ns)
}

// benchTurn returns KCONSUME_BENCH_TURN when it is a number, else 0:
// where the turning order of a benchmark's tools starts. make bench runs
// one round an invocation and sets it to the round's number, so that the
// order turns from round to round there too.
func benchTurn() int {
	n, _ := strconv.Atoi(os.Getenv("KCONSUME_BENCH_TURN"))
	return max(n, 0)
}

// benchRounds returns KCONSUME_BENCH_ROUNDS when it is a positive
// number, else def: the rounds a benchmark alternating its tools runs.
func benchRounds(def int) int {
	if n, err := strconv.Atoi(os.Getenv("KCONSUME_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return def
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
