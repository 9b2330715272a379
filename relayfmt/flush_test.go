package relayfmt

import (
	"errors"
	"testing"
)

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
