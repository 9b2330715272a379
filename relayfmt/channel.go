package relayfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mode is what a channel does when every sub-buffer is full.
type Mode uint8

const (
	// NoOverwrite drops new records and counts them when no sub-buffer is
	// free (relay's default).
	NoOverwrite Mode = iota
	// Overwrite reuses the oldest sub-buffer (flight recorder); sub-buffers
	// reach the sink only on Snapshot and Close.
	Overwrite
)

// String returns "discard" or "overwrite", the CLI's names.
func (m Mode) String() string {
	if m == Overwrite {
		return "overwrite"
	}
	return "discard"
}

// Config sets up a channel.
type Config struct {
	// SubbufSize is the size of a sub-buffer (one packet): a multiple of
	// 4 KiB from MinSubbufSize to MaxSubbufSize.
	SubbufSize int
	// NSubbufs is the number of sub-buffers per buffer, at least 2.
	NSubbufs int
	// CPUs is the number of per-CPU buffers; stream i is CPU i, file
	// trace<i>. Ignored when Global is set.
	CPUs int
	// Global gives the channel one buffer, file "trace", for all CPUs; each
	// event records its CPU in its context. Only one goroutine may write.
	Global bool
	Mode   Mode
	Clock  Clock
	// Env is written to the metadata env block (hostname, kernel...).
	Env map[string]string
	// UUID identifies the trace; zero means a random one.
	UUID [16]byte
}

// Stats counts what happened in one buffer. Every record passed to Write
// is exactly one of: Records, Dropped, TooLarge, Invalid, Unwritten.
type Stats struct {
	Records     uint64 // written into a sub-buffer the sink took, or may still take
	Bytes       uint64 // event bytes written, headers included
	Dropped     uint64 // no free sub-buffer (NoOverwrite)
	TooLarge    uint64 // larger than a sub-buffer can hold
	Invalid     uint64 // unknown id or payload not matching its class
	Lost        uint64 // reported lost upstream through Discard
	Overwritten uint64 // events lost with overwritten sub-buffers
	Clamped     uint64 // timestamps raised to keep the stream monotonic
	Packets     uint64 // sub-buffers finished
	Written     uint64 // packets handed to the sink
	// Unwritten counts events that reached a sub-buffer or a packet the
	// sink then failed to take (a full disk, a stream the sink refused),
	// and those of packets a caller could not put (Channel.Lose): they
	// are not in Records. The stream's last packet reports them as
	// discarded where the sink can still take it (FinalSink).
	Unwritten uint64
}

// Discarded returns the events lost in this buffer for any reason.
func (s Stats) Discarded() uint64 {
	return s.Dropped + s.TooLarge + s.Invalid + s.Lost + s.Overwritten + s.Unwritten
}

// Errors returned by Write. ErrDropped and ErrTooLarge are counted losses,
// not failures of the channel.
var (
	ErrDropped    = errors.New("record dropped: no free sub-buffer")
	ErrTooLarge   = errors.New("record larger than a sub-buffer")
	ErrInvalid    = errors.New("record does not match its event class")
	ErrNoStream   = errors.New("no such stream")
	ErrClosed     = errors.New("channel closed")
	ErrWrongMode  = errors.New("operation needs overwrite mode")
	ErrNameExists = errors.New("event name already defined")
)

// Channel is a relay channel: per-CPU (or one global) buffers of
// NSubbufs sub-buffers, each sub-buffer a CTF packet, finished sub-buffers
// handed to a Sink.
//
// Concurrency: Write, Discard and the per-buffer operations (FlushCPU,
// ResetCPU, Stats) for one buffer must come from one goroutine at a time,
// the buffer's writer; different buffers may be written concurrently. The
// sink runs in its own goroutines or, for a LocalSink, in the writer's
// Commit (and Flush, Close). AddEventClass is safe at any time.
// Flush, Reset, Snapshot and Close act on every buffer and need every
// writer to be quiescent.
type Channel struct {
	cfg  Config
	sink Sink
	bufs []*buffer
	// global is bufs[0] in global mode, nil otherwise.
	global *buffer

	// classes is the id-indexed class table, replaced whole when a class
	// is added so writers read it without a lock.
	classes atomic.Pointer[[]*EventClass]

	mu     sync.Mutex // metadata changes and Close
	meta   Metadata
	closed bool
	wg     sync.WaitGroup
	quit   chan struct{}
	// failed is closed at the first sink error (Failed).
	failed   chan struct{}
	failOnce sync.Once
	// begin is the trace's start (Begin): every stream's first packet
	// begins there. 0: at its first event.
	begin atomic.Uint64
}

type buffer struct {
	// Writer-owned; the fields every Write touches come first, to share
	// one cache line.
	cur      []byte // current sub-buffer; nil when none is open
	off      int
	lastTS   uint64
	lastFull uint64
	events   uint64 // events in cur
	// sizes caches the fixed payload size of each class id known to this
	// writer (-1: variable). Classes are only appended and ids never change,
	// so the cache is refreshed only when an id beyond it shows up.
	sizes []int32
	// ctx is the size of the event context: 4 in global mode (the CPU),
	// 0 otherwise.
	ctx int

	ch   *Channel
	name string // stream file name
	size int
	n    uint64
	mem  []byte
	hdr  PacketHeader // static fields of every packet

	// Writer-owned, touched once per packet or per loss.
	opens       uint64 // sub-buffers opened or dropped: a Mark's generation
	seq         uint64 // sequence number the next opened packet gets
	discarded   uint64 // running total, written into each packet
	pktDisc     uint64 // discarded as of the last finished packet
	overwritten uint64
	slotEvents  []uint64
	// slotOver is what Snapshot added to each slot's events_discarded
	// (the overwritten count), so RewindTo can write the true value.
	slotOver []uint64
	// slotStart is how many events all sub-buffers finished before each
	// slot's held one carried (finished counts them all): RewindTo
	// reports the events before its oldest sub-buffer as discarded.
	slotStart []uint64
	finished  uint64
	// put counts the packets PutPacket wrote in place, past the
	// sub-buffers.
	put uint64
	// base is the first sub-buffer index RewindTo may write: Reset
	// forgets everything before it.
	base  uint64
	stats Stats

	// firstTS is the first packet's timestamp_begin, written by the writer
	// before the first produced.Add, read by the sink after it.
	firstTS uint64

	produced atomic.Uint64 // sub-buffers finished (writer)
	consumed atomic.Uint64 // sub-buffers released (sink, or writer in Overwrite)

	// Sink side.
	// inline: the writer writes finished sub-buffers itself (LocalSink);
	// otherwise sinkLoop does, woken by doorbell.
	inline   bool
	doorbell chan struct{}
	opened   bool // the stream file has its first packet
	mu       sync.Mutex
	cond     sync.Cond
	sinkErr  error
	// What the sink took, under mu: the events of the packets it took,
	// and the last one's sequence number and end, from which the
	// stream's final packet goes on after a sink error (writeFinal).
	wEvents uint64
	wSeq    uint64
	wEnd    uint64
	wDisc   uint64
	// lost counts the events of packets a caller could not put (Lose);
	// writer-owned.
	lost uint64
}

// NewChannel checks cfg, allocates the buffers, writes the metadata and,
// in NoOverwrite mode, starts one sink goroutine per buffer unless sink
// is a LocalSink that says it is local: then the writer writes the
// sub-buffers it finishes itself (Commit). It fails on
// a bad geometry (the error says why) or if the sink cannot write the
// metadata.
func NewChannel(cfg Config, sink Sink) (*Channel, error) {
	if err := CheckGeometry(cfg.SubbufSize, cfg.NSubbufs); err != nil {
		return nil, fmt.Errorf("channel: %w", err)
	}
	if sink == nil {
		return nil, errors.New("channel: nil sink")
	}
	nbuf := cfg.CPUs
	if cfg.Global {
		nbuf = 1
	} else if nbuf < 1 || nbuf > 1<<16 {
		return nil, fmt.Errorf("channel: %d CPUs out of range 1..65536", cfg.CPUs)
	}
	if total := uint64(nbuf) * uint64(cfg.NSubbufs) * uint64(cfg.SubbufSize); total > 1<<40 {
		return nil, fmt.Errorf("channel: %d buffers of %d x %d bytes is too much memory", nbuf, cfg.NSubbufs, cfg.SubbufSize)
	}
	if cfg.Clock.Name == "" {
		cfg.Clock.Name = "monotonic"
	}
	cfg.Clock.Freq = cfg.Clock.freq()
	if !IsIdent(cfg.Clock.Name) {
		return nil, fmt.Errorf("channel: clock name %q is not an identifier", cfg.Clock.Name)
	}
	env := make(map[string]string, len(cfg.Env))
	for k, v := range cfg.Env {
		if !IsIdent(k) || reservedEnv[k] {
			return nil, fmt.Errorf("channel: env key %q is not an identifier or is reserved", k)
		}
		env[k] = sanitize(v)
	}
	cfg.Clock.Description = sanitize(cfg.Clock.Description)
	if cfg.UUID == ([16]byte{}) {
		cfg.UUID = NewUUID()
	}
	c := &Channel{cfg: cfg, sink: sink, quit: make(chan struct{}), failed: make(chan struct{})}
	c.meta = Metadata{UUID: cfg.UUID, Clock: cfg.Clock, Global: cfg.Global, SubbufSize: cfg.SubbufSize, NSubbufs: cfg.NSubbufs, Env: env}
	empty := []*EventClass{}
	c.classes.Store(&empty)
	if err := writeMetadata(sink, &c.meta); err != nil {
		return nil, fmt.Errorf("channel: %w", err)
	}
	inline := cfg.Mode == NoOverwrite && IsLocal(sink)
	for i := range nbuf {
		b := &buffer{ch: c, size: cfg.SubbufSize, n: uint64(cfg.NSubbufs), seq: 1, inline: inline,
			mem: make([]byte, cfg.NSubbufs*cfg.SubbufSize), slotEvents: make([]uint64, cfg.NSubbufs), slotOver: make([]uint64, cfg.NSubbufs), slotStart: make([]uint64, cfg.NSubbufs),
			doorbell: make(chan struct{}, 1)}
		b.name = "trace" + strconv.Itoa(i)
		if cfg.Global {
			b.name = "trace"
			b.ctx = 4
			c.global = b
		}
		b.hdr = PacketHeader{UUID: cfg.UUID, StreamInstanceID: uint64(i), CPUID: uint32(i), PacketSize: uint64(cfg.SubbufSize) * 8}
		b.cond.L = &b.mu
		c.bufs = append(c.bufs, b)
	}
	if cfg.Mode == NoOverwrite {
		names := make([]string, len(c.bufs))
		for i, b := range c.bufs {
			names[i] = b.name
		}
		if err := Reserve(sink, names, cfg.SubbufSize); err != nil {
			return nil, fmt.Errorf("channel: %w", err)
		}
	}
	for _, b := range c.bufs {
		if cfg.Mode == NoOverwrite && !inline {
			c.wg.Add(1)
			go b.sinkLoop()
		}
	}
	return c, nil
}

var reservedEnv = map[string]bool{"domain": true, "tracer_name": true, "kconsume_format": true, "sub_size": true, "nr_sub": true, "global": true}

// sanitize keeps metadata strings to printable ASCII without quotes or
// backslashes, so any TSDL reader takes them as they are.
func sanitize(s string) string {
	b := []byte(s)
	for i, ch := range b {
		if ch < ' ' || ch > '~' || ch == '"' || ch == '\\' {
			b[i] = '?'
		}
	}
	return string(b)
}

// AddEventClass defines a new event class with the next free id and
// rewrites the metadata through the sink before any event of it can be
// written. Ids never change. It fails if the name is taken, the fields are
// invalid, or the metadata cannot be written (then nothing is defined).
func (c *Channel) AddEventClass(name string, fields []Field) (*EventClass, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.meta.ClassByName(name) != nil {
		return nil, fmt.Errorf("event %q: %w", name, ErrNameExists)
	}
	cls, err := NewEventClass(uint32(len(c.meta.Classes)), name, fields)
	if err != nil {
		return nil, err
	}
	next := c.meta
	next.Classes = append(append([]*EventClass(nil), c.meta.Classes...), cls)
	if err := writeMetadata(c.sink, &next); err != nil {
		return nil, fmt.Errorf("event %q: %w", name, err)
	}
	c.meta = next
	c.classes.Store(&next.Classes)
	return cls, nil
}

// AddEventClasses defines one event class per name, names[i] with
// fields[i], with consecutive ids from the next free one, and rewrites the
// metadata once for all of them: declaring a session's hundreds of classes
// one by one would render and write the metadata hundreds of times. It
// returns the classes in the order of names. It fails, defining none, if
// the two slices differ in length, a name is taken or repeats, some fields
// are invalid, or the metadata cannot be written.
func (c *Channel) AddEventClasses(names []string, fields [][]Field) ([]*EventClass, error) {
	if len(names) != len(fields) {
		return nil, fmt.Errorf("event classes: %d names for %d field lists", len(names), len(fields))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	next := c.meta
	next.Classes = append(make([]*EventClass, 0, len(c.meta.Classes)+len(names)), c.meta.Classes...)
	seen := make(map[string]bool, len(next.Classes)+len(names))
	for _, cls := range next.Classes {
		if cls != nil {
			seen[cls.Name] = true
		}
	}
	for i, name := range names {
		if seen[name] {
			return nil, fmt.Errorf("event %q: %w", name, ErrNameExists)
		}
		seen[name] = true
		cls, err := NewEventClass(uint32(len(next.Classes)), name, fields[i])
		if err != nil {
			return nil, err
		}
		next.Classes = append(next.Classes, cls)
	}
	if len(names) == 0 {
		return nil, nil
	}
	if err := writeMetadata(c.sink, &next); err != nil {
		return nil, fmt.Errorf("%d event classes: %w", len(names), err)
	}
	added := next.Classes[len(c.meta.Classes):]
	c.meta = next
	c.classes.Store(&next.Classes)
	return added, nil
}

// Metadata returns a copy of the channel's current metadata.
func (c *Channel) Metadata() Metadata {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.meta
	m.Classes = append([]*EventClass(nil), m.Classes...)
	return m
}

// Streams returns the number of buffers (1 in global mode).
func (c *Channel) Streams() int { return len(c.bufs) }

func (c *Channel) buf(cpu int) (*buffer, error) {
	if c.cfg.Global {
		return c.bufs[0], nil
	}
	if uint(cpu) >= uint(len(c.bufs)) {
		return nil, fmt.Errorf("cpu %d: %w", cpu, ErrNoStream)
	}
	return c.bufs[cpu], nil
}

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
	if p == 0 && b.stats.Packets == 0 {
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
	le.PutUint64(b.cur[offEventsDiscarded:], b.discarded)
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

// writeOut writes the finished sub-buffers to the sink and releases them,
// on the writer's goroutine: sinkLoop's work, for a local sink (Commit).
// After a sink error it writes and releases nothing more, as sinkLoop.
func (b *buffer) writeOut() {
	for cn := b.consumed.Load(); cn != b.produced.Load(); cn++ {
		slot := int(cn % b.n)
		if b.emit(b.mem[slot*b.size:(slot+1)*b.size], b.slotEvents[slot]) != nil {
			return
		}
		b.release(cn + 1)
	}
}

// release hands the sub-buffers before cn back to the writer and wakes
// whoever waits for them (waitDrained).
func (b *buffer) release(cn uint64) {
	b.mu.Lock()
	b.consumed.Store(cn)
	b.cond.Broadcast()
	b.mu.Unlock()
}

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

// opener returns an empty packet with a zero discarded count at the
// stream's first timestamp, to go before a first packet that already
// counts losses: a CTF reader reports a loss only as the increase between
// two packets, so the losses show from the stream's start.
func (b *buffer) opener() []byte {
	o := make([]byte, b.size)
	h := b.hdr
	h.TimestampBegin, h.TimestampEnd = b.firstTS, b.firstTS
	h.ContentSize = PacketHeaderSize * 8
	PutPacketHeader(o, &h)
	return o
}

// emit hands one finished packet of events events to the sink. Before a
// stream's first packet, if that packet already counts discarded events,
// it writes an empty packet with a zero count (sequence number 0), because
// a CTF reader reports a loss only as the increase between two packets.
// It returns the sink's error, or the one it returned before.
func (b *buffer) emit(pkt []byte, events uint64) error {
	b.mu.Lock()
	err := b.sinkErr
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if !b.opened && binary.LittleEndian.Uint64(pkt[offEventsDiscarded:]) != 0 {
		err = b.ch.sink.WritePacket(b.name, b.opener())
	}
	if err == nil {
		err = b.ch.sink.WritePacket(b.name, pkt)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.sinkErr = fmt.Errorf("stream %s: %w", b.name, err)
		b.cond.Broadcast()
		b.ch.failOnce.Do(func() { close(b.ch.failed) })
		return b.sinkErr
	}
	b.opened = true
	b.stats.Written++ // only the one that writes packets touches it
	b.wEvents += events
	b.wSeq = binary.LittleEndian.Uint64(pkt[offPacketSeqNum:])
	b.wEnd = binary.LittleEndian.Uint64(pkt[offTimestampEnd:])
	b.wDisc = binary.LittleEndian.Uint64(pkt[offEventsDiscarded:])
	return nil
}

// sinkLoop writes finished sub-buffers in order and releases them for
// reuse (relay's subbufs_consumed). After a sink error it stops releasing,
// so the writer drops and counts instead of overwriting unwritten data.
func (b *buffer) sinkLoop() {
	defer b.ch.wg.Done()
	for {
		cn := b.consumed.Load()
		if cn == b.produced.Load() {
			select {
			case <-b.doorbell:
				continue
			case <-b.ch.quit:
				if cn == b.produced.Load() {
					return
				}
				continue
			}
		}
		slot := int(cn % b.n)
		if b.emit(b.mem[slot*b.size:(slot+1)*b.size], b.slotEvents[slot]) != nil {
			<-b.ch.quit
			return
		}
		b.release(cn + 1)
	}
}

// waitDrained waits until the sink has released every finished
// sub-buffer, or failed.
func (b *buffer) waitDrained() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.sinkErr == nil && b.consumed.Load() != b.produced.Load() {
		b.cond.Wait()
	}
	return b.sinkErr
}

// StatsCPU returns the counters of cpu's buffer. Call it from the buffer's
// writer or while it is quiescent.
func (c *Channel) StatsCPU(cpu int) (Stats, error) {
	b, err := c.buf(cpu)
	if err != nil {
		return Stats{}, err
	}
	b.mu.Lock()
	st := b.stats
	failed, written := b.sinkErr != nil, b.wEvents
	b.mu.Unlock()
	if b.cur != nil {
		st.Records += b.events
		st.Bytes += uint64(b.off - PacketHeaderSize)
	}
	st.Unwritten = b.lost
	if failed && b.ch.cfg.Mode == NoOverwrite {
		// Once the sink failed nothing more reaches the stream: what
		// it did not take is lost, not recorded.
		n := min(b.unwritten(written), st.Records)
		st.Unwritten += n
		st.Records -= n
	}
	return st, nil
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

// Failed returns a channel that is closed when the sink fails for any
// buffer (Err then says how), so a caller can wait for that instead of
// polling Err.
func (c *Channel) Failed() <-chan struct{} { return c.failed }

// Err returns the first sink error of any buffer, or nil.
func (c *Channel) Err() error {
	for _, b := range c.bufs {
		b.mu.Lock()
		err := b.sinkErr
		b.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// Close finishes every buffer, writes what is retained (Overwrite mode:
// as Snapshot), stops the sink goroutines and closes the sink. Writers
// must have stopped. It is idempotent; later calls return nil.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	var errs []error
	if c.cfg.Mode == Overwrite {
		errs = append(errs, c.Snapshot())
	} else {
		errs = append(errs, c.Flush())
		if c.endTogether() {
			errs = append(errs, c.Flush())
		}
	}
	close(c.quit)
	c.wg.Wait()
	if c.cfg.Mode == NoOverwrite {
		for _, b := range c.bufs {
			errs = append(errs, b.writeFinal())
		}
	}
	errs = append(errs, c.sink.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("channel close: %w", err)
	}
	return nil
}

// Begin sets the trace's start, ts on the channel's clock: the first
// packet of every stream begins there rather than at the stream's first
// event (an earlier event still begins its own), so that all streams
// cover the trace from its start, as LTTng's do. LTTng's analyses and
// babeltrace 1 keep by default only the span every stream covers; a CPU
// whose first event came late would otherwise cut the others' events
// before it, the statedump among them. Call it before the first event.
func (c *Channel) Begin(ts uint64) { c.begin.Store(ts) }

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

// Prefault makes every sub-buffer's memory resident without changing a
// byte of it (madvise MADV_POPULATE_WRITE, Linux 5.14), so the page
// faults of a first lap through the sub-buffers do not happen while the
// channel records, where they cost the writer a kernel entry per page,
// milliseconds per buffer, inside the trace. Call it once setup's garbage
// has been handed back: the buffers then take its pages rather than adding
// to the peak. It is safe while the channel is written and may be called
// again (resident pages cost a walk). It returns the kernel's error, which
// on kernels before 5.14 is EINVAL: the pages then fault in as the
// channel writes them, as before.
func (c *Channel) Prefault() error {
	for _, b := range c.bufs {
		pages := wholePages(b.mem)
		if len(pages) == 0 {
			continue
		}
		if err := unix.Madvise(pages, unix.MADV_POPULATE_WRITE); err != nil {
			return fmt.Errorf("prefault %s: %w", b.name, err)
		}
	}
	return nil
}

// wholePages returns the part of mem made of whole pages, empty when it
// holds none: madvise takes whole pages, and the heap's neighbours of a
// large allocation are not ours to touch.
func wholePages(mem []byte) []byte {
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	first := (start + page - 1) &^ (page - 1)
	end := (start + uintptr(len(mem))) &^ (page - 1)
	if end <= first {
		return nil
	}
	return mem[first-start : end-start]
}

// writeFinal ends a stream whose sink failed with one last packet, when
// the sink can still take it (FinalSink): empty, numbered after the last
// packet the sink took and running from its end to the stream's last
// event, its events_discarded counting, on top of the stream's losses,
// every event the sink did not take. babeltrace2 then reports them as
// discarded at the end of the stream, where they were lost. A stream
// whose sink did not fail gets nothing. It returns the sink's error.
func (b *buffer) writeFinal() error {
	b.mu.Lock()
	failed, opened, written, seq, end, wDisc := b.sinkErr, b.opened, b.wEvents, b.wSeq, b.wEnd, b.wDisc
	b.mu.Unlock()
	if _, ok := b.ch.sink.(FinalSink); failed == nil || !ok {
		return nil
	}
	unwritten := b.unwritten(written)
	if unwritten == 0 && b.discarded == wDisc {
		return nil
	}
	var pkts [][]byte
	if !opened {
		pkts = append(pkts, b.opener())
		end = b.firstTS
	}
	h := b.hdr
	h.TimestampBegin, h.TimestampEnd = end, max(end, b.lastTS)
	h.ContentSize = PacketHeaderSize * 8
	h.SeqNum = seq + 1
	h.EventsDiscarded = b.discarded + unwritten
	p := make([]byte, b.size)
	PutPacketHeader(p, &h)
	pkts = append(pkts, p)
	if err := WriteFinal(b.ch.sink, b.name, pkts...); err != nil {
		return fmt.Errorf("stream %s: last packet, of the %d events lost: %w", b.name, h.EventsDiscarded, err)
	}
	return nil
}

// unwritten returns how many of the events put into the buffer's packets
// (finished or open) are not among the written ones the sink took.
func (b *buffer) unwritten(written uint64) uint64 {
	total := b.finished
	if b.cur != nil {
		total += b.events
	}
	return total - min(written, total)
}
