package relayfmt

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/testenv"
)

// gatedSink holds every packet until open is closed, so a test can fill a
// NoOverwrite channel and make it drop deterministically.
type gatedSink struct {
	Sink
	open chan struct{}
}

func (g *gatedSink) WritePacket(name string, p []byte) error {
	<-g.open
	return g.Sink.WritePacket(name, p)
}

// remoteSink passes everything to its Sink but does not say it is local
// (LocalSink): the channel writes to it from sink goroutines, as to a
// network sink.
type remoteSink struct{ Sink }

// checkStreams compares what the reader returns per CPU with what the
// channel accepted. With subsequence set (Overwrite mode), the read events
// must be the newest accepted ones of each CPU, the rest counted lost.
func checkStreams(t *testing.T, g *gen, got map[int][]genEvent, overwritten map[int]uint64) {
	t.Helper()
	want := byCPU(g.written)
	for cpu, w := range want {
		gotc := got[cpu]
		skip := int(overwritten[cpu])
		if len(gotc)+skip < len(w) {
			// Events may be lost with a sub-buffer only from the oldest end.
			t.Fatalf("cpu %d: read %d events, %d overwritten, %d accepted", cpu, len(gotc), skip, len(w))
		}
		off := len(w) - len(gotc)
		if overwritten == nil && off != 0 {
			t.Fatalf("cpu %d: read %d events, want %d", cpu, len(gotc), len(w))
		}
		for i := range gotc {
			if !sameEvent(gotc[i], w[off+i]) {
				t.Fatalf("cpu %d event %d: got %+v, want %+v", cpu, i, gotc[i], w[off+i])
			}
		}
	}
}

// lossByStream sums the discarded events notices per stream.
func lossByStream(notices []Item) map[string]uint64 {
	m := map[string]uint64{}
	for _, n := range notices {
		if n.Kind == DiscardedEvents {
			m[n.Stream] += n.Count
		}
	}
	return m
}

// roundTripCase is one channel TestChannelRoundTrip writes and reads.
type roundTripCase struct {
	name    string
	cfg     Config
	classes int
	events  int
	gap     int  // every gap-th event follows a pause over 2^27 ns
	flushes int  // flushes spread over the run (partly filled packets)
	gate    bool // hold the sink so the channel drops
}

func TestChannelRoundTrip(t *testing.T) {
	tests := []roundTripCase{
		{name: "mixed", cfg: Config{SubbufSize: 4096, NSubbufs: 8, CPUs: 2}, classes: 7, events: 3000, gap: 0, flushes: 5},
		{name: "extended-ids-and-gaps", cfg: Config{SubbufSize: 8192, NSubbufs: 4, CPUs: 3}, classes: 40, events: 4000, gap: 97, flushes: 3},
		{name: "global", cfg: Config{SubbufSize: 4096, NSubbufs: 4, Global: true}, classes: 35, events: 2000, gap: 50, flushes: 2},
		{name: "drops", cfg: Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 2}, classes: 7, events: 2000, gap: 200, gate: true},
		{name: "global-drops", cfg: Config{SubbufSize: 4096, NSubbufs: 3, Global: true}, classes: 7, events: 2000, gate: true},
	}
	for _, tt := range tests {
		for _, remote := range []bool{false, true} {
			if tt.gate && !remote {
				continue // a held sink is a remote one
			}
			name := tt.name
			if remote {
				name += "-remote"
			}
			t.Run(name, func(t *testing.T) { roundTrip(t, tt, remote) })
		}
	}
}

// roundTrip writes tc's events through a channel of tc.cfg into a
// directory and checks what readers and babeltrace2 find. With remote
// set the channel's sink does not say it is local; with tc.gate set
// (which implies remote: a local sink is written by the writer) it holds
// every packet until the writing ends, so the channel drops.
func roundTrip(t *testing.T, tc roundTripCase, remote bool) {
	var gs *gatedSink
	wrap := func(s Sink) Sink {
		switch {
		case tc.gate:
			gs = &gatedSink{Sink: s, open: make(chan struct{})}
			return gs
		case remote:
			return remoteSink{s}
		}
		return s
	}
	g := newGen(t, tc.cfg, wrap)
	if g.c.bufs[0].inline == (tc.gate || remote) {
		t.Fatalf("inline writes %v with a sink %T", g.c.bufs[0].inline, g.c.sink)
	}
	g.defineClasses(tc.classes)
	per := tc.events / (tc.flushes + 1)
	for range tc.flushes {
		g.burst(per, tc.gap)
		if err := g.c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	g.burst(tc.events-per*tc.flushes, tc.gap)
	stats := map[string]Stats{}
	for i := range g.c.Streams() {
		st, _ := g.c.StatsCPU(i)
		stats[g.c.bufs[i].name] = st
	}
	if gs != nil {
		close(gs.open)
	}
	g.close()
	var dropped uint64
	for _, st := range stats {
		dropped += st.Dropped
	}
	if tc.gate && dropped == 0 {
		t.Fatal("a held sink made no drops")
	}
	got, notices := readAll(t, g.dir)
	checkStreams(t, g, got, nil)
	loss := lossByStream(notices)
	for name, st := range stats {
		if loss[name] != st.Discarded() {
			t.Errorf("%s: readers see %d discarded events, the channel counted %d", name, loss[name], st.Discarded())
		}
	}
	if n := agree(t, g.dir); n != len(g.written) {
		t.Errorf("babeltrace2 agreed on %d events, %d were written", n, len(g.written))
	}
}

// TestStatsCountEveryRecordAndByte checks Records and Bytes, which Write
// settles per sub-buffer rather than per record: while a sub-buffer is
// open, after switches (compact, extended and global headers), and for a
// sub-buffer dropped by Reset.
func TestStatsCountEveryRecordAndByte(t *testing.T) {
	for _, global := range []bool{false, true} {
		c, err := NewChannel(Config{SubbufSize: 4096, NSubbufs: 4, CPUs: 1, Global: global, Mode: Overwrite}, &DiscardSink{})
		if err != nil {
			t.Fatal(err)
		}
		// Class 0 takes the compact header, class 31 always the extended.
		var ids []uint32
		for i := range 32 {
			cls, err := c.AddEventClass(fmt.Sprintf("r%d", i), []Field{ArrayField("a", U8, 100)})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, cls.ID)
		}
		ctx := uint64(0)
		if global {
			ctx = 4
		}
		var recs, bytes uint64
		check := func(when string) {
			t.Helper()
			st, _ := c.StatsCPU(0)
			if st.Records != recs || st.Bytes != bytes {
				t.Errorf("global=%v, %s: records %d bytes %d, want %d and %d", global, when, st.Records, st.Bytes, recs, bytes)
			}
		}
		for i := range 100 {
			id := ids[0]
			size := uint64(CompactHeaderSize)
			if i%3 == 2 {
				id, size = ids[31], ExtendedHeaderSize
			}
			if err := c.Write(0, uint64(1+5*i), id, make([]byte, 100)); err != nil {
				t.Fatal(err)
			}
			recs++
			bytes += size + ctx + 100
		}
		// 100 records of about 110 B fill two 4 KiB sub-buffers and part
		// of a third.
		check("open sub-buffer")
		c.Reset()
		check("after reset")
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{SubbufSize: 4096, NSubbufs: 1, CPUs: 1}, "at least 2"},
		{Config{SubbufSize: 5000, NSubbufs: 2, CPUs: 1}, "multiple of the page size"},
		{Config{SubbufSize: 1024, NSubbufs: 2, CPUs: 1}, "out of range"},
		{Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 0}, "CPUs out of range"},
		{Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1, Clock: Clock{Name: "a b"}}, "not an identifier"},
		{Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1, Env: map[string]string{"nr_sub": "x"}}, "reserved"},
	} {
		_, err := NewChannel(tc.cfg, &DiscardSink{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestEventClassErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fields []Field
		want   string
	}{
		{"bad field name", []Field{ScalarField("1a", U8)}, "not an identifier"},
		{"duplicate", []Field{ScalarField("a", U8), ScalarField("a", U8)}, "duplicate"},
		{"bad type", []Field{{Name: "a", Kind: Scalar}}, "invalid integer type"},
		{"zero array", []Field{ArrayField("a", U8, 0)}, "array length"},
		{"seq no length", []Field{SequenceField("a", U8, "n")}, "not an earlier field"},
		{"seq signed length", []Field{ScalarField("n", S32), SequenceField("a", U8, "n")}, "unsigned scalar"},
		{"text u32", []Field{{Name: "a", Kind: Array, Elem: U32, Len: 2, Text: true}}, "text needs u8"},
		{"too many", make([]Field, MaxFields+1), "the limit"},
	} {
		if _, err := NewEventClass(0, "ev", tc.fields); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := NewEventClass(0, `a"b`, nil); err == nil {
		t.Error("quote in event name accepted")
	}
}

// metaCountSink counts metadata writes.
type metaCountSink struct {
	Sink
	n int
}

func (m *metaCountSink) WriteMetadata(text []byte) error {
	m.n++
	return m.Sink.WriteMetadata(text)
}

// TestAddEventClasses checks that a batch takes the next ids in order in
// one metadata write, that a bad batch defines nothing, that classes added
// one by one afterwards continue the ids, and that babeltrace2 and our
// reader read events of all of them alike.
func TestAddEventClasses(t *testing.T) {
	var ms *metaCountSink
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 4, CPUs: 2}, func(s Sink) Sink {
		ms = &metaCountSink{Sink: s}
		return ms
	})
	g.defineClasses(1)
	before := ms.n
	var names []string
	var fields [][]Field
	for i := range 40 {
		names = append(names, fmt.Sprintf("syscalls:sys_enter_%d", i))
		fields = append(fields, shapes[i%len(shapes)])
	}
	for _, tc := range []struct {
		name   string
		names  []string
		fields [][]Field
		want   error
	}{
		{"fewer field lists", names, fields[:39], nil},
		{"name taken", []string{"a:b", "sched:sched_switch"}, fields[:2], ErrNameExists},
		{"name twice", []string{"a:b", "a:b"}, fields[:2], ErrNameExists},
		{"bad field", []string{"a:b"}, [][]Field{{SequenceField("s", U8, "nolen")}}, nil},
	} {
		cls, err := g.c.AddEventClasses(tc.names, tc.fields)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || cls != nil {
			t.Errorf("%s: got %v, %v, want an error (%v)", tc.name, cls, err, tc.want)
		}
	}
	if n := len(g.c.Metadata().Classes); n != 1 || ms.n != before {
		t.Fatalf("failed batches left %d classes, %d metadata writes", n, ms.n-before)
	}
	cls, err := g.c.AddEventClasses(names, fields)
	if err != nil {
		t.Fatal(err)
	}
	if ms.n != before+1 {
		t.Errorf("%d metadata writes for one batch, want 1", ms.n-before)
	}
	if len(cls) != len(names) {
		t.Fatalf("%d classes for %d names", len(cls), len(names))
	}
	for i, c := range cls {
		if c.ID != uint32(1+i) || c.Name != names[i] {
			t.Errorf("class %d: id %d name %s, want %d %s", i, c.ID, c.Name, 1+i, names[i])
		}
	}
	if cls, err := g.c.AddEventClasses(nil, nil); err != nil || cls != nil || ms.n != before+1 {
		t.Errorf("empty batch: %v, %v, %d metadata writes", cls, err, ms.n-before-1)
	}
	last, err := g.c.AddEventClass("synth:late", shapes[1])
	if err != nil || last.ID != uint32(1+len(names)) {
		t.Fatalf("class after a batch: %v, %v", last, err)
	}
	g.classes = append(append(g.classes, cls...), last)
	g.burst(3000, 0)
	g.close()
	if n := agree(t, g.dir); n != len(g.written) {
		t.Errorf("read %d events, wrote %d", n, len(g.written))
	}
}

// TestPrefault holds Prefault to its promise: afterwards every whole page
// of every buffer is resident (mincore), and a byte already written is
// still there. Kernels before 5.14 lack MADV_POPULATE_WRITE and skip.
func TestPrefault(t *testing.T) {
	c, err := NewChannel(Config{SubbufSize: 1 << 20, NSubbufs: 4, CPUs: 2}, &DiscardSink{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, b := range c.bufs {
		b.mem[len(b.mem)/2] = 0xa5
	}
	if err := c.Prefault(); errors.Is(err, unix.EINVAL) {
		t.Skipf("kernel without MADV_POPULATE_WRITE (before 5.14): %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	for _, b := range c.bufs {
		if b.mem[len(b.mem)/2] != 0xa5 {
			t.Fatalf("%s: Prefault changed a written byte", b.name)
		}
		pages := wholePages(b.mem)
		vec := make([]byte, len(pages)/os.Getpagesize())
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(pages))), uintptr(len(pages)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			t.Fatalf("mincore: %v", e)
		}
		for i, v := range vec {
			if v&1 == 0 {
				t.Fatalf("%s: page %d of %d not resident after Prefault", b.name, i, len(vec))
			}
		}
	}
}

// TestStreamsSpanTheTrace: with Begin set, every per-CPU stream's first
// packet begins at the trace's start and, after Close, its last packet
// ends at the trace's newest event, as LTTng's streams do; babeltrace2
// asked to keep only the span all streams cover (--stream-intersection,
// the default of LTTng's analyses) then still prints every event. CPU 1
// has one event in the middle and CPU 2 none: without the alignment the
// intersection would hold CPU 1's event alone.
func TestStreamsSpanTheTrace(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 64, CPUs: 3}, nil)
	g.defineClasses(1)
	// The first event comes more than a compact header's 2^27 ns after
	// the packet's begin: its header must carry the full timestamp.
	const begin, first, last = 500_000, 500_000 + 3<<27, 500_000 + 3<<27 + 8_000_000
	g.c.Begin(begin)
	payload := g.payload(g.classes[0])
	written := 0
	for ts := uint64(first); ts <= last; ts += 10_000 {
		if err := g.c.Write(0, ts, g.classes[0].ID, payload); err != nil {
			t.Fatal(err)
		}
		written++
	}
	if err := g.c.Write(1, first+4_000_000, g.classes[0].ID, payload); err != nil {
		t.Fatal(err)
	}
	written++
	if err := g.c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"trace0", "trace1"} {
		b, err := os.ReadFile(filepath.Join(g.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		var hs []PacketHeader
		for off := 0; off+4096 <= len(b); off += 4096 {
			h, err := ParsePacketHeader(b[off:])
			if err != nil {
				t.Fatalf("%s at %d: %v", name, off, err)
			}
			hs = append(hs, h)
		}
		if len(hs) == 0 {
			t.Fatalf("%s: no packets", name)
		}
		if hs[0].TimestampBegin != begin || hs[len(hs)-1].TimestampEnd != last {
			t.Errorf("%s: %d packets, first begins at %d, last ends at %d; want %d and %d", name, len(hs), hs[0].TimestampBegin, hs[len(hs)-1].TimestampEnd, begin, last)
		}
	}
	if _, err := os.Stat(filepath.Join(g.dir, "trace2")); err == nil {
		t.Error("trace2: a stream without events has a file")
	}
	lines, _ := testenv.RunBT2(t, g.dir)
	if len(lines) != written {
		t.Fatalf("babeltrace2 printed %d events, %d were written", len(lines), written)
	}
	if !strings.HasPrefix(lines[0], fmt.Sprintf("[%020d]", first)) || !strings.HasPrefix(lines[len(lines)-1], fmt.Sprintf("[%020d]", last)) {
		t.Errorf("babeltrace2's first and last events:\n%s\n%s\nwant cycles %d and %d", lines[0], lines[len(lines)-1], first, last)
	}
	out, err := exec.Command(testenv.BT2(t), "--stream-intersection", g.dir).CombinedOutput()
	if err != nil {
		t.Fatalf("babeltrace2 --stream-intersection: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "\n"); n != written {
		t.Errorf("babeltrace2 --stream-intersection printed %d events, %d were written", n, written)
	}
}

// TestStreamContext: a channel whose events all carry a stream event
// context (LTTng's contexts), per-CPU and global, and classes with
// contexts of their own and base-16 fields: babeltrace2 and our reader
// print every event alike, the metadata parses back to the same
// context, and a context field that is not fixed-size is refused.
func TestStreamContext(t *testing.T) {
	sc := []Field{CharArrayField("procname", 16), ScalarField("tid", S32), ScalarField("perf_cpu_cycles", U64)}
	hex := ScalarField("addr", U64)
	hex.Hex = true
	own := ScalarField("prio", S32)
	own.Context = true
	for _, global := range []bool{false, true} {
		g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 8, CPUs: 2, Global: global, StreamContext: sc}, nil)
		g.defineClasses(6)
		c, err := g.c.AddEventClass("ctx:own", []Field{own, ScalarField("tid", S32), hex})
		if err != nil {
			t.Fatal(err)
		}
		if c.Context != len(sc)+1 || c.Fields[len(sc)].Name != "prio" {
			t.Fatalf("class with its own context: %d context fields %v", c.Context, c.Fields)
		}
		g.classes = append(g.classes, c)
		g.burst(300, 0)
		g.close()
		if n := agree(t, g.dir); n < 300 {
			t.Errorf("global %t: %d events agree", global, n)
		}
		tr, err := Open(g.dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Meta.StreamContext) != len(sc) || tr.Meta.StreamContext[0].Name != "procname" || !tr.Meta.StreamContext[2].Context {
			t.Errorf("global %t: stream context read back as %v", global, tr.Meta.StreamContext)
		}
	}
	if _, err := NewChannel(Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1, StreamContext: []Field{StringField("name")}}, &DiscardSink{}); err == nil {
		t.Error("a string in the stream context: no error")
	}
}
