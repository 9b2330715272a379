package consumer

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/internal/epoll"
	"github.com/kconsume/kconsume/consumer/tracefs"
)

// drainer decides when to read the rings and reads them: one goroutine,
// locked to its thread, sleeps in epoll until a producer crosses the
// watermark, a command arrives or the latency tick passes, then drains
// every stream's source through the writer and places the losses the
// accounting reports. Commands (flush, reset, stats …) run on it through
// do, since the channel's writer state lives there.
type drainer struct {
	w       *writer
	rec     *recorder
	loss    *losses
	poll    *epoll.Poller
	streams []*stream
	perf    *perfCPUs // the perf transport's CPUs; nil with ring buffers

	latency   time.Duration
	watermark uint64
	window    uint64 // reorder window in ns
	clockID   int32

	cmds       chan command
	done       chan struct{}
	loopErr    error
	looping    atomic.Bool
	loopTID    atomic.Int32
	counts     drainerCounts
	lastMissed time.Time
}

type command struct {
	fn    func() error
	reply chan error
}

// newDrainer returns a drainer of a stream per CPU (one in global mode)
// whose sources are the recorder's rings, created and mapped here, and
// watched by its poller. It fails with the kernel's error, having
// released what it made.
func newDrainer(cfg Config, rec *recorder, clockID int32) (_ *drainer, err error) {
	d := &drainer{
		rec:       rec,
		latency:   cfg.Latency,
		watermark: uint64(cfg.Watermark),
		window:    uint64(cfg.ReorderWindow),
		clockID:   clockID,
		cmds:      make(chan command, 1),
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
	nstreams := rec.ncpu
	if cfg.Global {
		nstreams = 1
	}
	for i := 0; i < nstreams; i++ {
		d.streams = append(d.streams, &stream{idx: i, src: noSource{}, win: newWindow(cfg.ReorderMax), cps: newCheckpoints(cfg.ReorderMax), scratch: make([]byte, 0, tracefs.MaxRecordSize*2)})
	}
	if rec.transport == Perf {
		if cfg.Global {
			return nil, fmt.Errorf("%w: global mode needs the ringbuf transport", ErrConfig)
		}
		return d, d.openPerf(cfg.RingSize, cfg.Watermark)
	}
	for i, st := range d.streams {
		m, err := rec.newRing(i)
		if err != nil {
			return nil, err
		}
		r, err := newRingbuf(m.FD(), cfg.RingSize)
		if err != nil {
			return nil, err
		}
		st.src, st.data = r, r.data
		if err := d.poll.Add(m.FD(), int32(i)); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// setWriter makes w the writer of every stream, and of the notices the
// accounting of losses places.
func (d *drainer) setWriter(w *writer) {
	d.w = w
	d.loss = newLosses(w, d.rec.ncpu, d.rec.filtered(), d.rec.kernelLost)
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

// loop is the drainer goroutine: it sleeps in epoll until a producer
// crosses the watermark, a command arrives or the latency tick passes,
// then drains every ring.
func (d *drainer) loop() {
	defer close(d.done)
	// One thread keeps the rings' cache lines and gives the drainer's CPU
	// time an owner to measure.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d.loopTID.Store(int32(unix.Gettid()))
	events := make([]unix.EpollEvent, len(d.streams)+1)
	ids := make([]int32, 0, len(events))
	latency := int(d.latency / time.Millisecond)
	timeout := latency
	for {
		t0 := time.Now()
		var err error
		ids, err = d.poll.Wait(events, ids, timeout)
		d.counts.wait(time.Since(t0), time.Duration(timeout)*time.Millisecond, d.latency)
		if err != nil {
			d.loopErr = err
			return
		}
		for _, id := range ids {
			if id >= 0 && int(id) < len(d.streams) {
				d.streams[id].wakeups++
			}
		}
		if d.perf != nil && time.Since(d.perf.checked) > hotplugPeriod {
			if err := d.checkHotplug(); err != nil {
				d.loopErr = err
			}
		}
		if time.Since(d.lastMissed) > missedPeriod {
			d.lastMissed = time.Now()
			d.placeMissed()
		}
		// A ring still holding a good part of a watermark is drained again
		// at once: no new crossing would wake us for it.
		timeout = latency
		if d.drainAll(d.cutoff()) {
			timeout = 0
		} else {
			d.rec.arm()
		}
		for {
			select {
			case c := <-d.cmds:
				if c.fn == nil {
					c.reply <- nil
					return
				}
				c.reply <- c.fn()
				continue
			default:
			}
			break
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
	var ts unix.Timespec
	if err := unix.ClockGettime(d.clockID, &ts); err != nil {
		return 0
	}
	now := uint64(ts.Nano())
	if now < d.window {
		return 0
	}
	return now - d.window
}

// drainAll drains every stream's source and writes out the waiting
// records stamped before cutoff. It reports whether a source still holds
// an eighth of the wakeup watermark or more.
func (d *drainer) drainAll(cutoff uint64) (more bool) {
	for _, st := range d.streams {
		st.src.drain(d.w, d.loss, st, cutoff)
		if st.src.waiting() >= d.watermark/8 {
			more = true
		}
	}
	return more
}

// flushAll drains everything and places the misses counted so far.
func (d *drainer) flushAll() {
	d.placeMissed()
	d.drainAll(^uint64(0))
}

// placeMissed places the recorder runs the kernel skipped since the last
// call that were events lost.
func (d *drainer) placeMissed() {
	all, lost := d.rec.missed()
	d.loss.placeMissed(d.streams[0], all, lost)
}

// close releases the sources and the poller; the goroutine must have
// ended or never run.
func (d *drainer) close() {
	for _, st := range d.streams {
		st.src.close()
	}
	if d.poll != nil {
		d.poll.Close()
	}
}
