package relayfmt

import (
	"errors"
	"fmt"
	"time"
)

// A channel's trace can be cut into chunks, as LTTng rotates a session
// (lttng-rotate(1)): Rotate closes the current chunk at a packet boundary
// on every stream and begins the next, so that a long recording can be
// read, moved or deleted a chunk at a time while later ones are written.
// Each chunk is a trace of its own: its metadata, and every stream's
// packets from the last boundary to the next, numbered from 1 and
// counting the events discarded since the boundary, under a UUID of its
// own; so a reader takes a chunk alone, or several side by side as
// separate traces, and the events and losses of all chunks add up to
// those of the recording.

// Chunk describes a trace chunk a channel closed (Rotate, Close).
type Chunk struct {
	// Index numbers the chunks of a channel from 0.
	Index uint64
	// Begin and End are the chunk's start and end on the channel's
	// clock, in its ticks.
	Begin, End uint64
	// BeginTime and EndTime are Begin and End as wall time.
	BeginTime, EndTime time.Time
	// UUID is the chunk's trace UUID, in its metadata and packets.
	UUID [16]byte
	// Events and Discarded are what the chunk's streams hold and report
	// lost; Packets and Bytes, the packets the sink took for it.
	Events, Discarded uint64
	Packets, Bytes    uint64
}

// Rotator is a Sink that writes a trace in chunks. CloseChunk closes the
// current chunk, described by c, of which the sink has taken every
// packet and the metadata; with next set it then begins the next one,
// into which the channel writes its metadata and the packets that
// follow. Without next (the channel's Close) no chunk follows. It
// returns why the chunk could not be closed or the next begun. Sinks
// that wrap another forward to their inner sink, and say with a method
// Rotates() bool whether it is one.
type Rotator interface {
	CloseChunk(c Chunk, next bool) error
}

// CanRotate reports whether sink writes a trace in chunks: it is a
// Rotator, and one that wraps another says its inner sink is.
func CanRotate(sink Sink) bool {
	if w, ok := sink.(interface{ Rotates() bool }); ok {
		return w.Rotates()
	}
	_, ok := sink.(Rotator)
	return ok
}

// ErrNoRotate is returned by Rotate when the channel's sink cannot
// write chunks.
var ErrNoRotate = errors.New("the trace's sink cannot rotate chunks")

// Rotate closes the current trace chunk and begins the next, at a packet
// boundary on every stream: it finishes every open sub-buffer, writes
// every finished one (those of streams whose last event is older than
// the newest one's end there with an empty packet, as at Close), has the
// sink close the chunk and begin the next (Rotator), and writes the
// metadata into it. Every stream's next packet is the first of the new
// chunk: numbered 1, counting the losses since, under the new chunk's
// UUID, beginning no later than the old chunk's end. at is the boundary's
// time on the channel's clock, the wall time the chunk's name gets
// (Chunk.EndTime). The caller must have written every record it has
// (drained its sources) and writers must be quiescent, as for Flush.
//
// It returns the chunk it closed. It fails with ErrNoRotate for a sink
// that is no Rotator, ErrWrongMode in Overwrite mode (sub-buffers reach
// the sink only at a snapshot), ErrClosed after Close, the sink's error
// when a stream failed before (nothing more reaches the trace), or the
// error of the chunk's closing, which then stops the channel: Err
// returns it from then on.
func (c *Channel) Rotate(at uint64) (Chunk, error) {
	r, ok := c.sink.(Rotator)
	if !ok || !CanRotate(c.sink) {
		return Chunk{}, ErrNoRotate
	}
	if c.cfg.Mode != NoOverwrite {
		return Chunk{}, fmt.Errorf("rotate: %w: a flight recorder's sub-buffers reach the trace at snapshots", ErrWrongMode)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return Chunk{}, ErrClosed
	}
	if err := c.Err(); err != nil {
		return Chunk{}, err
	}
	if err := c.endChunk(); err != nil {
		return Chunk{}, fmt.Errorf("rotate: %w", err)
	}
	ch := c.chunkSummary(at)
	next := NewUUID()
	c.mu.Lock()
	defer c.mu.Unlock()
	closeErr := r.CloseChunk(ch, true)
	// Even when the chunk could not be closed whole, what follows is
	// a chunk of its own where the sink still writes: the recording
	// stops (Failed), and the packets until then stay readable.
	// The next chunk begins where this one ended: at its newest event,
	// or later at the rotation's time.
	stop := max(ch.End, at)
	for _, b := range c.bufs {
		b.nextChunk(next, stop)
	}
	c.chunk++
	c.chunkBegin = stop
	c.begin.Store(stop)
	c.meta.UUID = next
	metaErr := writeMetadata(c.sink, &c.meta)
	switch {
	case closeErr != nil:
		c.rotErr = fmt.Errorf("rotate: closing chunk %d: %w", ch.Index, closeErr)
	case metaErr != nil:
		c.rotErr = fmt.Errorf("rotate: chunk %d: %w", c.chunk, metaErr)
	default:
		return ch, nil
	}
	c.failOnce.Do(func() { close(c.failed) })
	return ch, c.rotErr
}

// endChunk writes every record of the current chunk into its streams
// and ends them together (endTogether), then gives each stream back the
// time of its own last event: a later event stamped before another
// stream's end belongs to the next chunk, where it must not be raised
// to that end nor refused as a packet beginning before it.
func (c *Channel) endChunk() error {
	if err := c.Flush(); err != nil {
		return err
	}
	last := make([]uint64, len(c.bufs))
	for i, b := range c.bufs {
		last[i] = b.lastTS
	}
	stop := uint64(0)
	if c.endTogether() {
		if err := c.Flush(); err != nil {
			return err
		}
	}
	for i, b := range c.bufs {
		stop = max(stop, b.lastTS)
		b.lastTS = last[i]
		b.chunkEnd = stop
	}
	return nil
}

// chunkSummary returns the current chunk, whose streams have every
// packet written: from its start, or its streams' first packet if that
// began before, to the newest event of any stream; at is the wall time
// of its end, when later.
func (c *Channel) chunkSummary(at uint64) Chunk {
	c.mu.Lock()
	ch := Chunk{Index: c.chunk, Begin: c.chunkBegin, UUID: c.meta.UUID}
	c.mu.Unlock()
	if ch.Index == 0 {
		ch.Begin = c.begin.Load()
	}
	for _, b := range c.bufs {
		ch.End = max(ch.End, b.chunkEnd, b.lastTS)
		if b.firstTS != 0 && (ch.Begin == 0 || b.firstTS < ch.Begin) {
			ch.Begin = b.firstTS
		}
		ch.Discarded += b.discarded - b.discBase
		b.mu.Lock()
		ch.Events += b.wEvents - b.chunkEvents
		ch.Bytes += b.chunkBytes
		ch.Packets += b.chunkPackets
		if b.sinkErr != nil {
			// What the sink did not take is counted in the stream's
			// last packet (writeFinal).
			ch.Discarded += b.unwritten(b.wEvents)
		}
		b.mu.Unlock()
	}
	ch.End = max(ch.End, ch.Begin)
	ch.BeginTime = c.cfg.Clock.Time(ch.Begin)
	ch.EndTime = c.cfg.Clock.Time(max(at, ch.End))
	return ch
}

// nextChunk makes b's next packet the first of a new chunk of UUID
// uuid beginning at begin: numbered 1, counting the losses from now. An
// open sub-buffer, which holds no event once the chunk ended, is
// dropped. The sink must have taken every finished sub-buffer.
func (b *buffer) nextChunk(uuid [16]byte, begin uint64) {
	if b.cur != nil {
		b.opens++
		b.cur = nil
	}
	b.seq = 1
	b.discBase = b.discarded
	b.pktDisc = b.discarded
	b.hdr.UUID = uuid
	b.firstTS = begin
	b.mu.Lock()
	b.opened = false
	b.wSeq, b.wDisc, b.wEnd = 0, 0, 0
	b.chunkEvents = b.wEvents
	b.chunkBytes, b.chunkPackets = 0, 0
	b.mu.Unlock()
}

// ChunkBytes returns the bytes of the packets the sink took for the
// current chunk so far: from the start without Rotate.
func (c *Channel) ChunkBytes() uint64 {
	var n uint64
	for _, b := range c.bufs {
		b.mu.Lock()
		n += b.chunkBytes
		b.mu.Unlock()
	}
	return n
}

// Chunks returns how many chunks the channel began: 1 until the first
// Rotate.
func (c *Channel) Chunks() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chunk + 1
}

// closeLastChunk, at Close, has a sink that was rotated close the last
// chunk too, as lttng destroy archives a session's last chunk once it
// has rotated; a trace never rotated stays where it is. It returns the
// sink's error.
func (c *Channel) closeLastChunk() error {
	r, ok := c.sink.(Rotator)
	ok = ok && CanRotate(c.sink)
	c.mu.Lock()
	rotated, failed := c.chunk > 0, c.rotErr != nil
	c.mu.Unlock()
	if !ok || !rotated || failed {
		return nil
	}
	var stop uint64
	for _, b := range c.bufs {
		stop = max(stop, b.lastTS)
	}
	ch := c.chunkSummary(stop)
	if now := time.Now(); now.After(ch.EndTime) {
		// It ends now, the recording's end, whatever its last event.
		ch.EndTime = now
	}
	if err := r.CloseChunk(ch, false); err != nil {
		return fmt.Errorf("closing the last chunk: %w", err)
	}
	return nil
}

// Time returns ts, in the clock's ticks, as wall time.
func (k Clock) Time(ts uint64) time.Time {
	freq := k.Freq
	if freq == 0 {
		freq = 1e9
	}
	ns := ts
	if freq != 1e9 {
		ns = uint64(float64(ts) * 1e9 / float64(freq))
	}
	return time.Unix(0, k.Offset+int64(ns))
}

// ChunkStart returns what cpu's stream (the one stream in global mode)
// held before its current chunk: the events the sink took and those
// reported lost. Call it from the buffer's writer or while it is
// quiescent; 0 for an unknown cpu.
func (c *Channel) ChunkStart(cpu int) (events, discarded uint64) {
	b, err := c.buf(cpu)
	if err != nil || c.global != nil && cpu != 0 {
		return 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.chunkEvents, b.discBase
}

// Sink returns the channel's sink.
func (c *Channel) Sink() Sink { return c.sink }
