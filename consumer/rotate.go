package consumer

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kconsume/kconsume/internal/clock"
	"github.com/kconsume/kconsume/internal/timerfd"
	"github.com/kconsume/kconsume/relayfmt"
)

// Rotation (Config.RotateSize, RotateInterval, Session.Rotate) closes
// the trace's current chunk and begins the next at a packet boundary on
// every stream (relayfmt.Channel.Rotate). It runs on the drainer
// goroutine, the channel's writer, whatever asks for it: a command
// (kconsume ctl rotate), the interval's timer, or the drainer itself
// once the chunk's packets reach the size.

// Rotate closes the trace's current chunk and begins the next now: the
// rings are drained and every record so far goes into the closed chunk
// (in packet mode the programs' open packets are closed first), the
// records after it into the next. It returns the chunk closed. It fails
// with ErrConfig when the session's output cannot rotate, in overwrite
// mode, after Close (ErrClosed), once the trace's sink failed, or with
// the error of the chunk's closing, which stops the trace.
func (s *Session) Rotate() (relayfmt.Chunk, error) {
	if !relayfmt.CanRotate(s.ch.Sink()) {
		return relayfmt.Chunk{}, fmt.Errorf("%w: rotate: the trace's sink writes no chunks", ErrConfig)
	}
	if s.cfg.Mode != relayfmt.NoOverwrite {
		return relayfmt.Chunk{}, fmt.Errorf("%w: rotate: a flight recorder (overwrite mode) writes at its snapshots", ErrConfig)
	}
	var c relayfmt.Chunk
	err := s.dr.do(func() error {
		var err error
		c, err = s.dr.rotate()
		return err
	})
	return c, err
}

// rotation is what the drainer rotates by: the size of a chunk's
// packets that makes it rotate, and the interval's timer, which each
// rotation sets again.
type rotation struct {
	size   uint64
	period time.Duration
	timer  *timerfd.Timer
	// trig: the triggers' doorbell asks for a rotation, not a snapshot
	// (a rotate trigger; snapshots need overwrite mode, which does not
	// rotate).
	trig bool
	last atomic.Int64 // the last rotation, or the start, in Unix ns
	// before runs before each rotation: it writes into the trace's
	// directory what the closing chunk takes with it (the symbols).
	before func()
}

// rotate drains every ring into the current chunk and rotates the
// channel at now, on the drainer goroutine; then the ledger learns what
// the closed chunks of each stream hold, for recover, and the interval
// starts again.
func (d *drainer) rotate() (relayfmt.Chunk, error) {
	d.flushAll()
	if d.rot.before != nil {
		d.rot.before()
	}
	now, _ := clock.Now(d.clockID)
	c, err := d.w.ch.Rotate(now)
	if err != nil {
		return c, err
	}
	for i := range d.streams {
		events, discarded := d.w.ch.ChunkStart(i)
		d.keep.based(i, events+discarded)
	}
	d.rot.last.Store(time.Now().UnixNano())
	if d.rot.timer != nil {
		_ = d.rot.timer.Reset(d.rot.period)
	}
	return c, nil
}

// checkSize rotates when the current chunk's packets reach the rotation
// size. A rotation that fails stops the trace (the channel's Failed).
func (d *drainer) checkSize() {
	if d.rot.size > 0 && d.w.ch.ChunkBytes() >= d.rot.size && d.w.ch.Err() == nil {
		_, _ = d.rotate()
	}
}

// symbolsAtRotation has each rotation write into the trace's directory,
// which the closing chunk takes a copy of, the kernel's symbols when
// modules came or went (refreshKernelSymbols) and the user symbols known
// so far, so that the chunk's call chains resolve on their own.
func (s *Session) symbolsAtRotation() {
	if s.cfg.Dir == "" || s.kmods == nil && s.umaps == nil {
		return
	}
	s.dr.rot.before = func() {
		_ = s.refreshKernelSymbols()
		if s.umaps == nil {
			return
		}
		s.umaps.catchUp()
		if procs, err := s.userStackProcs(); err == nil {
			_ = writeUserSymbols(s.cfg.Dir, s.umaps.snapshot(procs))
		}
	}
}

// startInterval arms the rotation interval's timer, whose expiries
// rotate on the drainer goroutine; a rotation for the size in between
// sets it again. It returns the kernel's error.
func (s *Session) startInterval() error {
	if s.cfg.RotateInterval <= 0 {
		return nil
	}
	t, err := timerfd.New()
	if err != nil {
		return err
	}
	s.dr.rot.timer = t
	go func() {
		for {
			select {
			case <-t.C():
			case <-s.dr.done:
				return
			}
			_ = s.dr.do(func() error {
				// An expiry already waiting when a rotation for the
				// size set the timer again is not one.
				if time.Since(time.Unix(0, s.dr.rot.last.Load())) < s.cfg.RotateInterval/2 {
					return nil
				}
				_, err := s.dr.rotate()
				return err
			})
		}
	}()
	return nil
}

// armInterval starts the rotation interval, at the first Start.
func (s *Session) armInterval() {
	if t := s.dr.rot.timer; t != nil {
		s.dr.rot.last.Store(time.Now().UnixNano())
		_ = t.Reset(s.cfg.RotateInterval)
	}
}
