package relayd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kconsume/kconsume/relayfmt"
)

// ErrNotSent wraps the error of every packet the sink could not send:
// relayd never confirmed it.
var ErrNotSent = errors.New("packet not sent to relayd")

// DomainPath is the directory, under the session's directory on relayd,
// that holds the trace (LTTng's kernel domain directory).
const DomainPath = "kernel"

// Config says where and how a Sink streams.
type Config struct {
	URL     URL
	Session Session
	// Streams are the stream file names the channel will write ("trace0",
	// …, or "trace" in global mode); they are announced to relayd at once,
	// so live viewers see every stream from the start. A packet for a name
	// not listed adds its stream then.
	Streams []string
}

// Stats counts what a Sink did.
type Stats struct {
	Sent       uint64 // packets relayd confirmed
	Bytes      uint64 // bytes of those packets
	NotSent    uint64 // packets that never reached relayd, or that it never confirmed
	Reconnects uint64 // sessions created again after relayd was lost
	Err        error  // why the sink stopped sending, or nil
}

// Sink streams a channel to lttng-relayd: it implements relayfmt.Sink.
// Each packet goes on the data connection behind its data header, then
// its index on the control connection; metadata goes on the control
// connection. After a network error the sink sends nothing more until
// Reconnect succeeds: every packet meanwhile fails with ErrNotSent and is
// counted (Stats).
type Sink struct {
	cfg Config

	mmu         sync.Mutex
	metaText    []byte // the channel's latest metadata; relayd has it while connected
	metaVersion uint64
	metaUUID    *[16]byte // the trace's UUID, for the metadata packets' headers

	// mu guards the fields below and the choice of client; lock order:
	// mmu, then a stream's mu, then mu.
	mu      sync.Mutex
	c       *Client
	meta    uint64 // the metadata stream's handle
	streams map[string]*stream
	names   []string // stream names in the order they were added
	err     error
	closed  bool

	// lmu keeps Live and Close apart: no beacon after the streams close.
	lmu sync.Mutex

	sent, bytes, notSent, reconnects atomic.Uint64
}

type stream struct {
	mu     sync.Mutex
	name   string
	handle uint64
	next   uint64 // the next packet's network sequence number
	active bool   // a packet went out since the last live tick
	seqNum uint64 // packet_seq_num of the last packet sent
	// empty is set once Live sent an empty packet for a stream that had
	// none: it stands for the channel's own empty first packet.
	empty bool
	// inChunk is set once a packet went out in the current trace chunk.
	inChunk bool
	// floor is the latest time this stream told relayd about: the end of
	// its last packet or live beacon. Live viewers may have shown other
	// streams' events up to it, so no packet may begin before it.
	floor uint64

	// confirmed counts the packets relayd said it has (data and index);
	// unconfirmed holds the sizes of those sent after them, -1 for a
	// packet that is none of the channel's. mark is the next packet's
	// number when the last check began, at markAt: the next check asks
	// relayd about the packets before it.
	confirmed   uint64
	unconfirmed []int64
	mark        uint64
	markAt      time.Time
}

// NewSink connects to relayd, creates the session and its streams, and
// returns a sink ready for the channel's metadata and packets. It fails,
// saying why, when relayd cannot be reached or refuses the session.
func NewSink(ctx context.Context, cfg Config) (*Sink, error) {
	s := &Sink{cfg: cfg, streams: map[string]*stream{}}
	c, meta, handles, err := s.dial(ctx, cfg.Streams, cfg.Session.BasePath)
	if err != nil {
		return nil, err
	}
	s.c, s.meta = c, meta
	for i, name := range cfg.Streams {
		s.streams[name] = &stream{name: name, handle: handles[i]}
		s.names = append(s.names, name)
	}
	return s, nil
}

// dial creates the session on relayd, under basePath when not empty,
// with the metadata stream and the streams names, and returns the client
// and the handles.
func (s *Sink) dial(ctx context.Context, names []string, basePath string) (c *Client, meta uint64, handles []uint64, err error) {
	sess := s.cfg.Session
	sess.BasePath = basePath
	c, err = Dial(ctx, s.cfg.URL, sess)
	if err != nil {
		return nil, 0, nil, err
	}
	meta, err = c.AddStream(relayfmt.MetadataFile, DomainPath)
	for _, name := range names {
		if err != nil {
			break
		}
		var h uint64
		h, err = c.AddStream(name, DomainPath)
		handles = append(handles, h)
	}
	if err == nil {
		err = c.StreamsSent()
	}
	if err != nil {
		c.Close()
		return nil, 0, nil, fmt.Errorf("relayd %s: %w", s.cfg.URL, err)
	}
	return c, meta, handles, nil
}

// Client returns the sink's current connection to relayd.
func (s *Sink) Client() *Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c
}

// current returns the client to use, or why there is none.
func (s *Sink) current() (*Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	if s.closed {
		return nil, net.ErrClosed
	}
	return s.c, nil
}

// addStream creates the stream name on relayd, once.
func (s *Sink) addStream(name string) (*stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.streams[name]; st != nil {
		return st, nil
	}
	if s.err != nil {
		return nil, s.err
	}
	h, err := s.c.AddStream(name, DomainPath)
	if err == nil {
		err = s.c.StreamsSent()
	}
	if err != nil {
		return nil, err
	}
	st := &stream{name: name, handle: h}
	s.streams[name] = st
	s.names = append(s.names, name)
	return st, nil
}

// stream returns the stream name, adding it on relayd (and publishing it)
// when the channel writes a stream not announced at the start.
func (s *Sink) stream(name string) (*stream, error) {
	s.mu.Lock()
	st := s.streams[name]
	s.mu.Unlock()
	if st != nil {
		return st, nil
	}
	return s.addStream(name)
}

// fail records the first network error of client c and closes it, which
// also ends exchanges other goroutines wait on. An error of a client
// already replaced by Reconnect is not the sink's.
func (s *Sink) fail(c *Client, err error) {
	s.mu.Lock()
	if s.err == nil && s.c == c {
		s.err = err
	}
	s.mu.Unlock()
	c.Close()
}

// Err returns why the sink stopped sending, or nil.
func (s *Sink) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Stats returns the sink's counters.
func (s *Sink) Stats() Stats {
	return Stats{Sent: s.sent.Load(), Bytes: s.bytes.Load(), NotSent: s.notSent.Load(), Reconnects: s.reconnects.Load(), Err: s.Err()}
}

// WritePacket sends packet, a finished packet of stream name, and its
// index, and returns once both are written to the connections; relayd's
// reply to the index is read within the next few packets (SendIndex),
// and the packet counts as sent once relayd confirms it has it. A packet
// whose header cannot be read is refused; a network error stops the
// sink. Either way the packet is counted as not sent and the error wraps
// ErrNotSent.
func (s *Sink) WritePacket(name string, packet []byte) error {
	if err := s.writePacket(name, packet); err != nil {
		s.notSent.Add(1)
		return fmt.Errorf("%w: %s: %w", ErrNotSent, name, err)
	}
	return nil
}

func (s *Sink) writePacket(name string, packet []byte) error {
	if err := s.Err(); err != nil {
		return err
	}
	x, data, padding, err := indexOf(packet)
	if err != nil {
		return err
	}
	st, err := s.stream(name)
	if err != nil {
		if c, cerr := s.current(); cerr == nil {
			s.fail(c, err)
		}
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	c, err := s.current()
	if err != nil {
		return err
	}
	if st.empty && x.PacketSeqNum == 0 && x.ContentSize == 8*relayfmt.PacketHeaderSize {
		// The channel's empty first packet: Live already sent one.
		s.sent.Add(1)
		return nil
	}
	if x.TimestampBegin < st.floor {
		// A stream's first packet begins at the recording's start
		// (relayfmt's Channel.Begin), which a live beacon or Live's empty
		// packet may have passed: a viewer would see time go back. Its
		// events are all after the floor (Live's caller flushed first),
		// so beginning it there keeps every timestamp as it was.
		h, err := relayfmt.ParsePacketHeader(data)
		if err != nil {
			return err
		}
		h.TimestampBegin = st.floor
		h.TimestampEnd = max(h.TimestampEnd, st.floor)
		data = append([]byte(nil), data...)
		relayfmt.PutPacketHeader(data, &h)
		x.TimestampBegin, x.TimestampEnd = h.TimestampBegin, h.TimestampEnd
	}
	return s.send(c, st, x, data, padding, len(packet))
}

// send sends one packet of st and its index. The caller holds st.mu.
func (s *Sink) send(c *Client, st *stream, x Index, data []byte, padding uint32, size int) error {
	x.Stream, x.Seq = st.handle, st.next
	err := c.SendPacket(st.handle, st.next, data, padding)
	if err == nil {
		err = c.SendIndex(&x)
	}
	if err != nil {
		err = fmt.Errorf("packet %d: %w", st.next, err)
		s.fail(c, err)
		return err
	}
	st.next++
	st.active, st.inChunk = true, true
	st.seqNum = x.PacketSeqNum
	st.floor = max(st.floor, x.TimestampEnd)
	s.sent.Add(1)
	s.bytes.Add(uint64(size))
	st.unconfirmed = append(st.unconfirmed, int64(size))
	s.check(c, st)
	return nil
}

// WriteMetadata sends the part of text relayd does not have yet: relayd's
// metadata stream only grows, and the channel's metadata only grows at its
// end. Text that does not extend what was sent is sent whole after a
// metadata reset. It goes as metadata packets (relayfmt.PacketizeMetadata),
// as LTTng's tracers send theirs, so a live viewer can take each part
// alone. It fails if text is not kconsume's metadata or relayd is lost.
func (s *Sink) WriteMetadata(text []byte) error {
	s.mmu.Lock()
	defer s.mmu.Unlock()
	if s.metaUUID == nil {
		m, err := relayfmt.ParseMetadata(text)
		if err != nil {
			return fmt.Errorf("metadata not sent to relayd: %w", err)
		}
		s.metaUUID = &m.UUID
	}
	old := s.metaText
	// Kept even when relayd is lost: Reconnect sends it whole.
	s.metaText = slices.Clone(text)
	c, err := s.current()
	if err != nil {
		return fmt.Errorf("metadata not sent to relayd: %w", err)
	}
	s.mu.Lock()
	meta := s.meta
	s.mu.Unlock()
	tail := text
	if bytes.HasPrefix(text, old) {
		tail = text[len(old):]
	} else {
		s.metaVersion++
		err = c.ResetMetadata(meta, s.metaVersion)
	}
	if err == nil && len(tail) > 0 {
		err = c.SendMetadata(meta, relayfmt.PacketizeMetadata(tail, *s.metaUUID))
	}
	if err != nil {
		s.fail(c, err)
		return fmt.Errorf("metadata not sent to relayd: %w", err)
	}
	return nil
}

// Reconnect creates the session on relayd again after the sink stopped
// sending: a new session directory (relayd names it by its new creation
// time), the streams, the whole metadata. Packets then go there, each
// stream numbered from its next packet, so a reader sees the packets
// relayd never had as a gap. It returns nil at once when nothing failed,
// and fails, saying why, when relayd is still unreachable or refuses.
func (s *Sink) Reconnect(ctx context.Context) error {
	s.mmu.Lock()
	defer s.mmu.Unlock()
	s.mu.Lock()
	failed, closed := s.err, s.closed
	names := slices.Clone(s.names)
	s.mu.Unlock()
	if closed {
		return net.ErrClosed
	}
	if failed == nil {
		return nil
	}
	// A directory of its own: relayd names session directories by the
	// second they were created, and the first one may be that recent.
	n := s.reconnects.Load() + 1
	c, meta, handles, err := s.dial(ctx, names, fmt.Sprintf("%s-%s-%d", s.cfg.Session.Name, time.Now().Format("20060102-150405"), n))
	if err == nil && len(s.metaText) > 0 {
		err = c.SendMetadata(meta, relayfmt.PacketizeMetadata(s.metaText, *s.metaUUID))
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	streams := make([]*stream, len(names))
	for i, name := range names {
		streams[i] = s.streams[name]
	}
	s.mu.Unlock()
	for i, st := range streams {
		st.mu.Lock()
		s.settle(st)
		st.handle, st.next, st.active, st.empty = handles[i], 0, false, false
		st.confirmed, st.mark = 0, 0
		st.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return net.ErrClosed
	}
	s.c, s.meta, s.err = c, meta, nil
	s.reconnects.Add(1)
	return nil
}

// Close waits (at most the session's timeout) until relayd has written
// every packet it confirmed, closes the streams and the connections. It
// returns why the sink stopped sending, if it did, or why closing failed.
// Later calls return nil.
func (s *Sink) Close() error {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	streams := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		streams = append(streams, st)
	}
	s.mu.Unlock()
	s.mu.Lock()
	c, failed, meta := s.c, s.err, s.meta
	s.mu.Unlock()
	if failed != nil {
		c.Close()
		s.settleAll(streams)
		return fmt.Errorf("relayd %s: %w", s.cfg.URL, failed)
	}
	slices.SortFunc(streams, func(a, b *stream) int { return int(a.handle - b.handle) })
	err := s.drain(c, streams)
	if err != nil {
		// What relayd has is confirmed; the rest it never will have.
		for _, st := range streams {
			st.mu.Lock()
			if have, rerr := st.received(c); rerr == nil {
				st.confirm(have)
			}
			s.settle(st)
			st.mu.Unlock()
		}
	}
	for _, st := range streams {
		if err != nil {
			break
		}
		err = c.CloseStream(st.handle, st.next-1) // ^0 when it had no packet
	}
	if err == nil {
		err = c.CloseStream(meta, ^uint64(0))
	}
	if err != nil {
		s.fail(c, err)
		s.settleAll(streams)
		return fmt.Errorf("relayd %s: %w", s.cfg.URL, err)
	}
	return c.Close()
}

// Live tells relayd's live viewers that every stream that sent no packet
// since the previous call has nothing up to ts (in the trace clock): it
// sends such a stream's beacon, an empty index (LTTng's live timer does
// the same). relayd takes beacons only for a stream that had a packet, so
// a stream without any first gets an empty packet stamped ts, which then
// stands for the channel's own empty first packet. The caller flushes the
// channel first, so that nothing stamped before ts is still to come. A
// network error stops the sink as WritePacket's do.
func (s *Sink) Live(ts uint64) error {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	s.mu.Lock()
	closed, err := s.closed, s.err
	streams := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		streams = append(streams, st)
	}
	s.mu.Unlock()
	if closed || err != nil {
		return err
	}
	c, err := s.current()
	if err != nil {
		return err
	}
	// Read before any stream lock (lock order); WriteMetadata replaces,
	// never changes, the slice.
	s.mmu.Lock()
	text := s.metaText
	s.mmu.Unlock()
	var tmpl *relayfmt.Metadata
	for _, st := range streams {
		st.mu.Lock()
		if st.active {
			st.active = false
			st.mu.Unlock()
			continue
		}
		var err error
		if st.next == 0 {
			if tmpl == nil {
				tmpl, err = relayfmt.ParseMetadata(text)
			}
			if err == nil {
				if err = s.sendEmpty(c, st, tmpl, ts); err == nil {
					st.empty = true
				}
			}
		} else {
			err = c.SendIndex(&Index{Stream: st.handle, Seq: st.next - 1, TimestampEnd: ts, PacketSeqNum: st.seqNum})
			if err != nil {
				s.fail(c, err)
			}
			st.floor = max(st.floor, ts)
		}
		st.active = false
		st.mu.Unlock()
		if err != nil {
			return fmt.Errorf("live beacon of %s: %w", st.name, err)
		}
	}
	return nil
}

// sendEmpty sends a packet without events for st, stamped ts, of the
// channel's packet size (relayd writes the padding). The caller holds
// st.mu.
func (s *Sink) sendEmpty(c *Client, st *stream, m *relayfmt.Metadata, ts uint64) error {
	inst, err := instanceOf(st.name)
	if err != nil {
		return err
	}
	h := relayfmt.PacketHeader{UUID: m.UUID, StreamInstanceID: inst, CPUID: uint32(inst),
		TimestampBegin: ts, TimestampEnd: ts, ContentSize: 8 * relayfmt.PacketHeaderSize, PacketSize: 8 * uint64(m.SubbufSize)}
	b := make([]byte, relayfmt.PacketHeaderSize)
	relayfmt.PutPacketHeader(b, &h)
	x := Index{PacketSize: h.PacketSize, ContentSize: h.ContentSize, TimestampBegin: ts, TimestampEnd: ts, StreamInstanceID: inst}
	if err := s.send(c, st, x, b, uint32(m.SubbufSize-relayfmt.PacketHeaderSize), 0); err != nil {
		return err
	}
	s.sent.Add(^uint64(0)) // not one of the channel's packets
	st.unconfirmed[len(st.unconfirmed)-1] = -1
	return nil
}

// instanceOf returns the stream instance id (the CPU) of a stream file
// name: N of traceN, 0 for the global stream "trace".
func instanceOf(name string) (uint64, error) {
	rest, ok := strings.CutPrefix(name, "trace")
	if !ok {
		return 0, fmt.Errorf("stream %q: not a trace stream name", name)
	}
	if rest == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(rest, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("stream %q: not a trace stream name", name)
	}
	return n, nil
}
