package consumer

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kconsume/kconsume/consumer/layout"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestCopiedWritesWhatTranscodeWrites drains one ring of records, some
// late, some of an unknown class and some too short for their layout,
// twice: once with the class's layout of copies written straight into
// the sub-buffer (putCopied), once through transcode and its scratch copy
// (the layout's copies hidden from the drain). The stream files must be
// the same bytes (but for the trace's UUID), every event's payload the
// transcode of its record, read back by our reader and babeltrace2 alike;
// and so for a layout of copies and deltas.
func TestCopiedWritesWhatTranscodeWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []layout.Op
	}{
		{"runs", []layout.Op{{Kind: layout.OpCopy, Off: 40, N: 24}, {Kind: layout.OpCopy, Off: 3, N: 37}, {Kind: layout.OpCopy, Off: 0, N: 3}}},
		// common_type, then the rest, as a layout with one hole.
		{"type-and-rest", []layout.Op{{Kind: layout.OpCopy, Off: 0, N: 2}, {Kind: layout.OpCopy, Off: 2, N: 62}}},
		// Copies and deltas (Adjust.Delta): adjusted.put's path.
		{"adjusted", []layout.Op{{Kind: layout.OpCopy, Off: 0, N: 2}, {Kind: layout.OpCopy, Off: 2, N: 30}, {Kind: layout.OpAdd, Off: 4, N: -100}, {Kind: layout.OpCopy, Off: 32, N: 32}, {Kind: layout.OpAdd, Off: 4, N: 7}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testCopiedLayout(t, &layout.Layout{Name: "bench", Fixed: 64, Ops: tc.ops})
		})
	}
}

func testCopiedLayout(t *testing.T, l *layout.Layout) {
	const n = 6000
	// Out of order, so that each path writes from the walk, the window
	// and catchUp.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	for at := 100; at < n; at += 211 {
		d := 1 + at%13
		v := order[at-d]
		copy(order[at-d:at], order[at-d+1:at+1])
		order[at] = v
	}
	bad := map[int]bool{}
	type run struct {
		dir      string
		uuid     [16]byte
		payloads [][]byte
		copied   bool
	}
	drain := func(straight bool) run {
		out := run{dir: t.TempDir(), copied: straight}
		sink, err := relayfmt.NewDirSink(out.dir)
		if err != nil {
			t.Fatal(err)
		}
		r := newRigCfg(t, Ringbuf, 64, Config{Sink: sink, SubbufSize: 4096, NSubbufs: 256, RingSize: 1 << 20, Transport: Ringbuf, ReorderMax: 16}, false)
		s := r.s
		s.w.setLayout(0, l)
		if s.w.copied[0].ops == nil && s.w.copied[0].adj == nil {
			t.Fatal("the layout of copies is not taken as one")
		}
		if !straight {
			s.w.copied[0] = copied{}
		}
		st := s.dr.streams[0]
		st.src.close()
		rb := memRing(t, order)
		rec := recordBytes(64)
		for i, v := range order {
			b := rb.data[i*rec+rbHdrLen:]
			for j := 8; j < 64; j++ {
				b[recHdrLen+j] = byte(v*7 + j)
			}
			switch {
			case i%997 == 500:
				binary.LittleEndian.PutUint32(b[8:], 999) // unknown class
				bad[v] = true
			case i%1009 == 700:
				binary.LittleEndian.PutUint16(b[12:], 40) // shorter than the layout
				bad[v] = true
			}
		}
		st.src, st.data = rb, rb.data
		end := *rb.prodPos
		for i := 0; i < n; i += 173 {
			*rb.prodPos = min(end, uint64(i+173)*uint64(rec))
			st.src.drain(s.w, s.dr.loss, st, 0)
		}
		st.src.drain(s.w, s.dr.loss, st, ^uint64(0))
		if st.rollbacks == 0 {
			t.Fatal("no rollback: the drain did not write straight from the ring")
		}
		stats := s.stats()
		if stats[0].Undecodable != uint64(len(bad)) {
			t.Fatalf("%d undecodable, want %d", stats[0].Undecodable, len(bad))
		}
		out.uuid = s.ch.Metadata().UUID
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		walkTrace(t, out.dir, func(it *relayfmt.Item, _ []relayfmt.Value) {
			if it.Kind == relayfmt.EventItem {
				out.payloads = append(out.payloads, slices.Clone(it.Payload))
			}
		})
		return out
	}
	fast, slow := drain(true), drain(false)

	// Every payload is the transcode of its record, in time order.
	if len(fast.payloads) != n-len(bad) {
		t.Fatalf("%d events, want %d", len(fast.payloads), n-len(bad))
	}
	raw := make([]byte, 64)
	k := 0
	for v := range n {
		if bad[v] {
			continue
		}
		binary.LittleEndian.PutUint64(raw, uint64(v))
		for j := 8; j < 64; j++ {
			raw[j] = byte(v*7 + j)
		}
		want, ok := l.Transcode(nil, raw)
		if !ok || !bytes.Equal(fast.payloads[k], want) {
			t.Fatalf("event %d: payload %x, want %x", k, fast.payloads[k], want)
		}
		k++
	}
	// The same bytes in every stream file; the metadata differs in its
	// UUID and clock offset alone, which babeltrace2's output shows.
	names, err := filepath.Glob(filepath.Join(slow.dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	streams := 0
	for _, name := range names {
		base := filepath.Base(name)
		if base == "metadata" {
			continue
		}
		a, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(fast.dir, base))
		if err != nil {
			t.Fatal(err)
		}
		a = bytes.ReplaceAll(a, slow.uuid[:], fast.uuid[:])
		if !bytes.Equal(a, b) {
			t.Fatalf("%s differs (%d and %d bytes)", base, len(a), len(b))
		}
		streams++
	}
	if streams == 0 {
		t.Fatal("no stream files")
	}
	fastLines, fastDisc := testenv.RunBT2(t, fast.dir)
	slowLines, slowDisc := testenv.RunBT2(t, slow.dir)
	// A discard's time of day comes from the clock offset.
	for _, d := range [][]testenv.Discard{fastDisc, slowDisc} {
		for i := range d {
			d[i].Begin, d[i].End = "", ""
		}
	}
	if len(fastLines) != len(fast.payloads) || len(fastDisc) != len(bad) || !slices.Equal(fastLines, slowLines) || !slices.Equal(fastDisc, slowDisc) {
		t.Fatalf("babeltrace2 read %d events and %d discards, through transcode %d events and %d discards, or they differ", len(fastLines), len(fastDisc), len(slowLines), len(slowDisc))
	}
}
