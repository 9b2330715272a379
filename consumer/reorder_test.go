package consumer

import (
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"testing"

	"github.com/kconsume/kconsume/relayfmt"
)

func TestWindowOrder(t *testing.T) {
	w := newWindow(64)
	if len(w.buf) != 64 {
		t.Fatalf("capacity %d", len(w.buf))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var in, out []uint64
	ts := uint64(1000)
	for i := 0; i < 10000; i++ {
		ts += uint64(rng.IntN(10))
		e := ts
		if rng.IntN(10) == 0 && e > 30 {
			e -= uint64(rng.IntN(30)) // a late record stamped earlier
		}
		in = append(in, e)
		if w.full() {
			out = append(out, w.pop().ts)
		}
		w.push(entry{ts: e, pos: uint64(i), n: 1})
	}
	for w.n > 0 {
		out = append(out, w.pop().ts)
	}
	sorted := append([]uint64(nil), in...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	for i := range out {
		if out[i] != sorted[i] {
			t.Fatalf("position %d: %d, want %d", i, out[i], sorted[i])
		}
	}
	if w.reordered == 0 {
		t.Fatal("reordered not counted")
	}
}

func TestWindowReleasePos(t *testing.T) {
	w := newWindow(8)
	w.push(entry{ts: 5, pos: 100, n: 1})
	w.push(entry{ts: 3, pos: 200, n: 1})
	w.push(entry{ts: 4, pos: 7}) // loss notice: no ring position
	if p := w.releasePos(999); p != 100 {
		t.Fatalf("releasePos %d, want 100", p)
	}
	if w.last() != 5 {
		t.Fatalf("last %d", w.last())
	}
	for w.n > 0 {
		w.pop()
	}
	if p := w.releasePos(42); p != 42 {
		t.Fatalf("releasePos of an empty window %d, want 42 (all that was read)", p)
	}
}

// TestGlobalInterleave: both CPUs write into the one global ring at full
// speed; the trace must come out in time order with every record, and
// nothing clamped: the window restored the order the ring lost.
func TestGlobalInterleave(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	dir := t.TempDir()
	sink, err := relayfmt.NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	const per = 200000
	r := newRigGlobal(t, sink)
	var wg sync.WaitGroup
	for cpu := 0; cpu < 2; cpu++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pinCPU(t, cpu)
			r.produce(t, per)
		}()
	}
	wg.Wait()
	if err := r.s.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := r.s.Stats()
	lost, emitted := st[0].KernelLost+st[1].KernelLost, st[0].Emitted+st[1].Emitted
	if emitted+lost != 2*per {
		t.Fatalf("emitted %d + lost %d != %d", emitted, lost, 2*per)
	}
	if st[0].Channel.Clamped != 0 {
		t.Fatalf("%d timestamps clamped: order not restored (reordered %d)", st[0].Channel.Clamped, st[0].Reordered)
	}
	counts, discarded := countEvents(t, dir)
	if uint64(counts["bench"]) != st[0].Channel.Records || uint64(counts["bench"])+discarded != 2*per {
		t.Fatalf("trace: %d events + %d discarded, stats %d records; want %d in all", counts["bench"], discarded, st[0].Channel.Records, 2*per)
	}
	t.Logf("%d records, %d reordered, %d lost", counts["bench"], st[0].Reordered, discarded)
}

// TestWindowReleasePosRandom checks releasePos against a scan of every
// waiting record, through runs of in-order arrivals (its fast path), late
// records and loss notices, with records leaving both when the window is
// full and by time.
func TestWindowReleasePosRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	w := newWindow(32)
	scan := func(read uint64) uint64 {
		pos, ok := read, false
		for i := 0; i < w.n; i++ {
			if e := &w.buf[(w.head+i)&w.mask]; e.n != 0 && (!ok || e.pos < pos) {
				pos, ok = e.pos, true
			}
		}
		return pos
	}
	ts, pos, fast := uint64(1000), uint64(0), 0
	for i := 0; i < 200000; i++ {
		switch r := rng.IntN(100); {
		case r < 3 && w.n > 0:
			for w.n > 0 && rng.IntN(4) != 0 {
				w.pop()
			}
		case r < 5:
			if w.full() {
				w.pop()
			}
			w.push(entry{ts: w.last(), pos: 7}) // loss notice
		default:
			ts += uint64(rng.IntN(10))
			e := entry{ts: ts, pos: pos, n: 16}
			if rng.IntN(50) == 0 && ts > 40 {
				e.ts -= uint64(rng.IntN(40)) // a late record
			}
			pos += 24
			if w.full() {
				w.pop()
			}
			w.push(e)
		}
		if w.unsorted == 0 {
			fast++
		}
		if got, want := w.releasePos(pos), scan(pos); got != want {
			t.Fatalf("step %d: releasePos %d, want %d (unsorted %d)", i, got, want, w.unsorted)
		}
	}
	if fast == 0 || w.reordered == 0 {
		t.Fatalf("fast path taken %d times, %d reordered: the test did not exercise both ways", fast, w.reordered)
	}
}

// TestWindowEmptied: once the window has emptied, a record stamped before
// the last one that left is no reorder, and order holds after it.
func TestWindowEmptied(t *testing.T) {
	w := newWindow(8)
	w.push(entry{ts: 10, n: 1})
	w.pop()
	for _, ts := range []uint64{5, 7, 6} {
		w.push(entry{ts: ts, n: 1})
	}
	for _, want := range []uint64{5, 6, 7} {
		if got := w.pop().ts; got != want {
			t.Fatalf("popped %d, want %d", got, want)
		}
	}
	if w.reordered != 1 {
		t.Fatalf("reordered %d, want 1 (6 before 7)", w.reordered)
	}
}
