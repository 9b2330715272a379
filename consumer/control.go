package consumer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/relayfmt"
)

// The trace control layer of a session: the gate (start/stop, per CPU
// too), flush, reset, snapshot, rewind and the counters. Operations on
// the channel run on the drainer goroutine.

// Start opens the gate: the programs record from now on. After Prepare
// it is a store to mapped memory (on Linux 5.5+) and makes no system
// call. It fails with ErrClosed once Close has begun.
func (s *Session) Start() error {
	if err := s.setGate(true); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	return nil
}

// setGate opens or closes the gate, preparing the session at the first
// opening, unless Close has shut it (ErrClosed).
func (s *Session) setGate(on bool) error {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gateShut {
		return ErrClosed
	}
	if on {
		s.prepare()
	}
	if err := s.rec.SetRunning(on); err != nil {
		return err
	}
	s.started.Store(on)
	return nil
}

// Prepare does, once, what the first Start needs before it opens the
// gate: it faults in the buffers and begins every stream at the current
// time. A caller that must open the gate without a system call (one
// wakes the Go runtime's sleeping sysmon, whose polling lands in the
// trace) calls it first. After Close it does nothing.
func (s *Session) Prepare() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if !s.gateShut {
		s.prepare()
	}
}

func (s *Session) prepare() {
	s.first.Do(func() {
		// The buffers fault in here rather than in New, after the caller
		// had the chance to hand back setup's garbage (the kernel's BTF,
		// the specs): faulted in beside it, they added their size to the
		// peak RSS. An error (EINVAL before Linux 5.14) only leaves the
		// pages to fault in as they are first written.
		_ = s.ch.Prefault()
		// Every stream begins at the trace's start, as LTTng's do (see
		// relayfmt's Channel.Begin).
		var now unix.Timespec
		if unix.ClockGettime(s.dr.clockID, &now) == nil {
			s.ch.Begin(uint64(now.Nano()))
		}
		s.armInterval()
		_ = s.rec.LiveTriggers(true) // loaded, it cannot fail
	})
}

// Stop closes the gate: each event then costs the programs one branch.
// Records already in the rings are still drained. It fails with
// ErrClosed once Close has begun.
func (s *Session) Stop() error {
	if err := s.setGate(false); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	return nil
}

// Running reports whether the gate is open: as Start and Stop left it,
// or a trigger since.
func (s *Session) Running() bool {
	if len(s.cfg.Triggers) > 0 {
		s.gateMu.Lock()
		defer s.gateMu.Unlock()
		return !s.gateShut && s.rec.Running()
	}
	return s.started.Load()
}

// StopCPU stops recording on one CPU alone (the ftrace ring buffer's
// record_disable_cpu); StartCPU resumes it. It fails with ErrNoSuchCPU.
func (s *Session) StopCPU(cpu int) error { return s.setCPU(cpu, true) }

// StartCPU resumes recording on cpu after StopCPU.
func (s *Session) StartCPU(cpu int) error { return s.setCPU(cpu, false) }

func (s *Session) setCPU(cpu int, disabled bool) error {
	if err := s.checkCPU(cpu, false); err != nil {
		return err
	}
	s.rec.SetCPUDisabled(cpu, disabled)
	return nil
}

// checkCPU fails for a CPU that does not exist, or, when perStream is
// set, in global mode, where CPUs share one buffer.
func (s *Session) checkCPU(cpu int, perStream bool) error {
	if perStream && s.cfg.Global {
		return ErrNeedsPerCPU
	}
	if cpu < 0 || cpu >= s.ncpu {
		return fmt.Errorf("cpu %d: %w", cpu, ErrNoSuchCPU)
	}
	return nil
}

// Flush writes out everything recorded so far: drains the rings, writes
// the records waiting for reordering and finishes the open sub-buffers.
func (s *Session) Flush() error {
	return s.dr.do(func() error {
		s.dr.flushAll()
		return s.ch.Flush()
	})
}

// FlushCPU is Flush for one CPU's buffer.
func (s *Session) FlushCPU(cpu int) error {
	if err := s.checkCPU(cpu, true); err != nil {
		return err
	}
	return s.dr.do(func() error {
		st := s.dr.streams[cpu]
		st.src.drain(s.w, s.dr.loss, st, ^uint64(0))
		return s.ch.FlushCPU(cpu)
	})
}

// Reset drops everything not yet written: ring contents, waiting
// records, open and (overwrite mode) retained sub-buffers.
func (s *Session) Reset() error {
	return s.dr.do(func() error {
		for _, st := range s.dr.streams {
			st.reset()
		}
		s.ch.Reset()
		return nil
	})
}

// ResetCPU is Reset for one CPU's buffer (ftrace's reset_cpu).
func (s *Session) ResetCPU(cpu int) error {
	if err := s.checkCPU(cpu, true); err != nil {
		return err
	}
	return s.dr.do(func() error {
		s.dr.streams[cpu].reset()
		return s.ch.ResetCPU(cpu)
	})
}

// Snapshot (overwrite mode) drains the rings and writes the retained
// sub-buffers, the newest records, to the output.
func (s *Session) Snapshot() error {
	return s.dr.do(func() error {
		s.dr.drainAll(^uint64(0))
		return s.ch.Snapshot()
	})
}

// Rewind (overwrite mode) drains the rings and writes every sub-buffer
// the channel still holds, from the oldest, into dir as a complete trace
// of its own (metadata and streams): the relay channel's "read again from
// the oldest data", including what a Snapshot already wrote. dir must not
// exist; cpu selects one CPU's stream, or all when negative. It fails
// with ErrConfig in discard mode or when dir exists, and leaves no partial
// directory behind on error.
func (s *Session) Rewind(dir string, cpu int) error {
	if s.cfg.Mode != relayfmt.Overwrite {
		return fmt.Errorf("%w: rewind needs overwrite mode", ErrConfig)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: rewind: %s exists", ErrConfig, dir)
		}
		return fmt.Errorf("rewind: %w", err)
	}
	sink, err := relayfmt.NewDirSink(dir)
	if err == nil {
		err = s.dr.do(func() error {
			s.dr.drainAll(^uint64(0))
			return s.ch.RewindTo(sink, cpu)
		})
		err = errors.Join(err, sink.Close())
	}
	if err == nil {
		err = s.copySymbols(dir)
	}
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	return nil
}

// copySymbols gives the trace in dir, a rewind's, the session's symbol
// files: the kernel's as saved at the start, the user's as known now.
func (s *Session) copySymbols(dir string) error {
	if src := filepath.Join(s.cfg.Dir, KernelSymbols); s.cfg.Dir != "" {
		if b, err := os.ReadFile(src); err == nil {
			if err := os.WriteFile(filepath.Join(dir, KernelSymbols), b, 0o644); err != nil {
				return fmt.Errorf("rewind: %w", err)
			}
		}
	}
	if s.umaps == nil {
		return nil
	}
	procs, err := s.userStackProcs()
	if err != nil {
		return fmt.Errorf("rewind: %w", err)
	}
	return writeUserSymbols(dir, s.umaps.snapshot(procs))
}

// Stats returns per-CPU counters. After Close it returns the final
// counts; it fails with ErrClosed only when the session never ran.
func (s *Session) Stats() ([]CPUStats, error) {
	var out []CPUStats
	err := s.dr.do(func() error {
		out = s.stats()
		return nil
	})
	if final := s.final.Load(); errors.Is(err, ErrClosed) && final != nil {
		return *final, nil
	}
	return out, err
}

// stats returns the per-CPU counters; it runs on the drainer goroutine,
// or where none runs.
func (s *Session) stats() []CPUStats { return s.dr.stats(s.ch) }

// Activity returns a channel that receives (without queueing more than
// one) after the drainer ran for data: a producer woke it, or its timer
// for waiting data ended. Nothing arrives while the session idles, so a
// caller that refreshes a view of the counters on it costs nothing then.
func (s *Session) Activity() <-chan struct{} { return s.dr.activity }

// Drainer returns how promptly the drainer ran, so far. It does not wait
// for the drainer, and works after Close.
func (s *Session) Drainer() DrainerStats { return s.dr.counts.load() }

// SetFilter gives the recorded events that pattern names (as
// EventFilter.Event) the field filter expr while recording, in place of
// any they had; the kernel's "0" removes it. Each event is recorded once
// across the change. It fails with ErrConfig, naming the event, the
// position and the reason, for an expression the kernel or the recorder
// refuses or a pattern that names no recorded event, for an event
// recorded by a program whose filter cannot change (a user's object, or
// the page-in program of syscall events with user-space strings), and
// with ErrClosed after Close; the events whose filter it did not change
// keep theirs.
func (s *Session) SetFilter(pattern, expr string) error {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gateShut {
		return ErrClosed
	}
	fs, err := tracefs.Find()
	if err != nil {
		return err
	}
	keys, err := namedEvents(fs, pattern, s.events)
	if err != nil {
		return err
	}
	flts := make([]*filter.Filter, len(keys))
	for k, i := range keys {
		if flts[k], err = parseFilter(expr, s.events[i]); err != nil {
			return fmt.Errorf("%w: event %s: %w", ErrConfig, s.events[i].FullName(), err)
		}
	}
	for k, i := range keys {
		if err := s.rec.ReplaceFilter(i, s.events[i], flts[k]); err != nil {
			return fmt.Errorf("%w: event %s: %w", ErrConfig, s.events[i].FullName(), err)
		}
	}
	return nil
}
