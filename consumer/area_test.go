package consumer

import (
	"encoding/binary"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/internal/testenv"
)

// areaExpected reports whether sessions must write into kc_area rings
// here: x86_64 kernels with BPF_CMPXCHG (5.12+). A kernel that should
// and does not (its verifier refused the writers, say) fails t.
func areaExpected(t testing.TB) bool {
	t.Helper()
	if runtime.GOARCH != "amd64" || !kernelAtLeast(t, 5, 12) {
		return false
	}
	if err := recorder.HaveCmpxchg(); err != nil {
		t.Fatalf("5.12+ kernel without BPF_CMPXCHG: %v", err)
	}
	return true
}

// TestOwnRings records a child's exact number of getpid calls through
// kc_area rings: small ones, which the records go round hundreds of times
// and where the writers pad to an element's end often, one of several
// elements, each walked record by record and written as packets by the
// writers (packet mode), and a BPF ring buffer for comparison. What the
// rings could not take must be counted, event for event, and babeltrace2
// must read what was written.
func TestOwnRings(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 200000
	cases := []struct {
		name  string
		ring  int
		elems int // kc_area elements per ring; 0: a BPF ring buffer
		pkt   bool
	}{
		{"64KiB", 64 << 10, 1, false},
		{"8MiB", 8 << 20, 4, false},
		{"64KiB-packets", 64 << 10, 4, true},
		{"8MiB-packets", 8 << 20, 32, true},
		{"bpf-ringbuf", 64 << 10, 0, false},
	}
	want := areaExpected(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.elems == 0 {
				recorder.Testing.NoArea = true
				defer func() { recorder.Testing.NoArea = false }()
			}
			if !tc.pkt {
				recorder.Testing.NoPackets = true
				defer func() { recorder.Testing.NoPackets = false }()
			}
			c := startChild(t, "getpid", n)
			s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{c.tid}, RingSize: tc.ring})
			used := s.OwnRings() == nil
			if !used {
				t.Logf("own rings not used: %v", s.OwnRings())
			}
			if tc.elems > 0 && want && !used {
				t.Fatalf("own rings used: %v, want %v (%v)", used, want, s.OwnRings())
			}
			if tc.elems == 0 && used {
				t.Fatal("own rings used with KC_NO_AREA")
			}
			if pkt := s.Packets() == nil; pkt != (tc.pkt && used) {
				t.Fatalf("packet mode %v, want %v: %v", pkt, tc.pkt && used, s.Packets())
			}
			if used {
				_, k := recorder.AreaShape(tc.ring)
				if tc.pkt {
					k = tc.ring / s.rec.PktElem()
				}
				if k != tc.elems {
					t.Fatalf("%d elements per ring, want %d", k, tc.elems)
				}
			}
			st := recordChild(t, s, c)
			var emitted, kernelLost, missed uint64
			for _, c := range st {
				emitted += c.Emitted
				kernelLost += c.KernelLost
				missed += c.Missed
			}
			counts, lost := countEvents(t, dir)
			rec := counts["syscalls:sys_enter_getpid"]
			t.Logf("%d recorded, %d lost in the kernel, %d runs missed; emitted %d", rec, kernelLost, missed, emitted)
			if uint64(rec) != emitted || lost != kernelLost || uint64(rec)+lost > n || uint64(rec)+lost+missed < n {
				t.Fatalf("our reader: %d events and %d lost; the recorder: %d emitted, %d lost, %d missed; want %d in all", rec, lost, emitted, kernelLost, missed, n)
			}
			lines, discards := testenv.RunBT2(t, dir)
			got := 0
			for _, l := range lines {
				if strings.Contains(l, "syscalls:sys_enter_getpid:") && strings.Contains(l, "common_pid = "+strconv.Itoa(c.tid)) {
					got++
				}
			}
			var btLost uint64
			for _, d := range discards {
				if d.Kind != "events" {
					t.Fatalf("babeltrace2 reports discarded %s", d.Kind)
				}
				btLost += uint64(d.Count)
			}
			if got != rec || len(lines) != rec || btLost != lost {
				t.Fatalf("babeltrace2: %d matching of %d lines, %d discarded; want %d and %d", got, len(lines), btLost, rec, lost)
			}
			checkPadding(t, dir)
		})
	}
}

// TestAreaRewind walks a kc_area ring laid out by hand (records and
// padding of lap 0) and checks that next finds the finished records,
// stops at one not yet written, and that rewinding the walk takes the
// records passed back out of the count, so a walk that goes over
// records again (rollback) counts each once.
func TestAreaRewind(t *testing.T) {
	const size = 256
	data := make([]byte, size)
	var prod, cons uint64
	put := func(at uint64, n uint32, disc bool) uint64 {
		h := uint64(1)<<32 | uint64(n)
		if disc {
			h |= rbDisc
		}
		binary.LittleEndian.PutUint64(data[at:], h)
		return at + (uint64(n)+rbHdrLen+7)&^7
	}
	p := put(0, 24, false)
	p = put(p, 13, false)
	p = put(p, 16, true)
	mid := p
	p = put(p, 40, false)
	prod = p + 32 // a record reserved, its header not yet written
	r := &ringbuf{size: size, mask: size - 1, data: data, consPos: &cons, prodPos: &prod, vmask: areaLapMask, lapShift: 8, area: true}
	var got []uint32
	for {
		_, n, skip, ok := r.next(prod)
		if !ok {
			break
		}
		if !skip {
			got = append(got, n)
		}
	}
	if len(got) != 3 || got[0] != 24 || got[1] != 13 || got[2] != 40 || r.cons != p || r.got != 3 {
		t.Fatalf("walked %v to %d, counted %d; want [24 13 40] to %d, 3", got, r.cons, r.got, p)
	}
	r.rewind(mid)
	if r.cons != mid || r.got != 2 {
		t.Fatalf("rewound to %d, counted %d; want %d, 2", r.cons, r.got, mid)
	}
	r.rewind(0)
	if r.got != 0 {
		t.Fatalf("rewound to 0, counted %d; want 0", r.got)
	}
	for r.cons < p {
		if _, _, _, ok := r.next(prod); !ok {
			t.Fatal("stopped before the unwritten record")
		}
	}
	if r.got != 3 {
		t.Fatalf("walked again: counted %d, want 3", r.got)
	}
}
