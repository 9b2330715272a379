package recorder

import "testing"

// TestWakeupMask checks how far apart the producers' looks at a ring's
// fill may be: never more records than fit in half the room above the
// watermark, at most 64, and every record for a tiny ring.
func TestWakeupMask(t *testing.T) {
	for _, c := range []struct {
		ring, mark, ncpu int
		global           bool
		want             uint64
	}{
		{4 << 20, 1 << 20, 2, false, 63},
		{4 << 20, 1 << 20, 64, true, 63},
		{4 << 20, 1 << 20, 256, true, 15},
		{4096, 1024, 2, false, 3},
		{4096, 4096, 2, false, 0},
		{4096, 1024, 8, true, 0},
	} {
		cfg := Config{RingSize: c.ring, Watermark: c.mark, Global: c.global}
		got := WakeupMask(cfg, c.ncpu)
		if got != c.want {
			t.Errorf("ring %d, watermark %d, %d CPUs, global %v: mask %d, want %d", c.ring, c.mark, c.ncpu, c.global, got, c.want)
		}
		writers := 1
		if c.global {
			writers = c.ncpu
		}
		if got > 0 && int(got+1)*sampledMax*writers > (c.ring-c.mark)/2 {
			t.Errorf("ring %d: mask %d passes over more than half the room above the watermark", c.ring, got)
		}
	}
}
