package consumer

import "testing"

func TestLossesPlace(t *testing.T) {
	tests := []struct {
		name   string
		totals []uint64 // successive totals for CPU 1
		want   []uint64 // what each call places
	}{
		{name: "grows", totals: []uint64{0, 3, 3, 10}, want: []uint64{0, 3, 0, 7}},
		// perf's count lags the recorder's: once the recorder's 5 are
		// placed, perf's 2 place nothing, and its 6 place one more.
		{name: "lagging count", totals: []uint64{5, 2, 6}, want: []uint64{5, 0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLosses(nil, 2, false, nil)
			for i, total := range tc.totals {
				if got := l.place(1, total); got != tc.want[i] {
					t.Fatalf("call %d: place(1, %d) = %d, want %d", i, total, got, tc.want[i])
				}
			}
			if l.placed[0] != 0 {
				t.Fatalf("CPU 0 placed %d", l.placed[0])
			}
		})
	}
}

func TestLossesMissed(t *testing.T) {
	tests := []struct {
		name      string
		filtered  bool
		calls     [][2]uint64 // all, lost
		want      []uint64
		seen, out uint64
	}{
		{name: "placed", calls: [][2]uint64{{4, 3}, {4, 3}, {9, 5}}, want: []uint64{3, 0, 2}, seen: 9, out: 5},
		{name: "filtered", filtered: true, calls: [][2]uint64{{4, 3}, {9, 5}}, want: []uint64{0, 0}, seen: 9},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLosses(nil, 1, tc.filtered, nil)
			for i, c := range tc.calls {
				if got := l.missed(c[0], c[1]); got != tc.want[i] {
					t.Fatalf("call %d: missed(%d, %d) = %d, want %d", i, c[0], c[1], got, tc.want[i])
				}
			}
			out := make([]CPUStats, 1)
			l.fill(out)
			if out[0].Missed != tc.seen || out[0].missedPlaced != tc.out {
				t.Fatalf("Missed %d placed %d, want %d and %d", out[0].Missed, out[0].missedPlaced, tc.seen, tc.out)
			}
		})
	}
}
