package relayfmt

import (
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
	// StreamContext, when set, is the stream's event context: fixed-size
	// fields every event carries first (Metadata.StreamContext), which
	// each class gets ahead of its own and each payload written holds.
	StreamContext []Field
	// Room, when set, is called once a buffer frees a sub-buffer after
	// PutPacket returned false for want of one, or its sink fails: the
	// caller may put the packet again (or find out). It runs on the
	// sink's goroutine, or on the caller's own when the room came while
	// PutPacket refused, and must not block.
	Room func()
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
	// begin is the trace's start (Begin), or its current chunk's
	// (Rotate): every stream's first packet begins there. 0: at its
	// first event.
	begin atomic.Uint64
	// chunk is the current chunk's index, chunkBegin its start; under mu.
	chunk      uint64
	chunkBegin uint64
	// rotErr is why the last chunk could not be closed (Rotate); under
	// mu. Err returns it: nothing more reaches the trace.
	rotErr error
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
	opens     uint64 // sub-buffers opened or dropped: a Mark's generation
	seq       uint64 // sequence number the next opened packet gets
	discarded uint64 // running total; each packet carries it less discBase
	// discBase is discarded when the current chunk began (Rotate): a
	// chunk's packets count the losses since, so that its streams read
	// as whole streams on their own.
	discBase    uint64
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

	// firstTS is the first packet's timestamp_begin, of the trace or of
	// its current chunk (Rotate), written by the writer before the first
	// produced.Add, read by the sink after it.
	firstTS uint64

	produced atomic.Uint64 // sub-buffers finished (writer)
	consumed atomic.Uint64 // sub-buffers released (sink, or writer in Overwrite)
	// wantRoom is set when PutPacket found no free sub-buffer: the next
	// release calls Config.Room.
	wantRoom atomic.Bool

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
	// The current chunk's part (Rotate), under mu: the events the sink
	// had taken when it began, and the bytes of its packets since.
	chunkEvents  uint64
	chunkBytes   uint64
	chunkPackets uint64
	// chunkEnd is where the streams' last chunk ended (Rotate);
	// writer-owned.
	chunkEnd uint64
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
	sc, err := streamContext(cfg.StreamContext)
	if err != nil {
		return nil, fmt.Errorf("channel: %w", err)
	}
	c := &Channel{cfg: cfg, sink: sink, quit: make(chan struct{}), failed: make(chan struct{})}
	c.meta = Metadata{UUID: cfg.UUID, Clock: cfg.Clock, Global: cfg.Global, SubbufSize: cfg.SubbufSize, NSubbufs: cfg.NSubbufs, Env: env, StreamContext: sc}
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
	cls, err := NewEventClass(uint32(len(c.meta.Classes)), name, withContext(c.meta.StreamContext, fields))
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
		cls, err := NewEventClass(uint32(len(next.Classes)), name, withContext(next.StreamContext, fields[i]))
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

// streamContext returns fields as a stream's event context, each marked
// Context, or why they cannot be one: a field that is not fixed-size,
// or a name that is not an identifier or repeats.
func streamContext(fields []Field) ([]Field, error) {
	if len(fields) == 0 {
		return nil, nil
	}
	out := make([]Field, len(fields))
	seen := map[string]bool{}
	for i, f := range fields {
		if f.Kind != Scalar && f.Kind != Array || !IsIdent(f.Name) || seen[f.Name] {
			return nil, fmt.Errorf("stream event context field %q: want fixed-size fields of unique identifier names", f.Name)
		}
		seen[f.Name] = true
		f.Context = true
		out[i] = f
	}
	// A class with nothing else of its own still checks them.
	if _, err := NewEventClass(0, "stream_context", out); err != nil {
		return nil, fmt.Errorf("stream event context: %w", err)
	}
	return out, nil
}

// withContext returns fields behind the stream's event context sc.
func withContext(sc, fields []Field) []Field {
	if len(sc) == 0 {
		return fields
	}
	return append(append(make([]Field, 0, len(sc)+len(fields)), sc...), fields...)
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

// buf returns cpu's buffer, the one buffer in global mode; it fails with
// ErrNoStream for a cpu the channel has no buffer for.
func (c *Channel) buf(cpu int) (*buffer, error) {
	if c.cfg.Global {
		return c.bufs[0], nil
	}
	if uint(cpu) >= uint(len(c.bufs)) {
		return nil, fmt.Errorf("cpu %d: %w", cpu, ErrNoStream)
	}
	return c.bufs[cpu], nil
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

// Failed returns a channel that is closed when the sink fails for any
// buffer (Err then says how), so a caller can wait for that instead of
// polling Err.
func (c *Channel) Failed() <-chan struct{} { return c.failed }

// Err returns the first sink error of any buffer, or why a chunk could
// not be closed (Rotate), or nil.
func (c *Channel) Err() error {
	c.mu.Lock()
	rotErr := c.rotErr
	c.mu.Unlock()
	if rotErr != nil {
		return rotErr
	}
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
	errs = append(errs, c.closeLastChunk())
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
