package relayfmt

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

func TestOverwriteKeepsNewest(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 3, CPUs: 2, Mode: Overwrite}, nil)
	g.defineClasses(7)
	g.burst(3000, 0)
	if err := g.c.Snapshot(); err != nil {
		t.Fatal(err)
	}
	g.burst(3000, 500)
	over := map[int]uint64{}
	var total uint64
	stats := map[string]Stats{}
	for i := range 2 {
		st, _ := g.c.StatsCPU(i)
		over[i] = st.Overwritten
		total += st.Overwritten
		stats[g.c.bufs[i].name] = st
	}
	if total == 0 {
		t.Fatal("nothing was overwritten")
	}
	g.close()
	got, notices := readAll(t, g.dir)
	// The newest events of each CPU are in the file; the ones lost are
	// the oldest of each run between snapshots, so check counts and order.
	want := byCPU(g.written)
	for cpu, w := range want {
		if uint64(len(got[cpu]))+over[cpu] != uint64(len(w)) {
			t.Errorf("cpu %d: %d read + %d overwritten != %d written", cpu, len(got[cpu]), over[cpu], len(w))
		}
		last := got[cpu][len(got[cpu])-1]
		if !sameEvent(last, w[len(w)-1]) {
			t.Errorf("cpu %d: the newest event is missing", cpu)
		}
	}
	loss := lossByStream(notices)
	for name, st := range stats {
		if loss[name] != st.Discarded() {
			t.Errorf("%s: readers see %d discarded, channel counted %d", name, loss[name], st.Discarded())
		}
	}
	agree(t, g.dir)
}

func TestOverwriteSnapshotSuffix(t *testing.T) {
	// One snapshot at the end: each CPU's events in the file are exactly
	// the newest accepted ones.
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1, Mode: Overwrite}, nil)
	g.defineClasses(3)
	g.burst(5000, 0)
	st, _ := g.c.StatsCPU(0)
	g.close()
	got, notices := readAll(t, g.dir)
	checkStreams(t, g, got, map[int]uint64{0: st.Overwritten})
	if uint64(len(got[0]))+st.Overwritten != uint64(len(byCPU(g.written)[0])) {
		t.Fatalf("read %d + overwritten %d != written %d", len(got[0]), st.Overwritten, len(g.written))
	}
	if loss := lossByStream(notices)["trace0"]; loss != st.Overwritten {
		t.Fatalf("notices report %d lost, %d were overwritten", loss, st.Overwritten)
	}
	agree(t, g.dir)
}

// TestRewind: RewindTo writes, as a trace of its own, every sub-buffer
// still held, from the oldest, including those a snapshot already wrote.
func TestRewind(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 3, CPUs: 1, Mode: Overwrite}, nil)
	g.defineClasses(3)
	rewind := func() (string, []genEvent, uint64) {
		t.Helper()
		dir := t.TempDir()
		sink, err := NewDirSink(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.c.RewindTo(sink, -1); err != nil {
			t.Fatal(err)
		}
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
		got, notices := readAll(t, dir)
		return dir, got[0], lossByStream(notices)["trace0"]
	}
	g.burst(5000, 0)
	if err := g.c.Snapshot(); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		dir, got, loss := rewind()
		st, _ := g.c.StatsCPU(0)
		w := byCPU(g.written)[0]
		// Lost to this trace: every event before the oldest held
		// sub-buffer, overwritten or already written by the snapshot.
		if st.Overwritten == 0 || len(got) == 0 || loss < st.Overwritten || uint64(len(got))+loss != uint64(len(w)) {
			t.Fatalf("round %d: rewind read %d, reports %d lost; %d written, %d overwritten", round, len(got), loss, len(w), st.Overwritten)
		}
		for i, e := range got {
			if !sameEvent(e, w[len(w)-len(got)+i]) {
				t.Fatalf("round %d: event %d of the rewind is not the held suffix", round, i)
			}
		}
		agree(t, dir)
		g.burst(700, 500) // a sub-buffer or so more, after the snapshot
	}
	if err := g.c.ResetCPU(0); err != nil {
		t.Fatal(err)
	}
	if _, got, _ := rewind(); len(got) != 0 {
		t.Fatalf("rewind after reset read %d events", len(got))
	}
	if err := (&Channel{cfg: Config{Mode: NoOverwrite}}).RewindTo(&DiscardSink{}, -1); !errors.Is(err, ErrWrongMode) {
		t.Fatalf("NoOverwrite rewind: %v", err)
	}
	g.close()
}

func TestResetAndDiscard(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 4, CPUs: 2}, nil)
	g.defineClasses(3)
	g.burst(100, 0)
	if err := g.c.Flush(); err != nil {
		t.Fatal(err)
	}
	kept := len(g.written)
	g.burst(10, 0)
	if err := g.c.ResetCPU(0); err != nil {
		t.Fatal(err)
	}
	if err := g.c.ResetCPU(1); err != nil {
		t.Fatal(err)
	}
	g.written = g.written[:kept] // reset drops what was not yet handed on
	if err := g.c.Discard(1, 42); err != nil {
		t.Fatal(err)
	}
	g.close()
	got, notices := readAll(t, g.dir)
	checkStreams(t, g, got, nil)
	if l := lossByStream(notices); l["trace1"] != 42 || l["trace0"] != 0 {
		t.Fatalf("losses %v, want 42 on trace1 only", l)
	}
	for _, n := range notices {
		if n.Kind == DiscardedPackets {
			t.Fatalf("reset left a packet gap: %+v", n)
		}
	}
	agree(t, g.dir)
}

func TestWriteErrors(t *testing.T) {
	c, err := NewChannel(Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1}, &DiscardSink{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cls, err := c.AddEventClass("x", []Field{ScalarField("a", U32)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.AddEventClass("s", []Field{StringField("a")})
	if err != nil {
		t.Fatal(err)
	}
	big, err := c.AddEventClass("big", []Field{ArrayField("a", U8, 5000)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		cpu     int
		id      uint32
		payload []byte
		want    error
	}{
		{"unknown id", 0, 99, nil, ErrInvalid},
		{"short payload", 0, cls.ID, []byte{1}, ErrInvalid},
		{"unterminated string", 0, s.ID, []byte("abc"), ErrInvalid},
		{"trailing bytes", 0, s.ID, []byte("abc\x00z"), ErrInvalid},
		{"too large", 0, big.ID, make([]byte, 5000), ErrTooLarge},
		{"no such cpu", 3, cls.ID, make([]byte, 4), ErrNoStream},
		{"ok", 0, cls.ID, make([]byte, 4), nil},
	} {
		if err := c.Write(tc.cpu, 1, tc.id, tc.payload); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	st, _ := c.StatsCPU(0)
	if st.Invalid != 4 || st.TooLarge != 1 || st.Records != 1 || st.Discarded() != 5 {
		t.Errorf("stats %+v", st)
	}
	if _, err := c.AddEventClass("x", nil); !errors.Is(err, ErrNameExists) {
		t.Errorf("duplicate class: %v", err)
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

// failSink fails every packet write after the first n, like a disk that
// fills up.
type failSink struct {
	Sink
	mu    sync.Mutex
	n     int
	local bool
}

// Local reports whether the channel is to write to f from its writer.
func (f *failSink) Local() bool { return f.local }

func (f *failSink) WritePacket(name string, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return errors.New("no space left on device")
	}
	f.n--
	return f.Sink.WritePacket(name, p)
}

func TestSinkFailureLeavesWholeFiles(t *testing.T) {
	for _, local := range []bool{true, false} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) { sinkFailure(t, local) })
	}
}

// sinkFailure checks that a sink failing at its fourth packet, local
// (written by the writer) or not, leaves the three before it whole.
func sinkFailure(t *testing.T, local bool) {
	var fs *failSink
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1}, func(s Sink) Sink {
		fs = &failSink{Sink: s, n: 3, local: local}
		return fs
	})
	if g.c.bufs[0].inline != local {
		t.Fatalf("inline writes %v with a sink that says local %v", g.c.bufs[0].inline, local)
	}
	g.defineClasses(3)
	select {
	case <-g.c.Failed():
		t.Fatal("Failed is closed before any failure")
	default:
	}
	// Flush after every few events, so every packet reaches the sink
	// whatever the scheduling, until the sink's fourth write fails.
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		g.burst(30, 0)
		err = g.c.Flush()
	}
	if err == nil || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("flush after a failed write: %v", err)
	}
	if g.c.Err() == nil {
		t.Fatal("Err() is nil after a sink failure")
	}
	select {
	case <-g.c.Failed():
	default:
		t.Fatal("Failed is not closed after a sink failure")
	}
	if err := g.c.Close(); err == nil {
		t.Fatal("close hid the sink failure")
	}
	fi, err := os.Stat(filepath.Join(g.dir, "trace0"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 3*4096 {
		t.Fatalf("trace0 is %d bytes, want the 3 whole packets written", fi.Size())
	}
	agree(t, g.dir)
}

// TestLocalSinkWrittenByWriter checks that a NoOverwrite channel on a
// local sink leaves finished sub-buffers to the writer's Commit, with no
// goroutine between: the file holds them when Commit returns, and not
// before. A writer that never commits loses nothing: a sub-buffer it
// needs the room of is written then.
func TestLocalSinkWrittenByWriter(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1}, nil)
	g.defineClasses(1)
	b := g.c.bufs[0]
	size := func() int64 {
		fi, err := os.Stat(filepath.Join(g.dir, "trace0"))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	for i := 0; b.produced.Load() == 0; i++ {
		if i > 10000 {
			t.Fatal("no sub-buffer finished after 10000 events")
		}
		if err := g.write(0, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := size(); n != 0 {
		t.Fatalf("trace0 holds %d bytes before Commit, want 0", n)
	}
	g.c.Commit()
	if n := size(); n != 4096 {
		t.Fatalf("trace0 holds %d bytes after Commit, want the 4096 of the finished sub-buffer", n)
	}
	// Twenty sub-buffers' worth through two, without a Commit.
	for b.produced.Load() < 21 {
		if err := g.write(0, 1); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := g.c.StatsCPU(0); st.Dropped != 0 || st.Written < 19 {
		t.Fatalf("without Commit: %d records dropped, %d packets written of 21 finished; want none dropped, at least 19 written", st.Dropped, st.Written)
	}
	g.close()
	if n, want := size(), int64(4096*b.produced.Load()); n != want {
		t.Fatalf("trace0 holds %d bytes after Close, want %d", n, want)
	}
	agree(t, g.dir)
}

func TestDirSinkCutsPartialWrite(t *testing.T) {
	// A real short write: RLIMIT_FSIZE is per process, so use a file that
	// cannot grow instead: a packet written to a read-only descriptor fails
	// whole, and the stream refuses further packets.
	dir := t.TempDir()
	s, err := NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	pkt := make([]byte, 4096)
	if err := s.WritePacket("trace0", pkt); err != nil {
		t.Fatal(err)
	}
	sf := s.files["trace0"]
	ro, err := os.Open(filepath.Join(dir, "trace0"))
	if err != nil {
		t.Fatal(err)
	}
	sf.f.Close()
	sf.f = ro
	if err := s.WritePacket("trace0", pkt); err == nil {
		t.Fatal("write to a read-only file succeeded")
	}
	if err := s.WritePacket("trace0", pkt); err == nil {
		t.Fatal("stream took a packet after a failure")
	}
	if fi, _ := os.Stat(filepath.Join(dir, "trace0")); fi.Size() != 4096 {
		t.Fatalf("size %d after failed write", fi.Size())
	}
	if err := s.WritePacket("../escape", pkt); err == nil {
		t.Fatal("a stream name with a path separator was accepted")
	}
	s.Close()
}

func TestReaderAPIMisuseIsNotAPanic(t *testing.T) {
	it := Item{Kind: DiscardedEvents, Count: 3}
	if _, err := it.Fields(nil); err == nil {
		t.Error("Fields on a notice returned no error")
	}
	c, err := NewEventClass(0, "e", []Field{StringField("s"), ScalarField("n", U16)})
	if err != nil {
		t.Fatal(err)
	}
	// A class built by hand, not by NewEventClass, is an error, not a
	// panic, whether its zero fixed size says "fixed" or not.
	for _, bad := range []*EventClass{
		{Name: "hand", Fields: []Field{ScalarField("a", U8)}},
		{Name: "hand", Fields: []Field{StringField("s")}, fixed: -1},
	} {
		if _, err := bad.Decode([]byte{1, 0}, nil); err == nil {
			t.Errorf("Decode with a hand-made class %+v returned no error", bad.Fields)
		}
		if _, err := bad.PayloadSize([]byte{1, 0}); err == nil {
			t.Errorf("PayloadSize with a hand-made class %+v returned no error", bad.Fields)
		}
	}
	vals, err := c.Decode([]byte("ab\x00\x07\x00"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if vals[0].Uint(0) != 0 || vals[0].Int(0) != 0 || string(vals[0].Text()) != "ab" || vals[1].Uint(0) != 7 {
		t.Errorf("decoded %q %d", vals[0].Text(), vals[1].Uint(0))
	}
}

// TestItemCopyKeptPastNext: the reader lays each event out once and
// Fields cuts the values from that layout; a copy of an item kept past
// Next (while its packet is still the current one) must decode its own
// payload, not cut it along the next event's layout.
func TestItemCopyKeptPastNext(t *testing.T) {
	dir := t.TempDir()
	g := newGenIn(t, dir, Config{SubbufSize: 64 << 10, NSubbufs: 4, CPUs: 1}, nil)
	g.defineClasses(len(shapes))
	for range 200 {
		if err := g.write(0, 10); err != nil {
			t.Fatal(err)
		}
	}
	g.close()
	_, m := openMerged(t, dir)
	var prev Item
	var got, want []Value
	var err error
	n := 0
	for m.Next() {
		it := m.Item()
		if it.Kind != EventItem {
			continue
		}
		if prev.Class != nil {
			if got, err = prev.Fields(got); err != nil {
				t.Fatalf("event %d: fields of the kept copy: %v", n, err)
			}
			if want, err = prev.Class.Decode(prev.Payload, want[:0]); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if !bytes.Equal(got[i].Raw(), want[i].Raw()) {
					t.Fatalf("event %d field %s: kept copy gives %q, its payload %q", n, want[i].Field.Name, got[i].Raw(), want[i].Raw())
				}
			}
		}
		prev = *it
		n++
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 200 {
		t.Fatalf("read %d events, wrote 200", n)
	}
}

// TestMarkUndo checks Append, Mark and Undo: events appended after a mark
// are gone after Undo, with the counts of what the channel rejected or
// clamped meanwhile; Append never starts a sub-buffer; and a mark cannot
// be undone once its sub-buffer is finished or from another channel.
// Readers and babeltrace2 must see exactly the events kept.
func TestMarkUndo(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 16, CPUs: 2}, nil)
	g.defineClasses(3)
	appendEv := func(cpu int) bool {
		t.Helper()
		c := g.classes[g.rng.IntN(len(g.classes))]
		ev := genEvent{cpu: cpu, ts: g.ts[cpu] + 1 + uint64(g.rng.IntN(5000)), id: c.ID, payload: g.payload(c)}
		ok, err := g.c.Append(cpu, ev.ts, ev.id, ev.payload)
		if err != nil {
			t.Fatalf("append: %v", err)
		}
		if ok {
			g.ts[cpu] = ev.ts
			g.written = append(g.written, ev)
		}
		return ok
	}
	stats := func() Stats { st, _ := g.c.StatsCPU(0); return st }

	if appendEv(0) {
		t.Fatal("append opened a sub-buffer")
	}
	if m := g.c.Mark(0); g.c.Undo(m) {
		t.Fatal("undo to a mark taken with no sub-buffer open")
	}
	g.burst(40, 0)
	for !appendEv(0) {
		g.write(0, 1) // open cpu 0's sub-buffer if the burst left it closed
	}
	before, kept, last := stats(), len(g.written), g.c.LastTS(0)
	m := g.c.Mark(0)
	if m.TS() != last {
		t.Fatalf("mark at %d, channel's last timestamp %d", m.TS(), last)
	}
	for range 5 {
		appendEv(0)
	}
	if _, err := g.c.Append(0, 1, 99, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown class: %v", err)
	}
	if ok, err := g.c.Append(0, 1, g.classes[0].ID, g.payload(g.classes[0])); !ok || err != nil {
		t.Fatalf("clamped append: %v %v", ok, err)
	}
	if st := stats(); st.Invalid != before.Invalid+1 || st.Clamped != before.Clamped+1 {
		t.Fatalf("after appends: %+v, before %+v", st, before)
	}
	if !g.c.Undo(m) {
		t.Fatal("undo within the open sub-buffer failed")
	}
	g.written = g.written[:kept]
	if st := stats(); st.Invalid != before.Invalid || st.Clamped != before.Clamped || st.Discarded() != before.Discarded() {
		t.Fatalf("after undo: %+v, before %+v", st, before)
	}
	if g.c.LastTS(0) != last {
		t.Fatalf("last timestamp %d after undo, want %d", g.c.LastTS(0), last)
	}
	other, err := NewChannel(Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 2}, &DiscardSink{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if other.Undo(m) || g.c.Undo(Mark{}) {
		t.Fatal("undo to a foreign or zero mark")
	}

	// Fill the open sub-buffer: Append stops at its end, leaving it to
	// Write to start the next, after which the mark is final.
	m = g.c.Mark(0)
	n := 0
	for appendEv(0) {
		n++
	}
	st := stats()
	if n == 0 || st.Packets != before.Packets {
		t.Fatalf("appended %d events, packets %d -> %d", n, before.Packets, st.Packets)
	}
	g.write(0, 1)
	if g.c.Undo(m) {
		t.Fatal("undo across a sub-buffer switch")
	}
	m = g.c.Mark(1)
	if err := g.c.Flush(); err != nil {
		t.Fatal(err)
	}
	if g.c.Undo(m) {
		t.Fatal("undo across a flush")
	}
	g.burst(20, 0)
	g.close()
	got, notices := readAll(t, g.dir)
	checkStreams(t, g, got, nil)
	if l := lossByStream(notices); l["trace0"] != 0 || l["trace1"] != 0 {
		t.Fatalf("losses %v: undone rejections must not count", l)
	}
	agree(t, g.dir)
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

// finalFailSink is a failSink whose inner DirSink takes the last packet
// of a failed stream (FinalSink), as on a full disk its reserve does.
type finalFailSink struct {
	*failSink
	dir *DirSink
}

func (f *finalFailSink) WriteFinal(name string, packets ...[]byte) error {
	return f.dir.WriteFinal(name, packets...)
}

func (f *finalFailSink) Reserve(names []string, size int) error { return f.dir.Reserve(names, size) }

// TestSinkFailureCountsUnwritten fails the sink at its fourth packet
// while records keep coming: every record Write took is then in the
// trace or among the events the trace reports discarded, whether the
// writer or a goroutine wrote the packets, and the stats count the ones
// the sink never took as Unwritten, not as Records.
func TestSinkFailureCountsUnwritten(t *testing.T) {
	for _, local := range []bool{true, false} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) {
			g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 4, CPUs: 2}, func(s Sink) Sink {
				return &finalFailSink{failSink: &failSink{Sink: s, n: 3, local: local}, dir: s.(*DirSink)}
			})
			g.defineClasses(3)
			calls := 0
			for i := 0; i < 2000; i++ {
				_ = g.write(i%2, uint64(1+i%7))
				calls++
				if i%50 == 0 {
					g.c.Commit()
				}
			}
			// Counted after Close: with a goroutine writing, the sink
			// may not have failed yet when the writes end (a slow
			// guest).
			if err := g.c.Close(); err == nil || !strings.Contains(err.Error(), "no space") {
				t.Fatalf("close: %v, want the sink's failure", err)
			}
			var after, unwritten, discarded uint64
			for cpu := range 2 {
				st, err := g.c.StatsCPU(cpu)
				if err != nil {
					t.Fatal(err)
				}
				after += st.Records
				unwritten += st.Unwritten
				discarded += st.Discarded()
			}
			lines, notices := runBT2(t, g.dir)
			agree(t, g.dir)
			lost := 0
			for _, n := range notices {
				var c int
				var kind string
				fmt.Sscan(n, &c, &kind)
				if kind != "events" {
					t.Fatalf("babeltrace2: %s: packets lost without a count", n)
				}
				lost += c
			}
			if len(lines)+lost != calls {
				t.Fatalf("%d events and %d discarded in the trace, of %d written (%d lost without a count)", len(lines), lost, calls, calls-len(lines)-lost)
			}
			if uint64(len(lines)) != after || unwritten == 0 || after+discarded != uint64(calls) {
				t.Fatalf("stats: %d records at the end, %d unwritten, %d discarded; the trace holds %d of %d", after, unwritten, discarded, len(lines), calls)
			}
		})
	}
}
