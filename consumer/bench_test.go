package consumer

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/perf"
	ciliumrb "github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

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
	s, err := newSession(cfg, 1, &loadOpts{spec: spec, vars: map[string]any{
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
	s.setLayout(cls.ID, &layout{name: "bench", fixed: payload, direct: true})
	if err := s.Start(); err != nil {
		tb.Fatal(err)
	}
	if loop {
		s.startLoop()
	}
	return &rig{s: s, prog: s.coll.Programs[prog], n: s.coll.Variables[gen.BenchVarKcBenchN], seq: s.coll.Variables[gen.BenchVarKcBenchSeq]}
}

// produce writes n records from the calling thread's CPU: one bpf_loop
// run for the ring buffer, one run per record for perf.
func (r *rig) produce(tb testing.TB, n int) {
	if r.s.transport == Perf {
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
		st := r.s.cpuState(cpu)
		lost += atomic.LoadUint64(&st.Lost)
		emitted += atomic.LoadUint64(&st.Emitted)
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
			benchKconsumeDrain(b, Ringbuf, payload, benchRing, k)
		})
		for _, mode := range []string{"Read", "ReadInto"} {
			b.Run(fmt.Sprintf("cilium-%s/%dB", mode, payload), func(b *testing.B) {
				pinCPU(b, 0)
				r := newRig(b, Ringbuf, payload, benchRing, relayfmt.Overwrite, nil, false)
				rd, err := ciliumrb.NewReader(r.s.rings[0])
				if err != nil {
					b.Fatal(err)
				}
				defer rd.Close()
				var rec ciliumrb.Record
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					r.produce(b, k)
					rd.SetDeadline(time.Now().Add(time.Second))
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
				}
				b.StopTimer()
				reportRate(b, k)
			})
		}
	}
}

// BenchmarkDrainPerf is BenchmarkDrain for the perf transport: kconsume's
// consumer against cilium/ebpf's perf.Reader on a pre-filled perf ring.
func BenchmarkDrainPerf(b *testing.B) {
	const payload = 64
	const ring = 16 << 20
	k := ring / (8 + 4 + recHdrLen + payload + 4) * 9 / 10
	b.Run("kconsume/64B", func(b *testing.B) {
		benchKconsumeDrain(b, Perf, payload, ring, k)
	})
	b.Run("cilium-perf.Reader/64B", func(b *testing.B) {
		pinCPU(b, 0)
		r := newRig(b, Perf, payload, ring, relayfmt.Overwrite, nil, false)
		// perf.Reader opens its own perf events into the array.
		r.s.streams[0].pr.close()
		rd, err := perf.NewReaderWithOptions(r.s.coll.Maps[gen.PerfMapKcPerf], ring, perf.ReaderOptions{Watermark: ring / 4})
		if err != nil {
			b.Fatal(err)
		}
		defer rd.Close()
		var rec perf.Record
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			r.produce(b, k)
			b.StartTimer()
			rd.SetDeadline(time.Now().Add(time.Second))
			for j := 0; j < k; j++ {
				if err := rd.ReadInto(&rec); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.StopTimer()
		reportRate(b, k)
	})
}

// benchKconsumeDrain fills a ring of transport tr with k records of
// payload bytes and drains it with the session's own drain, timing the
// drain only; every record must reach the channel.
func benchKconsumeDrain(b *testing.B, tr Transport, payload, ring, k int) {
	pinCPU(b, 0)
	r := newRig(b, tr, payload, ring, relayfmt.Overwrite, nil, false)
	st := r.s.streams[0]
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		r.produce(b, k)
		b.StartTimer()
		if tr == Perf {
			r.s.drainPerf(st, ^uint64(0))
		} else {
			r.s.drainRingbuf(st, ^uint64(0))
		}
	}
	b.StopTimer()
	reportRate(b, k)
	if lost, _ := r.lost(); lost != 0 {
		b.Fatalf("%d records lost in the kernel", lost)
	}
	if cs, _ := r.s.ch.StatsCPU(0); cs.Records != uint64(k*b.N) {
		b.Fatalf("channel took %d records, want %d", cs.Records, k*b.N)
	}
}

func reportRate(b *testing.B, perIter int) {
	total := float64(perIter) * float64(b.N)
	b.ReportMetric(total/b.Elapsed().Seconds(), "rec/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/rec")
}

// BenchmarkConcurrent runs the producer at full speed on CPU 1 for the
// benchmark's duration while the session's own drainer (epoll, watermark
// wakeups, latency tick) consumes: records/s, records lost, and the
// consumer thread's CPU use as a share of one core.
func BenchmarkConcurrent(b *testing.B) {
	if runtime.NumCPU() < 2 {
		b.Skip("needs 2 CPUs")
	}
	const payload = 64
	r := newRig(b, Ringbuf, payload, 8<<20, relayfmt.Overwrite, nil, true)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	errc := make(chan error, 1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(1)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- err
			return
		}
		_ = r.n.Set(uint32(1 << 16))
		for !stop.Load() {
			if _, err := r.prog.Run(&ebpf.RunOptions{}); err != nil {
				errc <- err
				return
			}
		}
	}()
	// The drainer on CPU 0, the producer on CPU 1: a drainer woken onto
	// the producer's CPU would wait out a whole bpf_loop run, which keeps
	// preemption off for milliseconds.
	waitLoop(b, r.s)
	var c0 unix.CPUSet
	c0.Set(0)
	if err := unix.SchedSetaffinity(int(r.s.loopTID.Load()), &c0); err != nil {
		b.Fatal(err)
	}
	cpu0 := r.s.loopCPUTime()
	start := time.Now()
	_, emitted0 := r.lost()
	time.Sleep(time.Duration(b.N) * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-errc:
		b.Fatal(err)
	default:
	}
	if err := r.s.Flush(); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	lost, emitted := r.lost()
	cpu := r.s.loopCPUTime() - cpu0
	b.ReportMetric(float64(emitted-emitted0)/elapsed.Seconds(), "rec/s")
	b.ReportMetric(float64(lost), "lost")
	b.ReportMetric(100*cpu.Seconds()/elapsed.Seconds(), "consumer-%cpu")
	st, _ := r.s.Stats()
	var wk uint64
	for _, c := range st {
		wk += c.Wakeups
	}
	b.ReportMetric(float64(wk)/elapsed.Seconds(), "wakeups/s")
	var forced uint64
	for cpu := 0; cpu < r.s.ncpu; cpu++ {
		forced += atomic.LoadUint64(&r.s.cpuState(cpu).Wakeups)
	}
	b.ReportMetric(float64(forced)/elapsed.Seconds(), "forced-wakeups/s")
}

// waitLoop waits until the drainer thread has started.
func waitLoop(tb testing.TB, s *Session) {
	for i := 0; s.loopTID.Load() == 0; i++ {
		if i > 1000 {
			tb.Fatal("drainer did not start")
		}
		time.Sleep(time.Millisecond)
	}
}

// loopCPUTime returns the CPU time of the drainer thread so far.
func (s *Session) loopCPUTime() time.Duration {
	tid := s.loopTID.Load()
	if tid == 0 {
		return 0
	}
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

// BenchmarkTracepointCost measures what tracing adds to a traced event: a
// tight getpid loop of b.N calls untraced, under kconsume recording
// syscalls:sys_enter_getpid (no filter, trace to disk), and under
// `trace-cmd record -d --no-filter -e syscalls:sys_enter_getpid`, in
// rounds A/B/C/A/B/C so the machine's noise hits all alike. Reported:
// median ns per call of each and the added cost of kconsume as a ratio of
// trace-cmd's. The host's tracing state is restored after trace-cmd.
func BenchmarkTracepointCost(b *testing.B) {
	testenv.RequireRoot(b)
	tc, err := exec.LookPath("trace-cmd")
	if err != nil {
		testenv.Missing(b, "trace-cmd is required (apt-get install trace-cmd): %v", err)
	}
	restore := saveTracing(b)
	defer restore()
	const rounds = 5
	var base, ours, stopped, theirs []float64
	var lost, kernelLost uint64
	for r := 0; r < rounds; r++ {
		base = append(base, timeGetpid(b.N))

		s, err := New(Config{Events: []string{"syscalls:sys_enter_getpid"}, Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Start(); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, timeGetpid(b.N))
		if err := s.Stop(); err != nil {
			b.Fatal(err)
		}
		stopped = append(stopped, timeGetpid(b.N))
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		st, _ := s.Stats()
		for _, c := range st {
			lost += c.Discarded()
			kernelLost += c.KernelLost
		}

		theirs = append(theirs, withTraceCmd(b, tc, func() float64 { return timeGetpid(b.N) }))
		restore()
	}
	mb, mo, mt := median(base), median(ours), median(theirs)
	b.ReportMetric(mb, "untraced-ns/call")
	b.ReportMetric(mo, "kconsume-ns/call")
	b.ReportMetric(median(stopped), "kconsume-stopped-ns/call")
	b.ReportMetric(mt, "trace-cmd-ns/call")
	b.ReportMetric((mo-mb)/(mt-mb), "added-cost-ratio")
	b.ReportMetric(float64(lost), "kconsume-lost")
	b.ReportMetric(float64(kernelLost), "kconsume-kernel-lost")
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

// withTraceCmd runs fn while trace-cmd records sys_enter_getpid.
func withTraceCmd(b *testing.B, tc string, fn func() float64) float64 {
	b.Helper()
	cmd := exec.Command(tc, "record", "-d", "--no-filter", "-e", "syscalls:sys_enter_getpid", "-o", filepath.Join(b.TempDir(), "trace.dat"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var log strings.Builder
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
		}
	}()
	// trace-cmd's stdout is a pipe, so its "Hit Ctrl^C" line stays in its
	// buffer: wait for the event to be enabled and tracing on instead.
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
			b.Fatalf("trace-cmd did not start:\n%s", log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Its per-CPU recorders start right after.
	time.Sleep(300 * time.Millisecond)
	v := fn()
	_ = cmd.Process.Signal(os.Interrupt)
	<-logDone
	err = cmd.Wait()
	// Debian's trace-cmd exits 1 here after recording, because it cannot
	// open set_ftrace_filter (no function tracer): judge by its report.
	if !strings.Contains(log.String(), "data recorded") {
		b.Fatalf("trace-cmd: %v\n%s", err, log.String())
	}
	return v
}

// saveTracing records the tracefs settings trace-cmd changes and returns
// a function that puts them back.
func saveTracing(b *testing.B) func() {
	b.Helper()
	root := "/sys/kernel/tracing"
	files := []string{"tracing_on", "buffer_size_kb", "current_tracer", "trace_clock"}
	saved := map[string]string{}
	for _, f := range files {
		v, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			b.Fatal(err)
		}
		s := strings.TrimSpace(string(v))
		switch f {
		case "buffer_size_kb":
			s, _, _ = strings.Cut(s, " ") // "7 (expanded: 1408)"
		case "trace_clock":
			if i := strings.Index(s, "["); i >= 0 {
				s = s[i+1 : strings.Index(s, "]")]
			}
		}
		saved[f] = s
	}
	return func() {
		for _, f := range []string{"current_tracer", "trace_clock", "buffer_size_kb", "tracing_on"} {
			if err := os.WriteFile(filepath.Join(root, f), []byte(saved[f]), 0); err != nil {
				b.Errorf("restoring %s: %v", f, err)
			}
		}
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
