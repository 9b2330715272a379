package consumer

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kconsume/kconsume/consumer/layout"

	"github.com/kconsume/kconsume/relayfmt"
)

// TestLateRecordsPlaced drains a ring holding late records at chosen
// places: a record stamped before the d records ahead of it in the ring,
// as a nested interrupt or a CPU racing in the global ring leaves it. The
// kernel cannot be made to produce them at will, so the ring is laid out
// in memory as kernel/bpf/ringbuf.c lays it out and handed to a real
// session's stream, drained in chunks as a producer would fill it.
// Records are written straight from the ring, so a late one sends the
// drain back to a checkpoint; small sub-buffers put many of the late ones
// near a packet boundary. Every record late by no more than the window
// is sure to hold must come out in its place, none clamped; one far
// beyond it is clamped, as the window alone would clamp it.
func TestLateRecordsPlaced(t *testing.T) {
	type lateCase struct {
		subbuf, reorderMax, n, chunk int
		late                         [][2]int // ring index, records late by
		far                          int      // ring index of a record far too late, or 0
		name                         string
		// final drains each chunk with every record final, as a live
		// drain does once the reorder time has passed: the late records
		// of the next chunk still have checkpoints to go back to.
		final bool
		// transcoded gives the class a layout that copies its fields in
		// runs, as a tracepoint's is: its records take the drain's other
		// path.
		transcoded bool
		// bad lists ring indices of records of an unknown class: each
		// must come out as one discarded event, the records around it
		// in place.
		bad []int
	}
	cases := []lateCase{
		{subbuf: 4096, reorderMax: 16, n: 3000, chunk: 37,
			late: [][2]int{{100, 1}, {161, 2}, {230, 5}, {400, 12}, {655, 3}, {1000, 12}, {1203, 7}, {1500, 1}, {1777, 9}, {2100, 12}, {2222, 4}},
			far:  2600},
		{subbuf: 256 << 10, reorderMax: 1024, n: 20000, chunk: 1500,
			late: [][2]int{{2000, 1}, {5000, 100}, {9000, 900}, {12000, 3}, {15000, 512}},
			far:  18000},
	}
	final := lateCase{subbuf: 64 << 10, reorderMax: 64, n: 5000, chunk: 200, final: true, name: "final-chunks"}
	for at := 210; at < final.n; at += 400 {
		final.late = append(final.late, [2]int{at, 1 + at%7})
	}
	cases = append(cases, final)
	tc := cases[0]
	tc.transcoded, tc.name = true, "transcoded"
	cases = append(cases, tc)
	for _, transcoded := range []bool{false, true} {
		tc := cases[0]
		tc.transcoded, tc.bad, tc.name = transcoded, []int{50, 300, 301, 800, 1400, 2400}, fmt.Sprintf("undecodable-transcoded%v", transcoded)
		cases = append(cases, tc)
	}
	// A late record a few places behind an undecodable one, in the
	// middle of large packets, where the walk writes straight from the
	// ring: counting the undecodable one there would forbid going back
	// past it, and the late one would come out clamped.
	cases = append(cases, lateCase{subbuf: 256 << 10, reorderMax: 64, n: 3000, chunk: 3000,
		late: [][2]int{{1005, 8}, {2010, 3}}, bad: []int{1000, 2009}, name: "late-behind-undecodable"})
	// Late records at random places, so that some land at every distance
	// from a packet boundary and from a drain's end.
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		tc := lateCase{subbuf: 4096, reorderMax: 16 << (seed % 3), n: 6000, chunk: 1 + rng.IntN(300), name: fmt.Sprintf("seed%d", seed)}
		for at := tc.reorderMax; ; {
			at += 2*tc.reorderMax + rng.IntN(4*tc.reorderMax)
			if at >= tc.n {
				break
			}
			// The full window writes its oldest a sixteenth at a time, so
			// only a record late by no more than the rest is sure of its
			// place: half the late records are late by just that.
			d := tc.reorderMax - max(1, tc.reorderMax/16)
			if rng.IntN(2) == 0 {
				d = 1 + rng.IntN(d)
			}
			tc.late = append(tc.late, [2]int{at, d})
		}
		cases = append(cases, tc)
	}
	for _, tc := range cases {
		if tc.name == "" {
			tc.name = fmt.Sprintf("subbuf%d-max%d", tc.subbuf, tc.reorderMax)
		}
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sink, err := relayfmt.NewDirSink(dir)
			if err != nil {
				t.Fatal(err)
			}
			r := newRigCfg(t, Ringbuf, 64, Config{Sink: sink, SubbufSize: tc.subbuf, NSubbufs: 256, RingSize: 1 << 20, Transport: Ringbuf, ReorderMax: tc.reorderMax}, false)
			s := r.s
			if l := s.w.layouts[0]; l == nil || l.Name != "bench" {
				t.Fatal("class 0 is not the bench class")
			}
			if tc.transcoded {
				s.w.setLayout(0, &layout.Layout{Name: "bench", Fixed: 64, Ops: []layout.Op{{Kind: layout.OpCopy, N: 8}, {Kind: layout.OpCopy, Off: 8, N: 56}}})
			}
			// Ring order: time order with each late record moved d places on.
			order := make([]int, tc.n)
			for i := range order {
				order[i] = i
			}
			move := func(at, d int) {
				v := order[at-d]
				copy(order[at-d:at], order[at-d+1:at+1])
				order[at] = v
			}
			for _, l := range tc.late {
				move(l[0], l[1])
			}
			if tc.far != 0 {
				move(tc.far, 10*tc.reorderMax)
			}
			st := s.dr.streams[0]
			st.src.close()
			rb := memRing(t, order)
			skip := map[int]bool{}
			for _, i := range tc.bad {
				binary.LittleEndian.PutUint32(rb.data[i*recordBytes(64)+rbHdrLen+8:], 999)
				skip[order[i]] = true
			}
			st.src, st.data = rb, rb.data
			end := *rb.prodPos
			for i := 0; i < tc.n; i += tc.chunk {
				*rb.prodPos = min(end, uint64(i+tc.chunk)*uint64(recordBytes(64)))
				cutoff := uint64(0)
				if tc.final {
					cutoff = ^uint64(0)
				}
				st.src.drain(s.w, s.dr.loss, st, cutoff)
			}
			st.src.drain(s.w, s.dr.loss, st, ^uint64(0)) // as Close drains when the drainer runs
			rollbacks := st.rollbacks
			stats := s.stats() // no drainer goroutine runs in this rig
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			var seqs []int
			discarded := uint64(0)
			walkTrace(t, dir, func(it *relayfmt.Item, _ []relayfmt.Value) {
				if it.Kind == relayfmt.EventItem {
					seqs = append(seqs, int(binary.LittleEndian.Uint64(it.Payload)))
				} else if it.Kind == relayfmt.DiscardedEvents {
					discarded += it.Count
				}
			})
			if discarded != uint64(len(tc.bad)) || stats[0].Undecodable != uint64(len(tc.bad)) {
				t.Errorf("%d events discarded, %d undecodable, want %d of each", discarded, stats[0].Undecodable, len(tc.bad))
			}
			wantClamped := uint64(0)
			if tc.far != 0 {
				// Its place long written, the far record comes out with
				// its timestamp raised, as the window alone would write it.
				wantClamped = 1
			}
			want := make([]int, 0, tc.n)
			for v := range tc.n {
				if !skip[v] {
					want = append(want, v)
				}
			}
			if len(seqs) != len(want) {
				t.Fatalf("trace holds %d records, want %d", len(seqs), len(want))
			}
			sorted := slices.Clone(seqs)
			slices.Sort(sorted)
			if !slices.Equal(sorted, want) {
				t.Fatalf("trace holds %d records, not each of the %d decodable ones once", len(seqs), len(want))
			}
			if tc.far == 0 && !slices.Equal(seqs, sorted) {
				for i := 1; i < len(seqs); i++ {
					if seqs[i] < seqs[i-1] {
						t.Fatalf("records out of time order at %d: %v", i, seqs[max(0, i-20):min(len(seqs), i+5)])
					}
				}
			}
			if tc.far != 0 {
				// Apart from the far one, everything in time order.
				rest := slices.DeleteFunc(slices.Clone(seqs), func(v int) bool { return v == order[tc.far] })
				if !slices.IsSorted(rest) {
					for i := 1; i < len(rest); i++ {
						if rest[i] < rest[i-1] {
							t.Fatalf("records other than the far-late one out of time order: %v", rest[max(0, i-20):min(len(rest), i+5)])
						}
					}
				}
			}
			cs := stats[0].Channel
			if cs.Clamped != wantClamped {
				t.Errorf("%d timestamps clamped, want %d", cs.Clamped, wantClamped)
			}
			if wantRe := uint64(len(tc.late)) + wantClamped; stats[0].Reordered != wantRe {
				t.Errorf("%d records counted as reordered, want %d", stats[0].Reordered, wantRe)
			}
			if rollbacks == 0 {
				t.Errorf("no rollback for %d late records: the drain did not write straight from the ring", len(tc.late))
			}
			t.Logf("%d records, %d packets, %d rollbacks, %d reordered, %d clamped", len(seqs), cs.Packets, rollbacks, stats[0].Reordered, cs.Clamped)
		})
	}
}

// memRing lays out 64-byte bench records in memory as a BPF ring buffer
// holds them: the record for order[i] is stamped 1000*(order[i]+1) and
// carries order[i] as its sequence number.
func memRing(t *testing.T, order []int) *ringbuf {
	t.Helper()
	const size = 4 << 20
	rec := recordBytes(64)
	if len(order)*rec > size {
		t.Fatalf("%d records do not fit the ring", len(order))
	}
	r := &ringbuf{size: size, mask: size - 1, consPos: new(uint64), prodPos: new(uint64), data: make([]byte, 2*size)}
	le := binary.LittleEndian
	for i, v := range order {
		b := r.data[i*rec:]
		le.PutUint32(b, uint32(recHdrLen+64))
		le.PutUint64(b[rbHdrLen:], uint64(1000*(v+1)))
		le.PutUint32(b[rbHdrLen+8:], 0)
		le.PutUint16(b[rbHdrLen+12:], 64)
		le.PutUint16(b[rbHdrLen+14:], 0)
		le.PutUint64(b[rbHdrLen+recHdrLen:], uint64(v))
	}
	*r.prodPos = uint64(len(order) * rec)
	return r
}
