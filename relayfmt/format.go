package relayfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic opens every packet (CTF 1.8 packet.header.magic).
const Magic uint32 = 0xC1FC1FC1

// Packet header and context layout. Every field is little-endian and
// byte-aligned; the offsets must match the packet.header and
// packet.context structures that metadata.go declares.
const (
	offMagic            = 0  // uint32 magic
	offUUID             = 4  // uint8 uuid[16]
	offStreamID         = 20 // uint32 stream_id (always 0: one stream class)
	offStreamInstanceID = 24 // uint64 stream_instance_id (the CPU, 0 in global mode)
	offTimestampBegin   = 32 // uint64 timestamp_begin
	offTimestampEnd     = 40 // uint64 timestamp_end
	offContentSize      = 48 // uint64 content_size, in bits
	offPacketSize       = 56 // uint64 packet_size, in bits
	offPacketSeqNum     = 64 // uint64 packet_seq_num
	offEventsDiscarded  = 72 // uint64 events_discarded, running total of the stream
	offCPUID            = 80 // uint32 cpu_id

	// PacketHeaderSize is the size in bytes of the packet header and
	// context together: the first event starts at this offset.
	PacketHeaderSize = 84
)

// The offsets of the packet header's fields a producer writing packets in
// place fills (Channel.PutPacket): the BPF writers of packet mode
// (bpf/kc/pkt.h, KC_PKT_*) write these and keep their commit word where
// packet_seq_num goes until PutPacket writes it.
const (
	OffTimestampBegin = offTimestampBegin
	OffTimestampEnd   = offTimestampEnd
	OffContentSize    = offContentSize
	OffPacketSeqNum   = offPacketSeqNum
)

// Event header sizes. The compact header is one little-endian uint32: the
// event id in bits 0-4 and the low 27 bits of the timestamp in bits 5-31.
// The extended header is a byte whose low 5 bits hold ExtendedID, then a
// uint32 id and a uint64 timestamp (13 bytes). This mirrors LTTng's
// event_header_compact, so CTF readers already know it.
const (
	CompactHeaderSize  = 4
	ExtendedHeaderSize = 13

	// ExtendedID in the 5-bit id says the extended header follows.
	ExtendedID = 31
	// MaxCompactID is the largest event id a compact header can hold.
	MaxCompactID = 30
	// CompactTimestampBits is the width of the compact timestamp.
	CompactTimestampBits = 27
	compactTSMask        = 1<<CompactTimestampBits - 1
)

// Sub-buffer size bounds. A sub-buffer is one packet.
const (
	PageSize      = 4096
	MinSubbufSize = PageSize
	MaxSubbufSize = 256 << 20
	MinSubbufs    = 2
	MaxSubbufs    = 1 << 16
)

// PacketHeader is the decoded packet header and context of one packet.
type PacketHeader struct {
	UUID             [16]byte
	StreamID         uint32
	StreamInstanceID uint64
	TimestampBegin   uint64
	TimestampEnd     uint64
	ContentSize      uint64 // bits, header included
	PacketSize       uint64 // bits, padding included
	SeqNum           uint64
	EventsDiscarded  uint64 // running total for the stream
	CPUID            uint32
}

// ErrBadMagic is returned when a packet does not start with Magic.
var ErrBadMagic = errors.New("bad packet magic")

// PutPacketHeader encodes h into the first PacketHeaderSize bytes of b.
// It panics if b is shorter; callers own b's size.
func PutPacketHeader(b []byte, h *PacketHeader) {
	_ = b[PacketHeaderSize-1]
	le := binary.LittleEndian
	le.PutUint32(b[offMagic:], Magic)
	copy(b[offUUID:offUUID+16], h.UUID[:])
	le.PutUint32(b[offStreamID:], h.StreamID)
	le.PutUint64(b[offStreamInstanceID:], h.StreamInstanceID)
	le.PutUint64(b[offTimestampBegin:], h.TimestampBegin)
	le.PutUint64(b[offTimestampEnd:], h.TimestampEnd)
	le.PutUint64(b[offContentSize:], h.ContentSize)
	le.PutUint64(b[offPacketSize:], h.PacketSize)
	le.PutUint64(b[offPacketSeqNum:], h.SeqNum)
	le.PutUint64(b[offEventsDiscarded:], h.EventsDiscarded)
	le.PutUint32(b[offCPUID:], h.CPUID)
}

// ParsePacketHeader decodes the header at the start of b. It fails with
// io.ErrUnexpectedEOF if b is too short and ErrBadMagic if the magic is
// wrong; it checks nothing else.
func ParsePacketHeader(b []byte) (PacketHeader, error) {
	var h PacketHeader
	if len(b) < PacketHeaderSize {
		return h, fmt.Errorf("packet header: %w", errShort)
	}
	le := binary.LittleEndian
	if m := le.Uint32(b[offMagic:]); m != Magic {
		return h, fmt.Errorf("%w %#08x", ErrBadMagic, m)
	}
	copy(h.UUID[:], b[offUUID:offUUID+16])
	h.StreamID = le.Uint32(b[offStreamID:])
	h.StreamInstanceID = le.Uint64(b[offStreamInstanceID:])
	h.TimestampBegin = le.Uint64(b[offTimestampBegin:])
	h.TimestampEnd = le.Uint64(b[offTimestampEnd:])
	h.ContentSize = le.Uint64(b[offContentSize:])
	h.PacketSize = le.Uint64(b[offPacketSize:])
	h.SeqNum = le.Uint64(b[offPacketSeqNum:])
	h.EventsDiscarded = le.Uint64(b[offEventsDiscarded:])
	h.CPUID = le.Uint32(b[offCPUID:])
	return h, nil
}

// needsExtended reports whether an event needs the extended header: its
// id does not fit the 5-bit field, or 2^27 ns or more passed since the last
// full timestamp of the stream (a readers rebuilds compact timestamps
// assuming at most one wrap, as babeltrace2 does).
func needsExtended(id uint32, ts, lastFull uint64) bool {
	return id > MaxCompactID || ts-lastFull > compactTSMask
}

// putEventHeader writes the compact or extended header for (id, ts) at the
// start of b and returns its size. b must hold ExtendedHeaderSize bytes.
func putEventHeader(b []byte, id uint32, ts uint64, extended bool) int {
	if !extended {
		binary.LittleEndian.PutUint32(b, id|uint32(ts&compactTSMask)<<5)
		return CompactHeaderSize
	}
	_ = b[ExtendedHeaderSize-1]
	b[0] = ExtendedID
	binary.LittleEndian.PutUint32(b[1:], id)
	binary.LittleEndian.PutUint64(b[5:], ts)
	return ExtendedHeaderSize
}

// parseEventHeader decodes the event header at the start of b given the
// stream clock clk (the last timestamp seen). It returns the id, the full
// timestamp, the header size, or n == 0 if b is too short.
func parseEventHeader(b []byte, clk uint64) (id uint32, ts uint64, n int) {
	if len(b) < CompactHeaderSize {
		return 0, 0, 0
	}
	if b[0]&31 != ExtendedID {
		w := binary.LittleEndian.Uint32(b)
		low := uint64(w >> 5)
		ts = clk&^compactTSMask | low
		if low < clk&compactTSMask {
			ts += 1 << CompactTimestampBits
		}
		return w & 31, ts, CompactHeaderSize
	}
	if len(b) < ExtendedHeaderSize {
		return 0, 0, 0
	}
	return binary.LittleEndian.Uint32(b[1:]), binary.LittleEndian.Uint64(b[5:]), ExtendedHeaderSize
}
