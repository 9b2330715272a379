package relayfmt

import (
	"errors"
	"testing"
)

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
