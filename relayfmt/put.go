package relayfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
)

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
	if b.stats.Packets == 0 {
		if bg := c.begin.Load(); bg != 0 && bg < begin {
			h.TimestampBegin = bg
		}
		b.firstTS = h.TimestampBegin
	}
	h.SeqNum, h.EventsDiscarded = b.seq, b.discarded
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
