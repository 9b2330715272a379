package relayfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Trace is an opened trace directory: its metadata and stream files.
type Trace struct {
	Dir  string
	Meta *Metadata
	// Streams are the stream file names, ordered by stream number.
	Streams []string
}

// ChunksDir is the directory of a rotated trace's closed chunks, in the
// directory of its current one (LTTng's "archives").
const ChunksDir = "archives"

// Open reads dir's metadata and lists its stream files ("trace" or
// "trace<N>"). Dot-files, an "index" directory (LTTng's packet
// indexes, as lttng-relayd writes them) and a rotated trace's closed
// chunks (ChunksDir) are ignored, as CTF readers do;
// any other entry is an error, because babeltrace2 would reject the trace
// for it.
//
// A directory with no metadata of its own but a trace in its "kernel"
// subdirectory is an LTTng session directory (as record --profile lttng
// writes one): Open opens that trace, and Trace.Dir names it.
func Open(dir string) (*Trace, error) {
	dir = TraceDir(dir)
	f, err := os.Open(filepath.Join(dir, MetadataFile))
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	// Packetized metadata (as lttng-relayd stores what kconsume streams)
	// spends a header on every 4 KiB of text.
	text, err := io.ReadAll(io.LimitReader(f, 2*MaxMetadataSize+1))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("open trace: read metadata: %w", err)
	}
	var packets *[16]byte
	if IsPacketizedMetadata(text) {
		var uuid [16]byte
		if text, uuid, err = UnpacketizeMetadata(text); err != nil {
			return nil, fmt.Errorf("open trace %s: %w", dir, err)
		}
		packets = &uuid
	}
	meta, err := ParseMetadata(text)
	if err != nil {
		return nil, fmt.Errorf("open trace %s: %w", dir, err)
	}
	if packets != nil && *packets != meta.UUID {
		return nil, fmt.Errorf("open trace %s: metadata packets carry uuid %s, the trace declares %s", dir, formatUUID(*packets), formatUUID(meta.UUID))
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	t := &Trace{Dir: dir, Meta: meta}
	num := map[string]int{}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || name == MetadataFile {
			continue
		}
		if (name == "index" || name == ChunksDir) && e.IsDir() {
			// LTTng's packet indexes (lttng-relayd writes them beside
			// the streams it receives), which CTF readers take or not,
			// and a rotated trace's closed chunks, traces of their own
			// that CTF readers pass over in a trace's directory.
			continue
		}
		n, ok := streamNumber(name, meta.Global)
		if !ok || !e.Type().IsRegular() {
			return nil, fmt.Errorf("open trace %s: unexpected entry %q (only metadata, trace files and dot-files may be there)", dir, name)
		}
		num[name] = n
		t.Streams = append(t.Streams, name)
	}
	sort.Slice(t.Streams, func(i, j int) bool { return num[t.Streams[i]] < num[t.Streams[j]] })
	return t, nil
}

func streamNumber(name string, global bool) (int, bool) {
	if global {
		return 0, name == "trace"
	}
	rest, ok := strings.CutPrefix(name, "trace")
	if !ok || rest == "" || len(rest) > 1 && rest[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

// ItemKind says what an Item is.
type ItemKind uint8

const (
	// EventItem is one event.
	EventItem ItemKind = iota + 1
	// DiscardedEvents says Count events were lost in the stream between
	// Begin and End (end of the previous packet, end of this packet).
	DiscardedEvents
	// DiscardedPackets says Count packets are missing between Begin and
	// End (end of the previous packet, beginning of this one).
	DiscardedPackets
)

// Item is one event or one loss notice of a stream. Its Payload aliases
// the reader's buffer and is valid until the next call to Next.
type Item struct {
	Kind   ItemKind
	Stream string // stream file name
	CPU    uint32
	// Time is the event's timestamp; a notice sorts at its packet's
	// timestamp_begin.
	Time       uint64
	Begin, End uint64 // notices
	Count      uint64 // notices
	Class      *EventClass
	Payload    []byte
	Offset     int64 // file offset of the event or packet

	// offs is where each field of Payload begins, and its end, as the
	// reader src laid out its event number gen: a copy of the item kept
	// past Next decodes its Payload afresh instead.
	offs []uint32
	src  *StreamReader
	gen  uint64
}

// Fields decodes the item's payload into dst (reused) and returns it. It
// fails for a notice, which has no fields.
func (it *Item) Fields(dst []Value) ([]Value, error) {
	if it.Kind != EventItem || it.Class == nil {
		return dst[:0], errors.New("a loss notice has no fields")
	}
	if it.src != nil && it.gen == it.src.gen && len(it.offs) == len(it.Class.Fields)+1 {
		return it.Class.values(it.Payload, it.offs, dst[:0]), nil
	}
	return it.Class.Decode(it.Payload, dst[:0])
}

// StreamReader iterates the packets and events of one stream file in
// order. It checks every length and offset against the file and the packet
// before use, so corrupt or truncated input ends the iteration with an
// error naming the file and byte offset. It is not safe for concurrent use.
type StreamReader struct {
	meta *Metadata
	name string
	f    io.ReaderAt
	file *os.File
	size int64

	next    int64 // offset of the next packet
	good    int64 // end of the last packet read whole
	pktOff  int64
	hdr     PacketHeader
	buf     []byte   // current packet's content
	offs    []uint32 // field offsets of the current event
	gen     uint64   // events read, to tell the current item from a copy
	inPkt   bool     // buf holds a packet not yet read to its end
	pos     int
	clock   uint64
	packets int

	havePrev  bool
	prevEnd   uint64
	prevSeq   uint64
	prevDisc  uint64
	instance  uint64
	notices   [2]Item
	nnotices  int
	noticeIdx int

	item Item
	err  error
}

// OpenStream opens the stream file path of a trace described by meta.
func OpenStream(meta *Metadata, path string) (*StreamReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open stream: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open stream: %w", err)
	}
	s := NewStreamReader(meta, filepath.Base(path), f, fi.Size())
	s.file = f
	return s, nil
}

// NewStreamReader reads a stream of size bytes from r; name is used in
// errors and items.
func NewStreamReader(meta *Metadata, name string, r io.ReaderAt, size int64) *StreamReader {
	return &StreamReader{meta: meta, name: name, f: r, size: size}
}

// Close closes the file OpenStream opened.
func (s *StreamReader) Close() error {
	if s.file != nil {
		err := s.file.Close()
		s.file = nil
		return err
	}
	return nil
}

// Err returns the error that ended the iteration, or nil at a clean end.
func (s *StreamReader) Err() error { return s.err }

// Item returns the current item; valid after Next returned true.
func (s *StreamReader) Item() *Item { return &s.item }

// Packet returns the header of the current packet and its file offset.
func (s *StreamReader) Packet() (PacketHeader, int64) { return s.hdr, s.pktOff }

// Packets returns how many packets were read whole so far.
func (s *StreamReader) Packets() int { return s.packets }

// GoodSize returns the offset just past the last packet whose every event
// was read: what Recover keeps.
func (s *StreamReader) GoodSize() int64 { return s.good }

func (s *StreamReader) fail(off int64, format string, args ...any) bool {
	s.err = fmt.Errorf("%s: offset %d: %s", s.name, off, fmt.Sprintf(format, args...))
	return false
}

// Next moves to the next item and reports whether there is one.
func (s *StreamReader) Next() bool {
	if s.err != nil {
		return false
	}
	for {
		if s.noticeIdx < s.nnotices {
			s.item = s.notices[s.noticeIdx]
			s.noticeIdx++
			return true
		}
		if s.pos < len(s.buf) {
			return s.event()
		}
		if s.inPkt {
			s.inPkt = false
			s.packets++
			s.good = s.next
		}
		if s.next >= s.size {
			return false
		}
		if !s.packet() {
			return false
		}
	}
}

// packet reads and checks the header of the packet at s.next and its
// content.
func (s *StreamReader) packet() bool {
	off := s.next
	var hb [PacketHeaderSize]byte
	if s.size-off < PacketHeaderSize {
		return s.fail(off, "truncated packet header: %d bytes left: %v", s.size-off, io.ErrUnexpectedEOF)
	}
	if _, err := s.f.ReadAt(hb[:], off); err != nil {
		return s.fail(off, "read packet header: %v", err)
	}
	h, err := ParsePacketHeader(hb[:])
	if err != nil {
		return s.fail(off, "%v", err)
	}
	psize, csize := h.PacketSize/8, h.ContentSize/8
	switch {
	case h.UUID != s.meta.UUID:
		return s.fail(off, "packet uuid %s is not the trace's %s", formatUUID(h.UUID), formatUUID(s.meta.UUID))
	case h.StreamID != 0:
		return s.fail(off, "stream id %d, want 0", h.StreamID)
	case h.PacketSize%8 != 0 || h.ContentSize%8 != 0:
		return s.fail(off, "packet size %d or content size %d bits is not whole bytes", h.PacketSize, h.ContentSize)
	case psize < PacketHeaderSize || psize > MaxSubbufSize:
		return s.fail(off, "packet size %d bytes out of range %d..%d", psize, PacketHeaderSize, MaxSubbufSize)
	case csize < PacketHeaderSize || csize > psize:
		return s.fail(off, "content size %d bytes out of range %d..%d (packet size)", csize, PacketHeaderSize, psize)
	case int64(psize) > s.size-off:
		return s.fail(off, "truncated packet: %d bytes, %d left in file: %v", psize, s.size-off, io.ErrUnexpectedEOF)
	case h.TimestampBegin > h.TimestampEnd:
		return s.fail(off, "timestamp_begin %d after timestamp_end %d", h.TimestampBegin, h.TimestampEnd)
	case s.havePrev && h.TimestampBegin < s.prevEnd:
		return s.fail(off, "timestamp_begin %d before the previous packet's end %d", h.TimestampBegin, s.prevEnd)
	case s.havePrev && h.SeqNum <= s.prevSeq:
		return s.fail(off, "packet_seq_num %d does not follow %d", h.SeqNum, s.prevSeq)
	case s.havePrev && h.EventsDiscarded < s.prevDisc:
		return s.fail(off, "events_discarded %d went down from %d", h.EventsDiscarded, s.prevDisc)
	case s.havePrev && h.StreamInstanceID != s.instance:
		return s.fail(off, "stream instance %d, the stream began as %d", h.StreamInstanceID, s.instance)
	}
	if cap(s.buf) < int(csize) {
		s.buf = make([]byte, csize)
	}
	s.buf = s.buf[:csize]
	if _, err := s.f.ReadAt(s.buf, off); err != nil {
		return s.fail(off, "read packet: %v", err)
	}
	s.inPkt = true
	s.nnotices, s.noticeIdx = 0, 0
	base := Item{Stream: s.name, CPU: h.CPUID, Time: h.TimestampBegin, Offset: off, End: h.TimestampEnd}
	if s.havePrev {
		base.Begin = s.prevEnd
		if h.SeqNum != s.prevSeq+1 {
			n := base
			n.Kind, n.Count, n.End = DiscardedPackets, h.SeqNum-s.prevSeq-1, h.TimestampBegin
			s.notices[s.nnotices] = n
			s.nnotices++
		}
	} else {
		base.Begin = h.TimestampBegin
	}
	if d := h.EventsDiscarded - s.prevDisc; d > 0 {
		n := base
		n.Kind, n.Count = DiscardedEvents, d
		s.notices[s.nnotices] = n
		s.nnotices++
	}
	s.hdr, s.pktOff, s.next = h, off, off+int64(psize)
	s.havePrev, s.prevEnd, s.prevSeq, s.prevDisc, s.instance = true, h.TimestampEnd, h.SeqNum, h.EventsDiscarded, h.StreamInstanceID
	s.pos = PacketHeaderSize
	s.clock = h.TimestampBegin
	return true
}

// event decodes the event at s.pos.
func (s *StreamReader) event() bool {
	b := s.buf[s.pos:]
	off := s.pktOff + int64(s.pos)
	id, ts, n := parseEventHeader(b, s.clock)
	if n == 0 {
		return s.fail(off, "truncated event header: %v", io.ErrUnexpectedEOF)
	}
	if ts < s.clock || ts > s.hdr.TimestampEnd {
		return s.fail(off, "event timestamp %d outside %d..%d (previous event to packet end)", ts, s.clock, s.hdr.TimestampEnd)
	}
	cpu := s.hdr.CPUID
	if s.meta.Global {
		if len(b) < n+4 {
			return s.fail(off, "truncated event context: %v", io.ErrUnexpectedEOF)
		}
		cpu = binary.LittleEndian.Uint32(b[n:])
		n += 4
	}
	cls := s.meta.Class(id)
	if cls == nil {
		return s.fail(off, "unknown event id %d", id)
	}
	if s.offs == nil {
		s.offs = make([]uint32, MaxFields+1)
	}
	offs, size, err := cls.layout(b[n:], s.offs)
	if err != nil {
		return s.fail(off, "%v", err)
	}
	s.gen++
	it := &s.item
	if it.src != s {
		*it = Item{Kind: EventItem, Stream: s.name, src: s} // after a notice (no src), or first
	}
	it.CPU, it.Time, it.Class, it.Payload, it.Offset, it.offs, it.gen = cpu, ts, cls, b[n:n+size], off, offs, s.gen
	s.clock = ts
	s.pos += n + size
	return true
}

// Merger merges the streams of a trace by time: ties go to the lower
// stream number (the CPU). Items of one stream keep their order.
type Merger struct {
	streams []*StreamReader
	heap    []mergeHead // a min-heap on (time, stream)
	last    int         // stream whose item was returned, to advance on Next
	err     error
}

// mergeHead is a stream in the merge heap with its current item's time,
// kept beside the index so sifting reads no item.
type mergeHead struct {
	time   uint64
	stream int
}

// NewMerger merges the given streams.
func NewMerger(streams []*StreamReader) *Merger {
	m := &Merger{streams: streams, last: -1}
	for i, s := range streams {
		if s.Next() {
			m.heap = append(m.heap, mergeHead{s.item.Time, i})
		} else if s.Err() != nil && m.err == nil {
			m.err = s.Err()
		}
	}
	for i := len(m.heap)/2 - 1; i >= 0; i-- {
		m.down(i)
	}
	return m
}

// Events returns how many events t's streams hold, read in merged
// order (loss notices are not events). It fails as Merge does, or with
// the first stream that cannot be read to its end.
func (t *Trace) Events() (uint64, error) {
	m, err := t.Merge()
	if err != nil {
		return 0, err
	}
	defer m.Close()
	var n uint64
	for m.Next() {
		if m.Item().Kind == EventItem {
			n++
		}
	}
	return n, m.Err()
}

// Merge opens every stream of t and returns a merger over them. Close it
// to close the files.
func (t *Trace) Merge() (*Merger, error) {
	var ss []*StreamReader
	for _, name := range t.Streams {
		s, err := OpenStream(t.Meta, filepath.Join(t.Dir, name))
		if err != nil {
			for _, s := range ss {
				s.Close()
			}
			return nil, err
		}
		ss = append(ss, s)
	}
	return NewMerger(ss), nil
}

func (m *Merger) less(a, b int) bool {
	ha, hb := &m.heap[a], &m.heap[b]
	if ha.time != hb.time {
		return ha.time < hb.time
	}
	return ha.stream < hb.stream
}

func (m *Merger) down(i int) {
	n := len(m.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		j := l
		if r := l + 1; r < n && m.less(r, l) {
			j = r
		}
		if !m.less(j, i) {
			return
		}
		m.heap[i], m.heap[j] = m.heap[j], m.heap[i]
		i = j
	}
}

// Next moves to the next item in time order. It stops at the first
// stream error.
func (m *Merger) Next() bool {
	if m.err != nil {
		return false
	}
	if m.last >= 0 {
		s := m.streams[m.heap[0].stream]
		if s.Next() {
			m.heap[0].time = s.item.Time
		} else {
			if s.Err() != nil {
				m.err = s.Err()
				return false
			}
			last := len(m.heap) - 1
			m.heap[0] = m.heap[last]
			m.heap = m.heap[:last]
		}
		if len(m.heap) > 0 {
			m.down(0)
		}
	}
	if len(m.heap) == 0 {
		m.last = -1
		return false
	}
	m.last = m.heap[0].stream
	return true
}

// Item returns the current item.
func (m *Merger) Item() *Item { return m.streams[m.last].Item() }

// Err returns the error that stopped the merge, or nil.
func (m *Merger) Err() error { return m.err }

// Close closes every stream.
func (m *Merger) Close() error {
	var errs []error
	for _, s := range m.streams {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// TraceDir returns the directory of the trace that dir names: dir, or its
// "kernel" subdirectory when dir has no metadata file and that does (an
// LTTng session directory, SESSION/kernel/).
func TraceDir(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, MetadataFile)); err == nil {
		return dir
	}
	sub := filepath.Join(dir, "kernel")
	if _, err := os.Stat(filepath.Join(sub, MetadataFile)); err == nil {
		return sub
	}
	return dir
}
