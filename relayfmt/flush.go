package relayfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// flush finishes the current sub-buffer if it holds events or losses not
// yet in any packet. If losses are pending and no sub-buffer is open, it
// opens one to carry them, when one is free. It reports whether losses
// remain pending.
func (b *buffer) flush() bool {
	pending := b.discarded != b.pktDisc
	if b.cur != nil && (b.events > 0 || pending) {
		b.finish()
		return false
	}
	if b.cur == nil && pending {
		if !b.open(b.lastTS) {
			return true
		}
		b.finish()
	}
	return false
}

// FlushCPU forces a sub-buffer switch on cpu's buffer and, in NoOverwrite
// mode, waits until the sink has written every finished sub-buffer. It
// returns the sink's error, if any.
func (c *Channel) FlushCPU(cpu int) error {
	b, err := c.buf(cpu)
	if err != nil {
		return err
	}
	return b.flushWait()
}

// flushWait is FlushCPU on b: it returns once the sink has written every
// finished sub-buffer, or with the sink's error.
func (b *buffer) flushWait() error {
	pending := b.flush()
	if b.ch.cfg.Mode == Overwrite {
		return nil
	}
	if b.inline {
		b.writeOut()
	}
	if err := b.waitDrained(); err != nil || !pending {
		return err
	}
	b.flush()
	if b.inline {
		b.writeOut()
	}
	return b.waitDrained()
}

// Commit writes the sub-buffers finished since the last Commit to a local
// sink (LocalSink), from the calling goroutine, which must be the writer
// of every buffer or call it while they are quiescent; with any other
// sink, or in Overwrite mode, it does nothing. A writer that commits just
// before it goes idle makes its writes back to back: a Go program's
// system call wakes the runtime's monitor thread when it sleeps, which
// then polls every 20 µs until every goroutine is idle again, so writes
// spread over a busy stretch keep it polling throughout. Sub-buffers not
// committed are written when the writer needs their room, at a flush and
// at Close.
func (c *Channel) Commit() {
	for _, b := range c.bufs {
		if b.inline {
			b.writeOut()
		}
	}
}

// Flush forces a switch on every buffer, so a reader sees every record
// written so far, and waits for the sink (NoOverwrite mode).
func (c *Channel) Flush() error {
	var errs []error
	for _, b := range c.bufs {
		errs = append(errs, b.flushWait())
	}
	return errors.Join(errs...)
}

// ResetCPU empties cpu's buffer without reallocating: the current
// sub-buffer and, in Overwrite mode, every retained one are dropped on
// purpose (not counted as lost). Sub-buffers already handed to the sink are
// written.
func (c *Channel) ResetCPU(cpu int) error {
	b, err := c.buf(cpu)
	if err != nil {
		return err
	}
	b.reset()
	return nil
}

// Reset resets every buffer (see ResetCPU).
func (c *Channel) Reset() {
	for _, b := range c.bufs {
		b.reset()
	}
}

// reset is ResetCPU on b: the open sub-buffer, and in Overwrite mode every
// retained one, are dropped and their sequence numbers used again.
func (b *buffer) reset() {
	b.opens++
	if b.cur != nil {
		b.settle()
		b.cur = nil
		b.seq-- // the dropped packet never reached the sink: reuse its number
	}
	if b.ch.cfg.Mode == Overwrite {
		if c, p := b.consumed.Load(), b.produced.Load(); c < p {
			slot := int(c % b.n)
			b.seq = binary.LittleEndian.Uint64(b.mem[slot*b.size+offPacketSeqNum:])
			b.consumed.Store(p)
		}
	}
	b.base = b.produced.Load()
	b.events = 0
}

// Snapshot writes every retained sub-buffer of an Overwrite channel to the
// sink in sequence order, after finishing the current ones; the events
// lost with overwritten sub-buffers are added to each written packet's
// events_discarded, so readers report their exact number. Writers must be
// quiescent. It fails with ErrWrongMode in NoOverwrite mode.
func (c *Channel) Snapshot() error {
	if c.cfg.Mode != Overwrite {
		return ErrWrongMode
	}
	var errs []error
	for _, b := range c.bufs {
		errs = append(errs, b.snapshot())
	}
	return errors.Join(errs...)
}

// snapshot is Snapshot on b. It returns the sink's error, leaving the
// sub-buffers from the one it failed on retained.
func (b *buffer) snapshot() error {
	b.flush()
	for {
		cn, p := b.consumed.Load(), b.produced.Load()
		if cn == p {
			return nil
		}
		slot := int(cn % b.n)
		pkt := b.mem[slot*b.size : (slot+1)*b.size]
		d := binary.LittleEndian.Uint64(pkt[offEventsDiscarded:]) + b.overwritten
		binary.LittleEndian.PutUint64(pkt[offEventsDiscarded:], d)
		b.slotOver[slot] = b.overwritten
		if err := b.emit(pkt, b.slotEvents[slot]); err != nil {
			return err
		}
		b.consumed.Store(cn + 1)
	}
}

// RewindTo writes every sub-buffer an Overwrite channel still holds into
// sink as a complete trace: the metadata, then each stream's sub-buffers
// from the oldest, whether or not Snapshot already wrote them. This is the
// relay channel's rewind ("read again from the oldest data"); the copy
// goes to its own sink because the channel's files already hold those
// packets and a stream must not repeat one. The current sub-buffers are
// finished first; the channel's files and read position are untouched.
// cpu selects one buffer, or every one when negative. Writers must be
// quiescent. It fails with ErrWrongMode in NoOverwrite mode, or with the
// sink's error; the sink is not closed.
func (c *Channel) RewindTo(sink Sink, cpu int) error {
	if c.cfg.Mode != Overwrite {
		return ErrWrongMode
	}
	bufs := c.bufs
	if cpu >= 0 {
		b, err := c.buf(cpu)
		if err != nil {
			return err
		}
		bufs = []*buffer{b}
	}
	meta := c.Metadata()
	if err := writeMetadata(sink, &meta); err != nil {
		return fmt.Errorf("rewind: %w", err)
	}
	for _, b := range bufs {
		if err := b.rewindTo(sink); err != nil {
			return fmt.Errorf("rewind: stream %s: %w", b.name, err)
		}
	}
	return nil
}

// rewindTo is RewindTo on b: it writes b's held sub-buffers to sink from
// the oldest, each packet's discarded count raised by the events of the
// sub-buffers before it that the copy lacks. It returns sink's error.
func (b *buffer) rewindTo(sink Sink) error {
	b.flush()
	p := b.produced.Load()
	from := b.base
	held := b.n
	if b.cur != nil {
		held-- // the open sub-buffer reuses the oldest slot
	}
	if p > held && p-held > from {
		from = p - held
	}
	if from >= p {
		return nil
	}
	// The events of every sub-buffer before the oldest held one, whether
	// overwritten or written by a snapshot and reused, are not in this
	// trace: each packet's running total of discarded events gains them.
	before := b.slotStart[from%b.n]
	first := true
	for i := from; i < p; i++ {
		slot := i % b.n
		pkt := append([]byte(nil), b.mem[slot*uint64(b.size):(slot+1)*uint64(b.size)]...)
		d := binary.LittleEndian.Uint64(pkt[offEventsDiscarded:]) - b.slotOver[slot] + before
		binary.LittleEndian.PutUint64(pkt[offEventsDiscarded:], d)
		if first && d != 0 {
			if err := sink.WritePacket(b.name, b.opener()); err != nil {
				return err
			}
		}
		first = false
		if err := sink.WritePacket(b.name, pkt); err != nil {
			return err
		}
	}
	return nil
}

// WaitRoom waits until cpu's buffer has a free sub-buffer, as the sink
// writes them out, and returns nil then; it returns the sink's error
// once the sink failed, when none will ever free. It is for a writer
// that must put a packet before it ends (PutPacket returned false).
// Only in NoOverwrite mode.
func (c *Channel) WaitRoom(cpu int) error {
	b, err := c.buf(cpu)
	if err != nil {
		return err
	}
	if b.inline {
		b.writeOut()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.sinkErr == nil && b.produced.Load()-b.consumed.Load() >= b.n {
		b.cond.Wait()
	}
	return b.sinkErr
}

// endTogether ends, at Close, every per-CPU stream that has packets at
// the newest event of any: a stream whose last event is older gets an
// empty packet from there to that event, as LTTng flushes an empty packet
// into every stream at its stop. Without it, readers that keep only the
// span every stream covers (above) would cut the events after the first
// stream's last. It reports whether it finished any packet; the sink must
// have written every finished sub-buffer (Flush) before it runs.
func (c *Channel) endTogether() bool {
	if c.global != nil {
		return false
	}
	if c.Err() != nil {
		return false
	}
	var stop uint64
	for _, b := range c.bufs {
		stop = max(stop, b.lastTS)
	}
	added := false
	for _, b := range c.bufs {
		if b.produced.Load() == 0 && b.put == 0 || b.lastTS >= stop {
			continue
		}
		if b.cur == nil && !b.open(b.lastTS) {
			continue
		}
		b.lastTS = stop
		b.finish()
		added = true
	}
	return added
}
