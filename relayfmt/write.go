package relayfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Write appends one event of class id with timestamp ts (in clock ticks)
// to cpu's buffer. It never splits a record across sub-buffers. A
// timestamp lower than the buffer's last one is raised to it (counted in
// Stats.Clamped) so the stream stays monotonic. It returns ErrDropped when
// no sub-buffer is free (NoOverwrite), ErrTooLarge or ErrInvalid; each of
// them is counted and reported in the stream as discarded events.
func (c *Channel) Write(cpu int, ts uint64, id uint32, payload []byte) error {
	_, err := c.write(cpu, ts, id, payload, true)
	return err
}

// Append is Write kept inside the open sub-buffer, for a writer that may
// still Undo: starting a sub-buffer makes every event before it final.
// When the event does not fit the open sub-buffer, or none is open, it
// writes and counts nothing and returns false, and the caller writes the
// event later with Write. Otherwise it returns true and Write's error.
func (c *Channel) Append(cpu int, ts uint64, id uint32, payload []byte) (bool, error) {
	return c.write(cpu, ts, id, payload, false)
}

// write is Write (open set: a sub-buffer may be started) and Append.
func (c *Channel) write(cpu int, ts uint64, id uint32, payload []byte, open bool) (bool, error) {
	b := c.global
	if b == nil {
		if uint(cpu) >= uint(len(c.bufs)) {
			return true, fmt.Errorf("cpu %d: %w", cpu, ErrNoStream)
		}
		b = c.bufs[cpu]
	}
	// Fast path, nearly every record, with no call below this one: a known
	// fixed-size class with a compact header (id <= 30, no clamp, less
	// than 2^27 ticks since the last full timestamp) that fits the open
	// sub-buffer.
	off, ctx := b.off, b.ctx
	need := CompactHeaderSize + ctx + len(payload)
	if uint64(id) <= MaxCompactID && uint64(id) < uint64(len(b.sizes)) &&
		int(b.sizes[id]) == len(payload) && ts >= b.lastTS &&
		ts-b.lastFull <= compactTSMask && uint(off) <= uint(len(b.cur)) && need <= len(b.cur)-off {
		// The test above bounds every store below: need bytes from off
		// lie inside cur.
		p := unsafe.Add(unsafe.Pointer(unsafe.SliceData(b.cur)), off)
		binary.LittleEndian.PutUint32(unsafe.Slice((*byte)(p), CompactHeaderSize), id|uint32(ts&compactTSMask)<<5)
		if ctx != 0 {
			binary.LittleEndian.PutUint32(unsafe.Slice((*byte)(unsafe.Add(p, CompactHeaderSize)), 4), uint32(cpu))
		}
		copy(unsafe.Slice((*byte)(unsafe.Add(p, CompactHeaderSize+ctx)), len(payload)), payload)
		b.off = off + need
		b.lastTS = ts
		b.events++
		return true, nil
	}
	return b.writeSlow(ts, id, payload, uint32(cpu), open)
}

// writeSlow is write for every other case: a class to validate or newly
// added, a clamped timestamp, an extended header, a sub-buffer switch
// (only when open is set; otherwise it returns false having changed
// nothing).
func (b *buffer) writeSlow(ts uint64, id uint32, payload []byte, cpu uint32, open bool) (bool, error) {
	ctx := b.ctx
	if uint64(id) >= uint64(len(b.sizes)) && !b.refreshSizes(id) {
		return true, b.lose(&b.stats.Invalid, ErrInvalid)
	}
	if fs := b.sizes[id]; int(fs) != len(payload) && (fs >= 0 || !b.validPayload(id, payload)) {
		return true, b.lose(&b.stats.Invalid, ErrInvalid)
	}
	clamped := ts < b.lastTS
	if clamped {
		ts = b.lastTS
	}
	ext := needsExtended(id, ts, b.lastFull)
	need := CompactHeaderSize + ctx + len(payload)
	if ext {
		need += ExtendedHeaderSize - CompactHeaderSize
	}
	if b.off+need > len(b.cur) {
		if !open {
			return false, nil
		}
		// A fresh packet sets the full timestamp, so only the id can still
		// force the extended header, but for a first packet (below).
		ext = id > MaxCompactID
		need = CompactHeaderSize + ctx + len(payload)
		if ext {
			need += ExtendedHeaderSize - CompactHeaderSize
		}
		if need > b.size-PacketHeaderSize {
			return true, b.lose(&b.stats.TooLarge, ErrTooLarge)
		}
		if b.cur != nil {
			b.finish()
		}
		if !b.open(ts) {
			return true, b.lose(&b.stats.Dropped, ErrDropped)
		}
		// A stream's first packet may begin before ts (Channel.Begin),
		// too long before for a compact header to count from there.
		if !ext && needsExtended(id, ts, b.lastFull) {
			ext = true
			need += ExtendedHeaderSize - CompactHeaderSize
			if need > b.size-PacketHeaderSize {
				return true, b.lose(&b.stats.TooLarge, ErrTooLarge)
			}
		}
	}
	if clamped {
		b.stats.Clamped++
	}
	p := b.cur[b.off : b.off+need]
	n := putEventHeader(p, id, ts, ext)
	if ctx != 0 {
		binary.LittleEndian.PutUint32(p[n:], cpu)
		n += 4
	}
	copy(p[n:], payload)
	b.off += need
	b.lastTS = ts
	if ext {
		b.lastFull = ts
	}
	b.events++
	return true, nil
}

// Mark is a place in one buffer of a Channel, between two events of its
// open sub-buffer, that Undo can take the buffer back to.
type Mark struct {
	b                          *buffer
	opens                      uint64
	off                        int
	lastTS, lastFull, events   uint64
	invalid, tooLarge, clamped uint64
}

// Mark returns the place after the last event written to cpu's buffer
// (the one buffer in global mode); the zero Mark for an unknown cpu.
func (c *Channel) Mark(cpu int) Mark {
	b, err := c.buf(cpu)
	if err != nil {
		return Mark{}
	}
	return Mark{b: b, opens: b.opens, off: b.off, lastTS: b.lastTS, lastFull: b.lastFull, events: b.events,
		invalid: b.stats.Invalid, tooLarge: b.stats.TooLarge, clamped: b.stats.Clamped}
}

// TS returns the timestamp of the newest event written before m.
func (m Mark) TS() uint64 { return m.lastTS }

// LastTS returns the timestamp of the newest event written to cpu's
// buffer (the one buffer in global mode), before which Write clamps a
// later event's timestamp; 0 for an unknown cpu.
func (c *Channel) LastTS(cpu int) uint64 {
	b, err := c.buf(cpu)
	if err != nil {
		return 0
	}
	return b.lastTS
}

// Undo takes m's buffer back to m: the events written since are gone, as
// are the counts of records Write rejected since (invalid, too large) and
// of timestamps it clamped, since the caller will write those records
// again. Losses reported through Discard stay counted. It reports whether
// it could: not once the sub-buffer open at m has been finished or
// dropped (a flush, a snapshot, a reset, or a Write that started a new
// one), nor when none was open at m.
func (c *Channel) Undo(m Mark) bool {
	b := m.b
	if b == nil || b.ch != c || b.cur == nil || b.opens != m.opens || m.off > b.off {
		return false
	}
	rejected := b.stats.Invalid - m.invalid + b.stats.TooLarge - m.tooLarge
	b.stats.Invalid, b.stats.TooLarge, b.stats.Clamped = m.invalid, m.tooLarge, m.clamped
	b.discarded -= rejected
	b.off, b.lastTS, b.lastFull, b.events = m.off, m.lastTS, m.lastFull, m.events
	return true
}

// settle adds the records and bytes of the open sub-buffer to the stats,
// which Write does not update per record; it is called before the
// sub-buffer is finished or dropped.
func (b *buffer) settle() {
	if b.cur != nil {
		b.stats.Records += b.events
		b.stats.Bytes += uint64(b.off - PacketHeaderSize)
	}
}

// refreshSizes reloads the size cache from the class table and reports
// whether id is now known.
func (b *buffer) refreshSizes(id uint32) bool {
	classes := *b.ch.classes.Load()
	for _, c := range classes[len(b.sizes):] {
		b.sizes = append(b.sizes, int32(c.fixed))
	}
	return uint64(id) < uint64(len(b.sizes))
}

// validPayload checks a payload of a variable-size class.
func (b *buffer) validPayload(id uint32, payload []byte) bool {
	cls := (*b.ch.classes.Load())[id]
	n, err := cls.PayloadSize(payload)
	return err == nil && n == len(payload)
}

// lose counts one record rejected by Write in counter and as discarded,
// and returns err, the one Write returns for it.
func (b *buffer) lose(counter *uint64, err error) error {
	*counter++
	b.discarded++
	return err
}

// Discard records n events lost before they reached the channel (a BPF
// reserve failure, perf lost samples). They are reported in the packet
// being written, or the next one, as discarded events.
func (c *Channel) Discard(cpu int, n uint64) error {
	b, err := c.buf(cpu)
	if err != nil {
		return err
	}
	b.stats.Lost += n
	b.discarded += n
	return nil
}

// Lose counts n events of cpu's stream that never reached the channel
// whole (a packet PutPacket refused or had no room for at the end) as
// discarded, as Stats.Unwritten: they are reported in the stream's next
// packet. It fails only for an unknown cpu.
func (c *Channel) Lose(cpu int, n uint64) error {
	b, err := c.buf(cpu)
	if err != nil {
		return err
	}
	b.lost += n
	b.discarded += n
	return nil
}

// open starts a new sub-buffer at timestamp ts. It returns false if none is
// free in NoOverwrite mode; in Overwrite mode it reuses the oldest one and
// counts its events as overwritten.
func (b *buffer) open(ts uint64) bool {
	p := b.produced.Load()
	if b.inline && p-b.consumed.Load() >= b.n {
		// Finished sub-buffers wait for Commit: written now rather than
		// the record dropped.
		b.writeOut()
	}
	if p-b.consumed.Load() >= b.n {
		if b.ch.cfg.Mode != Overwrite {
			return false
		}
		// Flight recorder: the writer owns consumed in this mode.
		old := b.consumed.Load()
		lost := b.slotEvents[old%b.n]
		b.overwritten += lost
		b.stats.Overwritten += lost
		b.consumed.Store(old + 1)
	}
	slot := int(p % b.n)
	b.cur = b.mem[slot*b.size : (slot+1)*b.size]
	b.opens++
	h := b.hdr
	h.TimestampBegin = ts
	if b.seq == 1 {
		// The stream's first packet, of the trace or of its chunk.
		if bg := b.ch.begin.Load(); bg != 0 && bg < ts {
			h.TimestampBegin = bg
		}
		b.firstTS = h.TimestampBegin
	}
	h.SeqNum = b.seq
	PutPacketHeader(b.cur, &h)
	b.seq++
	b.off = PacketHeaderSize
	b.events = 0
	// A reader's clock starts each packet at its timestamp_begin: the
	// first event's compact header counts from there.
	b.lastFull = h.TimestampBegin
	return true
}

// finish completes the current sub-buffer's header, zeroes its padding and
// hands it on (relay's subbuf switch).
func (b *buffer) finish() {
	b.settle()
	le := binary.LittleEndian
	le.PutUint64(b.cur[offTimestampEnd:], b.lastTS)
	le.PutUint64(b.cur[offContentSize:], uint64(b.off)*8)
	le.PutUint64(b.cur[offEventsDiscarded:], b.discarded-b.discBase)
	clear(b.cur[b.off:])
	p := b.produced.Load()
	b.slotEvents[p%b.n] = b.events
	b.slotOver[p%b.n] = 0
	b.slotStart[p%b.n] = b.finished
	b.finished += b.events
	b.pktDisc = b.discarded
	b.cur = nil
	b.stats.Packets++
	b.produced.Store(p + 1)
	if b.inline {
		return // written at Commit
	}
	select {
	case b.doorbell <- struct{}{}:
	default:
	}
}

// ErrBadPacket is returned by PutPacket for a packet whose producer-written
// fields cannot be a packet of the stream.
var ErrBadPacket = errors.New("bad packet")

// PutPacket writes pkt, a packet of cpu's stream whose events a producer
// wrote in place (as LTTng's producers write their sub-buffers), as the
// stream's next packet. pkt is SubbufSize bytes: the events from
// PacketHeaderSize on, each with its event header as this format has it
// (compact ones counting from timestamp_begin, then from the event
// before), zeroes after them, and of the header only timestamp_begin,
// timestamp_end and content_size; PutPacket writes the rest of the header
// (magic, UUID, stream ids, packet_size, the sequence number and the
// events discarded so far) in place, so pkt must be writable. events is
// how many events pkt holds.
//
// With a local sink pkt is written before PutPacket returns, and so is
// every packet the channel finished before it; otherwise its content is
// copied into a free sub-buffer for the sink. It returns false, having
// written nothing, when no sub-buffer is free (the caller keeps pkt and
// tries again), and the sink's error. It fails with ErrBadPacket, writing
// nothing, for a packet of the wrong size, whose content_size is not a
// whole number of bytes within it, whose end precedes its beginning, or
// which begins before the stream's last event: the stream stays readable.
// Only in NoOverwrite mode, from the buffer's writer.
func (c *Channel) PutPacket(cpu int, pkt []byte, events uint64) (bool, error) {
	b, err := c.buf(cpu)
	if err != nil {
		return false, err
	}
	if c.cfg.Mode != NoOverwrite {
		return false, fmt.Errorf("putting a packet: %w: flight-recorder buffers are the channel's", ErrWrongMode)
	}
	le := binary.LittleEndian
	if len(pkt) != b.size {
		return false, fmt.Errorf("%w: %d bytes, the stream's packets have %d", ErrBadPacket, len(pkt), b.size)
	}
	begin, end := le.Uint64(pkt[offTimestampBegin:]), le.Uint64(pkt[offTimestampEnd:])
	content := le.Uint64(pkt[offContentSize:])
	switch {
	case content%8 != 0 || content < PacketHeaderSize*8 || content > uint64(b.size)*8:
		return false, fmt.Errorf("%w: content size %d bits in a packet of %d bytes", ErrBadPacket, content, b.size)
	case end < begin:
		return false, fmt.Errorf("%w: ends at %d, before its beginning %d", ErrBadPacket, end, begin)
	case begin < b.lastTS:
		return false, fmt.Errorf("%w: begins at %d, before the stream's last event at %d", ErrBadPacket, begin, b.lastTS)
	}
	if b.cur != nil {
		// A packet the channel opened (to carry losses) goes first.
		b.finish()
	}
	if !b.inline {
		if !b.open(begin) {
			b.wantRoom.Store(true)
			// The sink may have freed one since open looked: nobody
			// would call Room for it.
			if b.produced.Load()-b.consumed.Load() < b.n {
				b.roomFreed()
			}
			return false, nil
		}
		copy(b.cur[PacketHeaderSize:], pkt[PacketHeaderSize:content/8])
		b.off, b.events, b.lastTS = int(content/8), events, end
		b.finish()
		return true, nil
	}
	b.writeOut()
	h := b.hdr
	h.TimestampBegin, h.TimestampEnd, h.ContentSize = begin, end, content
	if b.seq == 1 {
		if bg := c.begin.Load(); bg != 0 && bg < begin {
			h.TimestampBegin = bg
		}
		b.firstTS = h.TimestampBegin
	}
	h.SeqNum, h.EventsDiscarded = b.seq, b.discarded-b.discBase
	PutPacketHeader(pkt, &h)
	b.seq++
	b.opens++
	b.put++
	b.lastTS = end
	b.stats.Packets++
	b.stats.Records += events
	b.stats.Bytes += content/8 - PacketHeaderSize
	b.finished += events
	b.pktDisc = b.discarded
	if err := b.emit(pkt, events); err != nil {
		return false, err
	}
	return true, nil
}

// roomFreed calls Config.Room if PutPacket waits for a sub-buffer.
func (b *buffer) roomFreed() {
	if b.wantRoom.Swap(false) && b.ch.cfg.Room != nil {
		b.ch.cfg.Room()
	}
}

// Run starts a Run on cpu's buffer (the one buffer in global mode) at its
// current state. A Run on an unknown cpu, on a buffer with no open
// sub-buffer or on a global channel (whose events carry the CPU as their
// context, which Put does not write) refuses every event.
func (c *Channel) Run(cpu int) Run {
	b, err := c.buf(cpu)
	if err != nil {
		return Run{}
	}
	return newRun(b, uint32(cpu))
}
