package relayfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// StreamTally is what a stream file holds, read to its end: the count of
// its events, the events it says were discarded (the last packet's
// running total) and its last packet's header.
type StreamTally struct {
	Stream    int // the stream number of its name ("trace<N>"; 0 for "trace")
	Events    uint64
	Discarded uint64
	Packets   int
	Last      PacketHeader // valid when Packets > 0
}

// TallyStream reads the stream file name of t to its end and counts what
// it holds. It fails when the file cannot be read or holds a packet that
// is not whole (Recover cuts those first).
func TallyStream(t *Trace, name string) (StreamTally, error) {
	n, ok := streamNumber(name, t.Meta.Global)
	if !ok {
		return StreamTally{}, fmt.Errorf("tally %s: not a stream file name", name)
	}
	s, err := OpenStream(t.Meta, filepath.Join(t.Dir, name))
	if err != nil {
		return StreamTally{}, fmt.Errorf("tally: %w", err)
	}
	defer s.Close()
	st := StreamTally{Stream: n}
	for s.Next() {
		if s.Item().Kind == EventItem {
			st.Events++
		}
	}
	if s.Err() != nil {
		return st, fmt.Errorf("tally %s: %w", name, s.Err())
	}
	if st.Packets = s.Packets(); st.Packets > 0 {
		st.Last, _ = s.Packet()
		st.Discarded = st.Last.EventsDiscarded
	}
	return st, nil
}

// StreamFile returns the name of stream n's file in a trace: "trace" in
// global mode, else "trace<n>".
func StreamFile(n int, global bool) string {
	if global {
		return "trace"
	}
	return "trace" + strconv.Itoa(n)
}

// Appender adds packets to the end of a stream file of a trace that
// was cut off (a recording killed, then Recover): the packets a recorder
// left in its rings, and an empty packet that counts the events lost.
type Appender struct {
	t     *Trace
	name  string
	f     *os.File
	off   int64
	h     PacketHeader // the header of the next packet
	tally StreamTally
}

// OpenAppender reads stream n of t to its end (creating its file when it
// does not exist yet) and returns an Appender that writes after its last
// packet. It fails when the file holds a packet that is not whole
// (Recover cuts those first) or cannot be opened.
//
// A stream file it creates begins at the end of the trace's last packet,
// a time the recording reached.
func OpenAppender(t *Trace, n int) (*Appender, error) {
	a := &Appender{t: t, name: StreamFile(n, t.Meta.Global)}
	a.h = PacketHeader{UUID: t.Meta.UUID, StreamInstanceID: uint64(n), CPUID: uint32(n)}
	a.h.TimestampBegin = t.lastEnd()
	a.tally.Stream = n
	path := filepath.Join(t.Dir, a.name)
	switch fi, err := os.Stat(path); {
	case err == nil:
		if a.tally, err = TallyStream(t, a.name); err != nil {
			return nil, fmt.Errorf("append: %w", err)
		}
		if a.tally.Packets > 0 {
			a.h = a.tally.Last
			a.h.SeqNum++
			a.h.TimestampBegin = a.h.TimestampEnd
		}
		a.off = fi.Size()
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("append: %w", err)
	}
	a.h.EventsDiscarded = a.tally.Discarded
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	a.f = f
	return a, nil
}

// Tally returns what the stream holds so far.
func (a *Appender) Tally() StreamTally { return a.tally }

// Packet appends pkt, a packet a producer wrote in place as
// Channel.PutPacket takes them (of the packet header, only
// timestamp_begin, timestamp_end and content_size set), holding events
// events; it writes the rest of the header and zeroes the padding, in
// pkt. It fails with ErrBadPacket, writing nothing, for a packet that is
// not of the trace's size, whose content size is out of range, or whose
// time is not after the stream's last packet; and when the file cannot be
// written.
func (a *Appender) Packet(pkt []byte, events uint64) error {
	le := binary.LittleEndian
	begin, end := le.Uint64(pkt[offTimestampBegin:]), le.Uint64(pkt[offTimestampEnd:])
	content := le.Uint64(pkt[offContentSize:])
	switch {
	case len(pkt) != a.t.Meta.SubbufSize:
		return fmt.Errorf("%w: %d bytes, the stream's packets have %d", ErrBadPacket, len(pkt), a.t.Meta.SubbufSize)
	case content%8 != 0 || content < PacketHeaderSize*8 || content > uint64(len(pkt))*8:
		return fmt.Errorf("%w: content size %d bits in a packet of %d bytes", ErrBadPacket, content, len(pkt))
	case end < begin || a.tally.Packets > 0 && begin < a.h.TimestampBegin:
		return fmt.Errorf("%w: from %d to %d, the stream's last packet ends at %d", ErrBadPacket, begin, end, a.h.TimestampBegin)
	}
	h := a.h
	h.TimestampBegin, h.TimestampEnd, h.ContentSize = begin, end, content
	clear(pkt[content/8:])
	if err := a.write(pkt, &h); err != nil {
		return err
	}
	a.tally.Events += events
	return nil
}

// Discarded appends an empty packet that says lost more events were
// discarded after the stream's last one, so that babeltrace2 prints the
// loss there. It fails when the file cannot be written.
func (a *Appender) Discarded(lost uint64) error {
	if lost == 0 {
		return nil
	}
	if a.tally.Packets == 0 {
		// babeltrace2 gives no count for the losses of a stream's
		// first packet: an empty one goes before.
		h := a.h
		h.TimestampEnd, h.ContentSize = h.TimestampBegin, PacketHeaderSize*8
		if err := a.write(make([]byte, a.t.Meta.SubbufSize), &h); err != nil {
			return err
		}
	}
	h := a.h
	h.EventsDiscarded += lost
	h.TimestampEnd, h.ContentSize = h.TimestampBegin, PacketHeaderSize*8
	if err := a.write(make([]byte, a.t.Meta.SubbufSize), &h); err != nil {
		return err
	}
	a.tally.Discarded += lost
	return nil
}

// write completes h into pkt's header and writes pkt after the stream's
// last packet.
func (a *Appender) write(pkt []byte, h *PacketHeader) error {
	h.PacketSize = uint64(len(pkt)) * 8
	PutPacketHeader(pkt, h)
	if _, err := a.f.WriteAt(pkt, a.off); err != nil {
		return fmt.Errorf("append to %s: %w", a.name, err)
	}
	a.off += int64(len(pkt))
	a.tally.Packets++
	a.tally.Last = *h
	a.h = *h
	a.h.SeqNum++
	a.h.TimestampBegin = h.TimestampEnd
	return nil
}

// Close syncs the file and closes it.
func (a *Appender) Close() error {
	err := a.f.Sync()
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("append to %s: %w", a.name, err)
	}
	return nil
}

// lastEnd returns the latest timestamp_end of the last packets of t's
// stream files, or 0. Every packet of a stream file is SubbufSize bytes,
// so the last one's header is at the file's size less that; a file whose
// size is not a whole number of packets is passed over.
func (t *Trace) lastEnd() uint64 {
	var end uint64
	size := int64(t.Meta.SubbufSize)
	for _, name := range t.Streams {
		f, err := os.Open(filepath.Join(t.Dir, name))
		if err != nil {
			continue
		}
		var b [PacketHeaderSize]byte
		if fi, err := f.Stat(); err == nil && fi.Size() >= size && fi.Size()%size == 0 {
			if _, err := f.ReadAt(b[:], fi.Size()-size); err == nil {
				if h, err := ParsePacketHeader(b[:]); err == nil {
					end = max(end, h.TimestampEnd)
				}
			}
		}
		f.Close()
	}
	return end
}
