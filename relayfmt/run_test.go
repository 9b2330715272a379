package relayfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestRunWritesWhatWriteWrites feeds one random sequence of events to two
// channels with one UUID: to the first with Write alone, to the second
// through a Run per CPU, falling back to the Run's Append where Put
// refuses and to Write where Append needs a new sub-buffer, with flushes
// in between. The two traces must be the same bytes, and read back
// by our reader and by babeltrace2 as written.
func TestRunWritesWhatWriteWrites(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		classes int
		gap     int // every gap-th event follows a pause over 2^27 ticks
		global  bool
	}{
		{name: "compact", cfg: Config{SubbufSize: 4096, NSubbufs: 256, CPUs: 2}, classes: 7},
		{name: "extended-ids-and-gaps", cfg: Config{SubbufSize: 8192, NSubbufs: 128, CPUs: 3}, classes: 40, gap: 97},
		{name: "global", cfg: Config{SubbufSize: 4096, NSubbufs: 256, Global: true}, classes: 7, global: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.UUID = NewUUID()
			g := newGen(t, tt.cfg, nil)
			g.defineClasses(tt.classes)
			dir := t.TempDir()
			ds, err := NewDirSink(dir)
			if err != nil {
				t.Fatal(err)
			}
			cfg := tt.cfg
			cfg.Clock = g.c.cfg.Clock
			c, err := NewChannel(cfg, ds)
			if err != nil {
				t.Fatal(err)
			}
			for _, cl := range g.classes {
				if _, err := c.AddEventClass(cl.Name, cl.Fields); err != nil {
					t.Fatal(err)
				}
			}
			runs := make([]Run, len(g.ts))
			restart := func() {
				for cpu := range runs {
					runs[cpu] = c.Run(cpu)
				}
			}
			syncAll := func() {
				for cpu := range runs {
					if !runs[cpu].Sync() {
						t.Fatalf("cpu %d: sync failed", cpu)
					}
				}
			}
			restart()
			put, appended, written := 0, 0, 0
			for i := range 6000 {
				dt := uint64(1 + g.rng.IntN(5000))
				if tt.gap > 0 && i%tt.gap == tt.gap-1 {
					dt = 1<<CompactTimestampBits + uint64(g.rng.IntN(1<<29))
				}
				cpu := g.rng.IntN(len(g.ts))
				if err := g.write(cpu, dt); err != nil {
					t.Fatalf("write: %v", err)
				}
				ev := g.written[len(g.written)-1]
				r := &runs[cpu]
				if r.Put(ev.ts, ev.id, ev.payload) {
					put++
				} else {
					// What Put refuses goes through Append, which starts
					// the Run again, or, needing a new sub-buffer, Write.
					ok, err := r.Append(ev.ts, ev.id, ev.payload)
					if err != nil {
						t.Fatalf("event %d: %v", i, err)
					}
					if ok {
						appended++
					} else {
						written++
						if !r.Sync() {
							t.Fatalf("event %d: sync failed", i)
						}
						if err := c.Write(cpu, ev.ts, ev.id, ev.payload); err != nil {
							t.Fatalf("event %d: %v", i, err)
						}
						*r = c.Run(cpu)
					}
					if tt.global {
						restart() // every CPU's Run is on the one buffer
					}
				}
				if i%1500 == 1499 {
					syncAll()
					if err := g.c.Flush(); err != nil {
						t.Fatal(err)
					}
					if err := c.Flush(); err != nil {
						t.Fatal(err)
					}
					restart()
				}
			}
			syncAll()
			if tt.global != (put == 0) || appended == 0 || written == 0 {
				t.Fatalf("%d events put, %d appended, %d written", put, appended, written)
			}
			for cpu := range g.c.Streams() {
				want, _ := g.c.StatsCPU(cpu)
				got, _ := c.StatsCPU(cpu)
				got.Written, want.Written = 0, 0 // the sinks run on their own
				if got != want {
					t.Fatalf("cpu %d: stats %+v, Write alone %+v", cpu, got, want)
				}
			}
			g.close()
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			sameFiles(t, g.dir, dir)
			got, notices := readAll(t, dir)
			checkStreams(t, g, got, nil)
			if len(notices) != 0 {
				t.Fatalf("loss notices %+v", notices)
			}
			if n := agree(t, dir); n != len(g.written) {
				t.Errorf("babeltrace2 agreed on %d events, %d were written", n, len(g.written))
			}
		})
	}
}

// sameFiles fails unless directories a and b hold the same files with
// the same bytes.
func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(a, "*"))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := filepath.Glob(filepath.Join(b, "*"))
	if len(names) != len(other) || len(names) == 0 {
		t.Fatalf("%d files against %d", len(names), len(other))
	}
	for _, n := range names {
		x, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, filepath.Base(n)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Fatalf("%s differs (%d and %d bytes)", filepath.Base(n), len(x), len(y))
		}
	}
}

// TestRunRefuses checks each event a Run must leave to Write, a Run that
// cannot write at all, and a Run's Sync after another call on its buffer.
func TestRunRefuses(t *testing.T) {
	dir := t.TempDir()
	ds, err := NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewChannel(Config{SubbufSize: 4096, NSubbufs: 8, CPUs: 2}, ds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fixed, err := c.AddEventClass("t:fixed", []Field{ScalarField("x", U64)})
	if err != nil {
		t.Fatal(err)
	}
	text, err := c.AddEventClass("t:text", []Field{StringField("s")})
	if err != nil {
		t.Fatal(err)
	}
	p8 := make([]byte, 8)
	type want struct {
		ts uint64
		id uint32
	}
	written := map[int][]want{}
	put := func(r *Run, cpu int, ts uint64, id uint32, p []byte) bool {
		t.Helper()
		ok := r.Put(ts, id, p)
		if ok {
			written[cpu] = append(written[cpu], want{ts, id})
		}
		return ok
	}
	write := func(cpu int, ts uint64, id uint32) {
		t.Helper()
		if err := c.Write(cpu, ts, id, p8); err != nil {
			t.Fatal(err)
		}
		written[cpu] = append(written[cpu], want{ts, id})
	}

	if r := c.Run(0); put(&r, 0, 10, fixed.ID, p8) || !r.Sync() {
		t.Fatal("a run with no open sub-buffer took an event")
	}
	if r := c.Run(7); put(&r, 0, 10, fixed.ID, p8) || !r.Sync() {
		t.Fatal("a run on an unknown cpu took an event")
	}
	unknown := c.Run(7)
	if _, err := unknown.Append(10, fixed.ID, p8); !errors.Is(err, ErrNoStream) {
		t.Fatalf("append on an unknown cpu's run: %v", err)
	}

	// A class added after a buffer's writer last looked is new to its
	// Runs until Write has met it there.
	write(1, 50, fixed.ID)
	for i := range MaxCompactID {
		if _, err := c.AddEventClass(fmt.Sprintf("t:pad%d", i), []Field{ScalarField("x", U64)}); err != nil {
			t.Fatal(err)
		}
	}
	far, err := c.AddEventClass("t:far", []Field{ScalarField("x", U64)})
	if err != nil || far.ID <= MaxCompactID {
		t.Fatalf("class %v: %v", far, err)
	}
	if r := c.Run(1); put(&r, 1, 51, 5, p8) {
		t.Fatal("a run took a class its buffer has not met")
	}
	write(1, 51, 5)
	if r := c.Run(1); !put(&r, 1, 52, 5, p8) || !r.Sync() {
		t.Fatal("a run refused a class met by Write")
	}

	write(0, 100, fixed.ID)
	r := c.Run(0)
	if r.LastTS() != 100 {
		t.Fatalf("run's last timestamp %d", r.LastTS())
	}
	for _, tc := range []struct {
		what string
		ts   uint64
		id   uint32
		p    []byte
	}{
		{"an earlier timestamp", 99, fixed.ID, p8},
		{"a timestamp past a compact header", 100 + 1<<CompactTimestampBits, fixed.ID, p8},
		{"an id past a compact header", 101, far.ID, p8},
		{"an unknown id", 101, far.ID + 1, p8},
		{"a variable-size class", 101, text.ID, []byte("abcdefg\x00")},
		{"a short payload", 101, fixed.ID, p8[:7]},
		{"a long payload", 101, fixed.ID, make([]byte, 9)},
	} {
		if put(&r, 0, tc.ts, tc.id, tc.p) {
			t.Fatalf("run took %s", tc.what)
		}
	}
	if !put(&r, 0, 1<<CompactTimestampBits+99, fixed.ID, p8) {
		t.Fatal("run refused the last timestamp a compact header can carry")
	}
	if !r.Sync() {
		t.Fatal("sync failed")
	}
	m := c.Mark(0)
	if m.TS() != 1<<CompactTimestampBits+99 || c.LastTS(0) != m.TS() {
		t.Fatalf("mark at %d, channel at %d", m.TS(), c.LastTS(0))
	}
	kept := len(written[0])
	// The packet's last full timestamp is 100: from here on only the
	// same timestamp fits a compact header.
	for range 5 {
		if !put(&r, 0, r.LastTS(), fixed.ID, p8) {
			t.Fatal("run refused an event")
		}
	}
	if !r.Sync() || !c.Undo(m) {
		t.Fatal("undo to a mark past a run's events failed")
	}
	written[0] = written[0][:kept]
	// A Run does not store its state over what another call changed.
	stale := c.Run(0)
	write(0, c.LastTS(0), fixed.ID)
	if stale.Sync() {
		t.Fatal("a run synced over an event written since it started")
	}
	stale = c.Run(0)
	if !c.Undo(m) || stale.Sync() {
		t.Fatal("a run synced over an undo")
	}
	written[0] = written[0][:kept]

	r = c.Run(0)
	n := 0
	for put(&r, 0, r.LastTS(), fixed.ID, p8) {
		n++
	}
	if n == 0 || n > 4096/12 {
		t.Fatalf("run took %d events before its sub-buffer was full", n)
	}
	if !r.Sync() {
		t.Fatal("sync failed")
	}
	if ok, err := r.Append(r.LastTS(), fixed.ID, p8); ok || err != nil {
		t.Fatalf("append past the end of the sub-buffer: %v %v", ok, err)
	}
	if st, _ := c.StatsCPU(0); st.Packets != 0 {
		t.Fatal("a run started a sub-buffer")
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	got, notices := readAll(t, dir)
	if len(notices) != 0 {
		t.Fatalf("notices %+v", notices)
	}
	for cpu := range 2 {
		if len(got[cpu]) != len(written[cpu]) {
			t.Fatalf("cpu %d: read %d events, want %d", cpu, len(got[cpu]), len(written[cpu]))
		}
		for i, ev := range got[cpu] {
			if ev.ts != written[cpu][i].ts || ev.id != written[cpu][i].id {
				t.Fatalf("cpu %d event %d: %d/%d, want %+v", cpu, i, ev.ts, ev.id, written[cpu][i])
			}
		}
	}
	agree(t, dir)
}

// TestRunGlobal checks that a global channel's Run refuses every event:
// its events carry the CPU, which Put does not write.
func TestRunGlobal(t *testing.T) {
	c, err := NewChannel(Config{SubbufSize: 4096, NSubbufs: 2, Global: true}, &DiscardSink{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := c.AddEventClass("t:fixed", []Field{ScalarField("x", U64)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(1, 100, cl.ID, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	r := c.Run(1)
	if r.LastTS() != 100 || r.Put(101, cl.ID, make([]byte, 8)) || !r.Sync() {
		t.Fatal("a global channel's run took an event")
	}
}

// TestRunReserveWritesWhatPutWrites writes one sequence of events to two
// channels with one UUID and clock: to the first with Put, to the second
// by filling the room Reserve returns, with refused events (a payload of
// the wrong size, a timestamp gone back, a full sub-buffer) going to
// Write on both. The two traces must be the same bytes, read back by our
// reader and babeltrace2.
func TestRunReserveWritesWhatPutWrites(t *testing.T) {
	cfg := Config{SubbufSize: 4096, NSubbufs: 64, CPUs: 1, UUID: NewUUID()}
	open := func() (*Channel, string, uint32) {
		dir := t.TempDir()
		ds, err := NewDirSink(dir)
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewChannel(cfg, ds)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := c.AddEventClass("t:fixed", []Field{ScalarField("seq", U64), ArrayField("pad", U8, 20)})
		if err != nil {
			t.Fatal(err)
		}
		return c, dir, cl.ID
	}
	put, putDir, id := open()
	res, resDir, _ := open()
	rp, rr := put.Run(0), res.Run(0)
	payload := make([]byte, 28)
	reserved, refused := 0, 0
	ts := uint64(1000)
	for i := range 3000 {
		ts += uint64(1 + i%50)
		binary.LittleEndian.PutUint64(payload, uint64(i))
		for j := 8; j < len(payload); j++ {
			payload[j] = byte(i + j)
		}
		if i%500 == 250 && rr.Reserve(ts, id, len(payload)-1) != nil {
			t.Fatalf("event %d: Reserve took a payload of the wrong size", i)
		}
		if i > 0 && rr.Reserve(ts-1000, id, len(payload)) != nil {
			t.Fatalf("event %d: Reserve took a timestamp gone back", i)
		}
		okPut := rp.Put(ts, id, payload)
		dst := rr.Reserve(ts, id, len(payload))
		if okPut != (dst != nil) {
			t.Fatalf("event %d: Put %v, Reserve %v", i, okPut, dst != nil)
		}
		if dst != nil {
			if len(dst) != len(payload) {
				t.Fatalf("event %d: %d bytes reserved, want %d", i, len(dst), len(payload))
			}
			copy(dst, payload)
			reserved++
			continue
		}
		refused++
		for _, w := range []struct {
			c *Channel
			r *Run
		}{{put, &rp}, {res, &rr}} {
			if !w.r.Sync() {
				t.Fatalf("event %d: sync failed", i)
			}
			if err := w.c.Write(0, ts, id, payload); err != nil {
				t.Fatal(err)
			}
			*w.r = w.c.Run(0)
		}
	}
	if !rp.Sync() || !rr.Sync() {
		t.Fatal("sync failed")
	}
	if reserved == 0 || refused == 0 {
		t.Fatalf("%d events reserved, %d refused", reserved, refused)
	}
	if err := put.Close(); err != nil {
		t.Fatal(err)
	}
	if err := res.Close(); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, putDir, resDir)
	if n := agree(t, resDir); n != 3000 {
		t.Errorf("babeltrace2 agreed on %d events, 3000 were written", n)
	}
}
