package relayfmt

import (
	"bytes"
	"testing"
)

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
