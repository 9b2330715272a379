package consumer

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/kconsume/kconsume/consumer/recorder"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/relayfmt"
)

// TestWatermarkWakes checks the batched wakeup with the latency timer out
// of the way (a minute): below the watermark the sleeping consumer is not
// woken; each watermark's worth of records wakes it about once, although
// the producer looks at the ring's fill only every 64th record; and a
// flood that keeps the ring over the watermark does not wake it per pass.
func TestWatermarkWakes(t *testing.T) {
	const ring = 256 << 10
	cfg := Config{Sink: &relayfmt.DiscardSink{}, RingSize: ring, Watermark: ring / 4, Latency: time.Minute, Transport: Ringbuf}
	r := newRigCfg(t, Ringbuf, 64, cfg, true)
	if got := recorder.WakeupMask(r.s.cfg.recorder(), r.s.ncpu); got != 63 {
		t.Fatalf("wakeup mask %d, want 63 for a %d-byte ring", got, ring)
	}
	pinCPU(t, 0)
	// A watermark's worth of records, and one sampling stride more.
	per := ring/4/recordBytes(64) + 64
	wakeups := func() uint64 {
		st, err := r.s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st[0].Wakeups
	}

	// asleep waits until the drainer sleeps again, armed for the next
	// watermark: it arms every writer's slot as it goes to sleep, and a
	// writer that wakes it disarms its own slot, so that every slot
	// armed, once the producer has returned, says the drainer has run
	// for each wakeup and sleeps again. A minute bounds it: a slow guest
	// takes longer than any fixed sleep, and a drainer that never sleeps
	// again is a failure.
	asleep := func(after string) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
			all := true
			for slot := range 2 * r.s.rec.CPUs() {
				if atomic.LoadUint32(&r.s.rec.CPUState(slot).Armed) == 0 {
					all = false
				}
			}
			if all {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the drainer not asleep again a minute after %s", after)
			}
		}
	}

	// The drainer, asleep, answers at once: well short of its latency
	// (a minute), however slow the machine.
	start := time.Now()
	if w := wakeups(); w != 0 || time.Since(start) > cfg.Latency/2 {
		t.Fatalf("first stats took %v and saw %d wakeups: a command must wake the drainer", time.Since(start), w)
	}
	r.produce(t, per/2)
	time.Sleep(100 * time.Millisecond)
	if w := wakeups(); w != 0 {
		t.Fatalf("woken %d times below the watermark", w)
	}
	r.produce(t, per)
	for deadline := time.Now().Add(cfg.Latency / 2); wakeups() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not woken in %v after the ring passed the watermark", cfg.Latency/2)
		}
	}

	const batches = 16
	asleep("the first wakeup")
	before := wakeups()
	for i := range batches {
		// Each batch finds the drainer asleep: woken, drained and armed
		// again. Nothing but the rings wakes it meanwhile (a command,
		// such as Stats, would drain what a batch left and could take
		// its wakeup).
		r.produce(t, per)
		asleep(fmt.Sprintf("batch %d", i))
	}
	if w := wakeups() - before; w < batches/2 || w > 2*batches {
		t.Errorf("%d wakeups for %d batches of a watermark each: want about one per batch", w, batches)
	}

	// A flood: each wakeup needs the drainer asleep, which it is only
	// after a pass left less than an eighth of a watermark unread, and
	// then a watermark unread again: 7/8 of one written per wakeup.
	before = wakeups()
	_, emitted0 := r.lost()
	r.produce(t, 40*per)
	asleep("the flood")
	_, emitted := r.lost()
	written := (emitted - emitted0) * uint64(recordBytes(64))
	w := wakeups() - before
	t.Logf("flood: %d records written, %d wakeups", emitted-emitted0, w)
	if written == 0 {
		t.Fatal("the flood wrote nothing")
	}
	if limit := written/(uint64(cfg.Watermark)*7/8) + 1; w > limit {
		t.Errorf("%d wakeups for %d bytes written: more than %d, a wakeup storm", w, written, limit)
	}
}

// TestCommandAfterClose checks that a command sent to a closed session's
// drainer fails with ErrClosed instead of waiting for a reply that never
// comes, and that a sleeping drainer (latency a minute) answers a command
// at once.
func TestCommandAfterClose(t *testing.T) {
	s, _ := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, Latency: time.Minute})
	start := time.Now()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	// Woken by the command, not by its minute: anything well short of
	// the minute, however slow the machine.
	if d := time.Since(start); d > time.Minute/2 {
		t.Errorf("flush waited %v for a drainer asleep for a minute", d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var err error
		for range 20 {
			if err = s.Flush(); !errors.Is(err, ErrClosed) {
				break
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("flush after close: %v, want ErrClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("flush after close hangs")
	}
}

// TestDrainerLate keeps the drainer off its CPU for a while, as a host
// that does not run a virtual CPU does: a SCHED_FIFO thread spins on the
// one CPU the drainer may use. With a latency bound of 1 ms and the
// context switches of other processes arriving, the drainer sleeps until
// the records that woke it are 1 ms old; held off its CPU, it runs late
// past that, and Drainer must say by how much. The hold is 30 ms, short
// enough not to disturb the tests of other packages running beside this
// one, or twice the longest overrun seen before it, if that is longer.
func TestDrainerLate(t *testing.T) {
	s, _ := newTestSession(t, Config{Events: []string{"sched:sched_switch"}, Latency: time.Millisecond})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	pinDrainer(t, s, 0)
	// Other processes' context switches wake the drainer: keep some
	// coming, for a guest whose own are few. They come from a process
	// that sleeps 5 ms at a time, a switch each: well within a third of
	// any hold, and sparse enough to leave the drainer asleep most of the
	// time. It runs on CPU 1: on CPU 0 the hold would stop it too, and
	// with it the records that wake the drainer while it is held. A
	// child started for each switch (exec of true) costs tens of ms on an
	// emulated guest, so its records may come too far apart for one to
	// arrive early in the hold.
	ticker := tickCPU1(t, 5*time.Millisecond)
	defer ticker()
	var before DrainerStats
	for end := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if before = s.Drainer(); before.Waits > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the drainer has not run for other processes' records in a minute")
		}
	}
	// A busy machine, or a guest whose virtual CPUs its host runs late,
	// makes the drainer late on its own: hold the CPU for longer than
	// that, so that the overrun seen is the hold's.
	hold := max(30*time.Millisecond, 2*before.LongestOverrun)
	if hold > 800*time.Millisecond {
		t.Fatalf("drainer %+v: late by %v with nothing holding its CPU", before, before.LongestOverrun)
	}
	// The drainer may be in a pass, not asleep, when the CPU is taken:
	// then it runs late without a sleep to show it. Try again, with a
	// longer hold each time, which gives a record more time to arrive
	// early in it on a guest whose host runs it late.
	var after DrainerStats
	for try := 0; try < 5; try, hold = try+1, min(hold*3/2, 800*time.Millisecond) {
		w := s.Drainer().Waits
		if err := holdCPU0(hold); err != nil {
			t.Fatalf("holding CPU 0 with a SCHED_FIFO thread: %v", err)
		}
		// Two sleeps ended since w: one ending before the hold began
		// would be the first, so the sleep the hold lengthened has too.
		for end := time.Now().Add(2 * time.Second); s.Drainer().Waits < w+2 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		after = s.Drainer()
		if after.LongestOverrun >= hold*2/3 {
			break
		}
		t.Logf("try %d: CPU 0 held for %v: drainer %+v", try, hold, after)
	}
	if after.LongestOverrun < hold*2/3 || after.Late <= before.Late {
		t.Fatalf("CPU 0 held for %v: drainer %+v, before %+v", hold, after, before)
	}
	if after.Waits <= before.Waits {
		t.Fatalf("drainer waits went from %d to %d", before.Waits, after.Waits)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if final := s.Drainer(); final.LongestOverrun < after.LongestOverrun {
		t.Fatalf("after Close: %+v, before it %+v", final, after)
	}
	t.Logf("CPU 0 held for %v: %+v", hold, after)
}

// holdCPU0 runs a SCHED_FIFO thread on CPU 0 for d, which no thread of
// an ordinary policy can preempt there. The thread is a process of its
// own, this test binary run again (holdChild): in this one the Go
// runtime preempts a goroutine that has run for 10 ms, and a locked
// thread whose goroutine is preempted sleeps until it is scheduled again,
// leaving the CPU to others for a moment in the middle of the hold.
func holdCPU0(d time.Duration) error {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "KC_HOLD_CPU0="+d.String(), "GODEBUG=asyncpreemptoff=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("holding child: %w: %s", err, out)
	}
	return nil
}

// tickCPU1 starts a process that sleeps for d at a time on CPU 1 (or on
// the only CPU) until the returned function stops it: a context switch
// of a process other than the test's every d.
func tickCPU1(t *testing.T, d time.Duration) (stop func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "KC_TICK_CPU1="+d.String())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("ticking child: %v", err)
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// childOnCPU parses a child process's duration argument and locks the
// calling goroutine to its thread on cpu. It returns the duration, and
// an exit status for the child other than 0 when either fails.
func childOnCPU(arg string, cpu int) (time.Duration, int) {
	d, err := time.ParseDuration(arg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 0, 2
	}
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		fmt.Fprintln(os.Stderr, "affinity:", err)
		return 0, 3
	}
	return d, 0
}

// tickChild is tickCPU1's process: it sleeps for the duration in
// KC_TICK_CPU1 in a loop, on CPU 1 when there is one, until killed.
func tickChild(arg string) int {
	cpu := 1
	if runtime.NumCPU() == 1 {
		cpu = 0
	}
	d, code := childOnCPU(arg, cpu)
	if code != 0 {
		return code
	}
	ts := unix.NsecToTimespec(int64(d))
	for {
		// A raw call: the runtime's own sleep would park the thread
		// and wake others of this process, not always on CPU 1.
		unix.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
	}
}

// holdChild is holdCPU0's process: it spins on CPU 0 at SCHED_FIFO for
// the duration in KC_HOLD_CPU0, and returns the exit status. Started with
// asynchronous preemption off, it calls only nosplit functions while it
// spins (the raw clock_gettime system call), so the runtime never stops
// it.
func holdChild(arg string) int {
	d, code := childOnCPU(arg, 0)
	if code != 0 {
		return code
	}
	attr := unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 1}
	attr.Size = uint32(unsafe.Sizeof(attr))
	if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
		fmt.Fprintln(os.Stderr, "SCHED_FIFO:", err)
		return 4
	}
	// No closure for the clock: a call to one may stop at its prologue.
	var ts unix.Timespec
	unix.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ts)), 0)
	for end := ts.Nano() + int64(d); ts.Nano() < end; {
		unix.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ts)), 0)
	}
	return 0
}

// TestLatencyOwnRecordsWakeNothing: with a latency bound, only another
// process's records wake the drainer. The switch that brings one of the
// recorder's threads back from sleep is written by the task switched
// out (the idle task, mostly), and the wakeup of one by its waker (an
// interrupt): counted as foreign, each drain's own switches woke the
// drainer for the next, a drain every latency period with nothing else
// happening. So every writer wakeup needs a record of a process other
// than this one, in which none of its threads is the subject. On a
// quiet machine (a vmtest guest) the loop showed as wakeups well above
// the foreign records; on a busy one the test says little.
func TestLatencyOwnRecordsWakeNothing(t *testing.T) {
	s, dir := newTestSession(t, Config{Events: []string{"sched:sched_switch", "sched:sched_waking"}, Latency: 5 * time.Millisecond})
	if s.Transport() != Ringbuf {
		t.Skip("the perf transport ticks with a latency bound: no wakeup for data (kernels before 5.8)")
	}
	ours := func() map[int64]bool {
		m := map[int64]bool{}
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if tid, err := strconv.ParseInt(e.Name(), 10, 64); err == nil {
				m[tid] = true
			}
		}
		return m
	}
	tids := ours()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for tid := range ours() {
		tids[tid] = true
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	var wakeups uint64
	for _, c := range st {
		wakeups += c.Wakeups
	}
	var foreign, own uint64
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			return
		}
		subject := field(vals, "next_pid")
		if it.Class.Name == "sched:sched_waking" {
			subject = field(vals, "pid")
		}
		if tids[field(vals, "common_pid").Int(0)] || tids[subject.Int(0)] {
			own++
		} else {
			foreign++
		}
	})
	t.Logf("%d writer wakeups; %d foreign records, %d of this process", wakeups, foreign, own)
	if own == 0 {
		t.Fatal("no record of this process's threads: the test saw nothing of what it tests")
	}
	if wakeups > foreign+2 {
		t.Errorf("%d writer wakeups for %d records of other processes: the recorder's own records woke it", wakeups, foreign)
	}
}

// TestPacketsWrittenBeforeSleep checks that the drainer writes the
// packets a pass finished into local files before it sleeps, with no
// flush and no sink goroutine: the files hold them while the drainer
// waits for the next watermark.
func TestPacketsWrittenBeforeSleep(t *testing.T) {
	const subbuf = 16 << 10
	dir := t.TempDir()
	sink, err := relayfmt.NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Sixteen sub-buffers: the records below fill about nine, so none is
	// written for want of room.
	cfg := Config{Sink: sink, RingSize: 256 << 10, SubbufSize: subbuf, NSubbufs: 16, Transport: Ringbuf}
	r := newRigCfg(t, Ringbuf, 64, cfg, true)
	pinCPU(t, 0)
	// Three watermarks' worth: a drain keeps up to a reorder window's
	// records back at a sub-buffer's end, until the next one.
	n := 3 * (cfg.RingSize/4/recordBytes(64) + 64)
	r.produce(t, n)
	wakeups := func() uint64 {
		st, err := r.s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st[0].Wakeups
	}
	// Polled for, a minute at most: a drainer the watermark does not wake
	// sleeps for good (no latency bound), and a slow guest beside another
	// may take seconds.
	for deadline := time.Now().Add(time.Minute); wakeups() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not woken in a minute after the ring passed the watermark")
		}
	}
	// Each record takes 64 bytes of payload and a header in a packet.
	want := int64((n-r.s.cfg.ReorderMax)*64/subbuf-1) * subbuf
	if want < 2*subbuf {
		t.Fatalf("%d records fill less than 2 packets", n)
	}
	// The pass goes on after the wakeup is counted, for longer on an
	// emulated guest beside another: give it time to end, a minute at
	// most, which a drainer that sleeps with the packets unwritten does
	// not reach them in.
	var size int64
	for deadline := time.Now().Add(time.Minute); size < want && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if fi, err := os.Stat(filepath.Join(dir, "trace0")); err == nil {
			size = fi.Size()
		}
	}
	if size < want {
		t.Fatalf("trace0 holds %d bytes a minute after draining %d records began, want at least %d (the finished packets)", size, n, want)
	}
}
