package main

import (
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer"
)

// TestSplitMemory: every budget from the smallest up gives a geometry
// the session accepts, within the budget and using all of it but less than
// a sub-buffer, with a ring of more than 3/8 of it (the power of two
// up to 3/4); 6 MiB gives the defaults and 1408 KiB (trace-cmd's
// default buffer) a 1 MiB ring.
func TestSplitMemory(t *testing.T) {
	for _, c := range []struct{ budget, ring, size, n int }{
		{6 << 20, consumer.DefaultRingSize, consumer.DefaultSubbufSize, consumer.DefaultNSubbufs},
		{1408 << 10, 1 << 20, 48 << 10, 8},
		{64 << 10, 32 << 10, 16 << 10, 2},
		{100 << 10, 64 << 10, 16 << 10, 2},
	} {
		ring, size, n, err := splitMemory(c.budget)
		if err != nil || ring != c.ring || size != c.size || n != c.n {
			t.Errorf("splitMemory(%d) = %d, %d × %d, %v; want %d, %d × %d", c.budget, ring, n, size, err, c.ring, c.n, c.size)
		}
	}
	for budget := minMemory; budget < 64<<20; budget = budget*9/8 + 4096 {
		ring, size, n, err := splitMemory(budget)
		if err != nil {
			t.Fatalf("splitMemory(%d): %v", budget, err)
		}
		used := ring + size*n
		if used > budget || used <= budget-size || ring*8 <= budget*3 && ring > minMemRing {
			t.Errorf("splitMemory(%d) = ring %d, %d × %d: %d used", budget, ring, n, size, used)
		}
		cfg := consumer.Config{RingSize: ring, SubbufSize: size, NSubbufs: n, Dir: t.TempDir()}
		if err := cfg.Check(); err != nil {
			t.Errorf("splitMemory(%d) = ring %d, %d × %d: %v", budget, ring, n, size, err)
		}
	}
	for _, budget := range []int{1, 4096, minMemory - 1} {
		if _, _, _, err := splitMemory(budget); err == nil || !strings.Contains(err.Error(), "at least 64 KiB") {
			t.Errorf("splitMemory(%d): %v, want a clear error", budget, err)
		}
	}
}

// TestRecordMemoryFlag: --memory reaches the session's configuration,
// and is refused with the flags it replaces and below its minimum.
func TestRecordMemoryFlag(t *testing.T) {
	out := filepath.Join(t.TempDir(), "t")
	o, err := parseRecord([]string{"-o", out, "-e", "sched:sched_switch", "--memory", "1408K"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.RingSize != 1<<20 || o.cfg.SubbufSize != 48<<10 || o.cfg.NSubbufs != 8 {
		t.Errorf("--memory 1408K: ring %d, %d × %d", o.cfg.RingSize, o.cfg.NSubbufs, o.cfg.SubbufSize)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory", "32K"}, "at least 64 KiB"},
		{[]string{"--memory", "2M", "--ring-size", "1M"}, "--ring-size, not both"},
		{[]string{"--memory", "2M", "--n-subbufs", "4", "--subbuf-size", "64K"}, "--n-subbufs, --subbuf-size, not both"},
		{[]string{"--memory", "lots"}, "size"},
	} {
		_, err := parseRecord(append([]string{"-o", out, "-e", "sched:sched_switch"}, c.args...), io.Discard)
		var ue usageError
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &ue) {
			t.Errorf("%v: %v; want a usage error mentioning %q", c.args, err, c.want)
		}
	}
}
