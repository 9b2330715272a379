package consumer

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestAreaStaleSlot: a kc_area ring's consumer never takes an earlier
// lap's bytes for a written record. bpf/test/lapword.bpf.c fills each
// record with words that look like headers of the ring's next lap, on a
// ring of the smallest size, so that most laps reserve records over such
// words while the consumer reads close behind. Every record must arrive
// once and whole: numbered without gaps but the losses counted, its words
// all alike, nothing undecodable. Before the consumer zeroed the space it
// released, it took such a word for a record within a second, lost its
// place in the ring and with it every later record.
func TestAreaStaleSlot(t *testing.T) {
	const n = 150000
	// Spaced calls: the consumer keeps up with most laps of the small
	// ring, and reads close behind the writer.
	const gap = 10 * time.Microsecond
	c := startChild(t, "getpid", n, "KC_CHILD_CPU=0", "KC_CHILD_GAP="+gap.String())
	spec, err := gen.LoadLapword()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables[gen.LapwordVarTargetTgid].Set(uint32(c.cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	s, dir := newTestSession(t, Config{
		RingSize: recorder.AreaMinRing,
		Objects:  []*ebpf.CollectionSpec{spec},
	})
	if s.OwnRings() != nil {
		if areaExpected(t) {
			t.Fatalf("own rings not used: %v", s.OwnRings())
		}
		t.Skip("no kc_area rings here (amd64 and Linux 5.12+ only)")
	}
	st := recordChild(t, s, c)
	var got, gaps, lost, bad uint64
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			lost += it.Count
			return
		}
		if it.Class.Name != "synthetic:lapword" && it.Class.Name != "synthetic:lapshort" {
			t.Fatalf("event %s in a trace of lapword and lapshort alone", it.Class.Name)
		}
		seq := field(vals, "n").Uint(0)
		if want := map[bool]string{true: "synthetic:lapword", false: "synthetic:lapshort"}[seq%2 == 1]; it.Class.Name != want {
			t.Fatalf("record %d is %s, not %s", seq, it.Class.Name, want)
		}
		if seq <= got {
			t.Fatalf("lapword %d after %d", seq, got)
		}
		gaps += seq - got - 1
		got = seq
		w := field(vals, "words")
		for i := range w.Len() {
			if w.Uint(i) != w.Uint(0) || w.Uint(i)&0xffffffff != 16 {
				bad++
				t.Logf("lapword %d: word %d is %#x, word 0 %#x", seq, i, w.Uint(i), w.Uint(0))
				break
			}
		}
	})
	var undecodable, kernelLost, missed uint64
	for _, c := range st {
		undecodable += c.Undecodable + c.Channel.Invalid
		kernelLost += c.KernelLost
		missed += c.Missed
	}
	t.Logf("%d lapword records, last %d, %d missing, %d discarded in the trace (%d lost in the kernel), %d undecodable, %d program runs missed", got-gaps, got, gaps+n-got, lost, kernelLost, undecodable, missed)
	if undecodable != 0 || bad != 0 {
		t.Fatalf("%d records undecodable, %d with mixed words: the consumer read an earlier lap's bytes as a record", undecodable, bad)
	}
	// A run of the object's program the kernel skipped (another run of it
	// preempted on the CPU, on a faultable syscall tracepoint) is counted
	// in Missed, an upper bound: the run might have been another task's.
	if missing := gaps + n - got; missing < lost || missing > lost+missed {
		t.Fatalf("%d lapword records missing, %d reported discarded and %d program runs missed", missing, lost, missed)
	}
}
