package consumer

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kconsume/kconsume/consumer/recorder"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/internal/epoll"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/clock"
)

// drainer decides when to read the rings and reads them: one goroutine
// sleeps in epoll until a producer crosses the watermark, a command
// arrives or the latency tick passes, then drains every stream's source
// through the writer, places the losses the accounting reports and, for
// local files, writes the finished packets at the end of the pass.
// Commands (flush, reset, stats …) run on it through do, since the
// channel's writer state lives there.
type drainer struct {
	w       *writer
	rec     *recorder.Recorder
	keep    *crashKeep // what a kill leaves for recover (crash.go)
	loss    *losses
	poll    *epoll.Poller
	streams []*stream
	perf    *perfCPUs  // the perf transport's CPUs; nil with ring buffers
	trig    *trigWatch // the snapshot triggers' doorbell (trigger.go); nil without

	latency   time.Duration
	watermark uint64
	window    uint64 // reorder window in ns
	clockID   int32

	cmds       chan command
	activity   chan struct{} // a pass for data, not for a command, ran
	done       chan struct{}
	loopErr    error
	looping    atomic.Bool
	counts     drainerCounts
	lastMissed time.Time
	rot        rotation
	// nudge, when set, is called after a pass woken by a ring, at most
	// once a userSavePeriod (lastNudge): the user symbols' saver checks
	// for processes new to the user call chains.
	nudge     func()
	lastNudge time.Time
}

type command struct {
	fn    func() error
	reply chan error
}

// newDrainer returns a drainer of a stream per CPU (one in global mode)
// whose sources are the recorder's rings, created and mapped here, and
// watched by its poller. It fails with the kernel's error, having
// released what it made.
func newDrainer(cfg Config, rec *recorder.Recorder, clockID int32) (_ *drainer, err error) {
	d := &drainer{
		rec:       rec,
		keep:      new(crashKeep),
		latency:   cfg.Latency,
		rot:       rotation{size: cfg.RotateSize, period: cfg.RotateInterval, trig: cfg.rotates()},
		watermark: uint64(cfg.Watermark),
		window:    uint64(cfg.ReorderWindow),
		clockID:   clockID,
		cmds:      make(chan command, 1),
		activity:  make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.poll, err = epoll.New(); err != nil {
		return nil, err
	}
	nstreams := rec.CPUs()
	if cfg.Global {
		nstreams = 1
	}
	for i := 0; i < nstreams; i++ {
		d.streams = append(d.streams, &stream{idx: i, src: noSource{}, win: newWindow(cfg.ReorderMax), cps: newCheckpoints(cfg.ReorderMax), scratch: make([]byte, 0, tracefs.MaxRecordSize*2)})
	}
	if rec.Transport() == Perf {
		if cfg.Global {
			return nil, fmt.Errorf("%w: global mode needs the ringbuf transport", ErrConfig)
		}
		return d, d.openPerf(cfg.RingSize, cfg.Watermark, cfg.Latency)
	}
	for i, st := range d.streams {
		m, err := rec.NewRing(i)
		if err != nil {
			return nil, err
		}
		r, err := newRingbuf(m.FD(), rec.RingSize())
		if err != nil {
			return nil, err
		}
		switch {
		case rec.On(recorder.PathPackets):
			st.bell = r
			p := newPktRing(rec, d.keep, i, clockID)
			st.src, st.data = p, p.data
		case rec.On(recorder.PathOwnRings):
			st.bell, r = r, newAreaRing(rec, d.keep, i)
			fallthrough
		default:
			st.src, st.data = r, r.data
		}
		if err := d.poll.Add(m.FD(), int32(i)); err != nil {
			return nil, err
		}
	}
	return d, d.watchTriggers(rec)
}

// setWriter makes w the writer of every stream, and of the notices the
// accounting of losses places.
func (d *drainer) setWriter(w *writer) {
	d.w = w
	d.loss = newLosses(w, d.rec.CPUs(), d.rec.Filtered(), d.rec.KernelLost)
}

// start runs the drainer goroutine.
func (d *drainer) start() {
	d.looping.Store(true)
	go d.loop()
}

// running reports whether the drainer goroutine runs.
func (d *drainer) running() bool {
	select {
	case <-d.done:
		return false
	default:
		return d.looping.Load()
	}
}

// do runs fn on the drainer goroutine, where the channel's writer state
// lives, and returns its error, or ErrClosed once the drainer has ended.
// A nil fn ends the drainer.
func (d *drainer) do(fn func() error) error {
	c := command{fn: fn, reply: make(chan error, 1)}
	// d.cmds holds one command, so the send completes while the drainer
	// sleeps and the wake below rouses it; unbuffered, the send would
	// wait for the drainer's next latency tick.
	select {
	case d.cmds <- c:
	case <-d.done:
		return ErrClosed
	}
	d.poll.Wake()
	// The buffered send also succeeds after the drainer has returned,
	// which then never replies.
	select {
	case err := <-c.reply:
		return err
	case <-d.done:
		select {
		case err := <-c.reply:
			return err
		default:
			return ErrClosed
		}
	}
}

// loop is the drainer goroutine. It sleeps in epoll until a producer
// wakes it (the watermark, or with a latency bound the first record of
// another process), a command arrives or its timer ends, then drains
// every ring. The timer runs only while data is known to wait: after a
// producer's first-record wakeup, until the latency has passed since that
// record, and after a pass that left records in a reorder window, until
// the window has passed. With no data waiting it sleeps without a
// timeout, so an idle machine does not see it run.
func (d *drainer) loop() {
	defer close(d.done)
	// Not locked to a thread: the drainer parks in the netpoller, and a
	// locked goroutine woken there costs two thread handoffs per wakeup
	// (the poller's thread hands its P to the locked one and sleeps, and
	// the locked one hands it back when it parks again): 700 of the
	// recorder's 1,500 futex calls in a saturating hackbench at --memory
	// 1408K. Tests that place the drainer lock it themselves.
	events := make([]unix.EpollEvent, len(d.streams)+3)
	ids := make([]int32, 0, len(events))
	woke := make([]uint64, 2*d.rec.CPUs()) // the writers' last wakeups seen
	var st passState
	var done []reply // commands run, to answer once re-armed
	timeout := d.sleep(st)
	for {
		t0 := time.Now()
		var err error
		ids, err = d.poll.Wait(events, ids, timeout)
		now := time.Now()
		if timeout > 0 {
			d.counts.ran(now.Sub(t0)-timeout, d.lateness())
		}
		if timeout != 0 {
			d.rec.Disarm()
		}
		if err != nil {
			d.loopErr = err
			return
		}
		fromRing, command := d.woken(ids, woke, now)
		d.pass(&st, now, fromRing, timeout > 0 && !command)
		if fromRing && d.nudge != nil && now.Sub(d.lastNudge) >= userSavePeriod {
			d.lastNudge = now
			d.nudge()
		}
		d.triggered()
		var end bool
		done, end = d.runCommands(done[:0])
		// Armed before the answers go out: a caller that writes records
		// right after its answer (Stats, Flush) must find the writers
		// told to wake the drainer.
		if !end {
			// The packets this pass finished go out back to back at
			// its end, just before the drainer sleeps, so the
			// runtime's monitor, woken by the first write, finds it
			// asleep at its next look (relayfmt.Channel.Commit). A
			// pass that drains again at once writes them too: while it
			// goes on the monitor is awake anyway, and a killed
			// recorder loses at most a pass's packets.
			d.w.ch.Commit()
			d.checkSize()
			timeout = d.sleep(st)
		}
		for _, r := range done {
			r.c <- r.err
		}
		if end {
			return
		}
	}
}

// passState is what one pass of the drainer's loop leaves the next: by
// when waiting data must be drained (zero: no deadline), and whether a
// ring still holds a watermark's worth, to drain again at once.
type passState struct {
	deadline time.Time
	more     bool
	// blocked: a stream's packets wait for a remote sink's sub-buffer
	// (stream.blocked).
	blocked bool
}

// woken reads what the poller's ids say woke the drainer: a ring's
// writers (fromRing), a command, or the perf transport's CPU hotplug;
// it also runs the periodic checks (hotplug, recursion misses) that are
// due at now.
func (d *drainer) woken(ids []int32, woke []uint64, now time.Time) (fromRing, command bool) {
	for _, id := range ids {
		switch {
		case id == epoll.WakeID:
			command = true
		case id >= 0 && int(id) < len(d.streams):
			d.streams[id].wakeups++
			fromRing = true
		case d.trig != nil && id == d.trig.id:
			d.trig.due = true
		case d.perf != nil && id == d.perf.id && d.perf.cpuEvent():
			if err := d.checkHotplug(); err != nil {
				d.loopErr = err
			}
		}
	}
	if fromRing {
		d.producerLateness(woke)
	}
	if d.perf != nil && d.perf.polled && now.Sub(d.perf.checked) > hotplugPeriod {
		if err := d.checkHotplug(); err != nil {
			d.loopErr = err
		}
	}
	if now.Sub(d.lastMissed) > missedPeriod {
		d.lastMissed = now
		d.placeMissed()
	}
	return fromRing, command
}

// pass drains the rings, or waits for more, as st, what woke the
// drainer (fromRing; timer, a sleep that ended without a command) and
// the rings' fill decide, and updates st.
func (d *drainer) pass(st *passState, now time.Time, fromRing, timer bool) {
	over := d.overWatermark()
	switch {
	case !st.blocked && fromRing && st.deadline.IsZero() && d.latency > 0 && !over:
		// The first record of another process: pick it up, and
		// whatever follows it, within the latency.
		st.deadline, st.more = now.Add(d.latency), false
	case !st.blocked && !st.deadline.IsZero() && now.Before(st.deadline) && !fromRing && !over:
		// A command woke us before the deadline: keep waiting.
		st.more = false
	default:
		// A ring still holding a watermark (with a latency bound, a
		// good part of one) is drained again at once (drainAll).
		st.more, st.blocked = d.drainAll(d.cutoff())
		if fromRing || timer {
			select {
			case d.activity <- struct{}{}:
			default:
			}
		}
		st.deadline = time.Time{}
		if d.latency > 0 && d.windowsWait() {
			st.deadline = now.Add(max(time.Duration(d.window), time.Millisecond))
		}
	}
}

// runCommands runs the commands waiting, appending their answers to
// done, and reports end when one asked the loop to end.
func (d *drainer) runCommands(done []reply) (_ []reply, end bool) {
	for {
		select {
		case c := <-d.cmds:
			if c.fn == nil {
				return append(done, reply{c.reply, nil}), true
			}
			done = append(done, reply{c.reply, c.fn()})
		default:
			return done, false
		}
	}
}

// reply is a command's answer waiting to be sent.
type reply struct {
	c   chan error
	err error
}

// sleep returns how long the drainer may sleep next, and arms the
// writers to wake it when it is to sleep: they are armed first and the
// rings looked at after, so that a ring that crossed the watermark while
// they were not armed is drained at once, not left until the next one.
func (d *drainer) sleep(st passState) time.Duration {
	if st.blocked && !st.more {
		// Not armed: the writers would wake the drainer for packets it
		// cannot take until the sink frees a sub-buffer, and a ring
		// over the watermark would have it drain again at once. It
		// spun so, a core's worth, while relayd wrote the last packets
		// (BENCHMARKS.md). The channel wakes it when a sub-buffer frees
		// (relayfmt.Config.Room); roomPoll bounds the wait.
		if t := d.timeout(false, st.deadline); t > 0 && t < roomPoll {
			return t
		}
		return roomPoll
	}
	timeout := d.timeout(st.more, st.deadline)
	if timeout != 0 {
		d.rec.Arm(d.latency > 0 && st.deadline.IsZero())
		if d.overWatermark() {
			return 0
		}
	}
	return timeout
}

// timeout returns how long the drainer may sleep: not at all when a ring
// still holds data, until the deadline when data waits, a perf tick (the
// latency bound, or the hotplug poll), or -1, for as long as nothing
// wakes it.
func (d *drainer) timeout(more bool, deadline time.Time) time.Duration {
	switch {
	case more:
		return 0
	case !deadline.IsZero():
		return max(time.Until(deadline), time.Nanosecond)
	case d.perf != nil && d.perf.tick > 0:
		return d.perf.tick
	}
	return -1
}

// overWatermark reports whether a ring holds a watermark or more.
func (d *drainer) overWatermark() bool {
	for _, st := range d.streams {
		if st.src.waiting() >= d.watermark {
			return true
		}
	}
	return false
}

// windowsWait reports whether records wait in a reorder window.
func (d *drainer) windowsWait() bool {
	for _, st := range d.streams {
		if st.win.n > 0 {
			return true
		}
	}
	return false
}

// lateness is how late past its time a run of the drainer counts as late.
func (d *drainer) lateness() time.Duration {
	if d.latency > 0 {
		return d.latency
	}
	return defaultLateness
}

// roomPoll bounds the drainer's sleep while packets wait for a remote
// sink's sub-buffer: the sink frees one within a packet's send, or has
// failed and never will (the packets then wait in the ring for Close).
const roomPoll = 50 * time.Millisecond

// defaultLateness is lateness without a latency bound.
const defaultLateness = time.Millisecond

// producerLateness counts how long after the writers' newest wakeups the
// drainer ran, from the times they left in woke (seen so far, per slot).
func (d *drainer) producerLateness(woke []uint64) {
	now, ok := clock.Now(unix.CLOCK_MONOTONIC)
	if !ok {
		return
	}
	for slot := range woke {
		w := d.rec.WokeAt(slot)
		if w == woke[slot] {
			continue
		}
		woke[slot] = w
		if w != 0 && now > w {
			d.counts.ran(time.Duration(now-w), d.lateness())
		}
	}
}

// missedPeriod is how often the recorder programs' recursion misses are
// read: one syscall per program, and before 5.15 there is a program per
// event. Flush and Close read them too.
const missedPeriod = time.Second

// cutoff returns the time before which waiting records are written: now
// minus the reorder window, on the records' clock.
func (d *drainer) cutoff() uint64 {
	now, ok := clock.Now(d.clockID)
	if !ok || now < d.window {
		return 0
	}
	return now - d.window
}

// drainAll drains every stream's source and writes out the waiting
// records stamped before cutoff. It reports whether a source still holds
// the wakeup watermark or more, or with a latency bound an eighth of it:
// then the drainer drains again at once instead of sleeping; and whether
// such a stream's packets wait for a free sub-buffer of a remote sink
// (blocked): then it drains again when the channel says one freed
// (sleep), not at once.
//
// Without a bound, what is left below the watermark waits for the
// writers to wake the drainer at the watermark, as they do whenever the
// unread data reaches it while the drainer sleeps (kc_area_wake,
// kc_wakeup_flags test the fill, not a crossing; perf wakes after a
// watermark's more data). Draining again at an eighth, as it once did,
// kept the drainer spinning over small batches under a saturating load:
// at nice -20 it took the CPU from the traced tasks, with a 1 MiB ring
// (--memory 1408K) hackbench ran 0.77 to 0.88 s instead of 0.50 to 0.63,
// and the rings, drained in pieces while the producers outran it, lost
// up to a third of the events instead of none (BENCHMARKS.md,
// 2026-11-26, 38ca4e7).
// With a bound, records left behind by a drain would otherwise wait past
// it for the next record of another process.
func (d *drainer) drainAll(cutoff uint64) (more, blocked bool) {
	again := d.watermark
	if d.latency > 0 {
		again /= 8
	}
	for _, st := range d.streams {
		if st.bell != nil {
			st.bell.skipAll() // what rang it is what the drain reads
		}
		st.src.drain(d.w, d.loss, st, cutoff)
		switch {
		case st.src.waiting() < again:
			// Left for the writers' wakeup, room or not.
		case st.blocked:
			blocked = true
		default:
			more = true
		}
	}
	return more, blocked
}

// flushAll drains everything and places the misses counted so far.
func (d *drainer) flushAll() {
	d.placeMissed()
	d.drainAll(^uint64(0))
}

// placeMissed places the recorder runs the kernel skipped since the last
// call that were events lost.
func (d *drainer) placeMissed() {
	all, lost := d.rec.Missed()
	d.loss.placeMissed(d.streams[0], all, lost)
	d.keep.placed(0, d.loss.missedPlaced)
}

// close releases the sources and the poller; the goroutine must have
// ended or never run.
func (d *drainer) close() {
	for _, st := range d.streams {
		st.src.close()
		if st.bell != nil {
			st.bell.close()
		}
	}
	if d.perf != nil {
		d.perf.close()
	}
	if d.trig != nil {
		d.trig.bell.close()
	}
	if d.poll != nil {
		d.poll.Close()
	}
	d.keep.release()
}
