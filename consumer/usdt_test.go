package consumer

import (
	"fmt"
	"os/exec"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestUSDTKnownArgs records the USDT probes of a C program built with
// sys/sdt.h, optimised (arguments in registers) and not (on the stack):
// each firing holds the arguments the program passed, of each size and
// sign, and the probe behind a semaphore fires, because recording it
// counts the semaphore up.
func TestUSDTKnownArgs(t *testing.T) {
	testenv.RequireRoot(t)
	requireProbes(t)
	testenv.RequireSDT(t)
	for _, opt := range []string{"-O0", "-O2"} {
		t.Run(opt, func(t *testing.T) {
			bin := testenv.BuildC(t, "testdata/kcusdt.c", opt)
			s, dir := newTestSession(t, Config{Events: []string{"usdt:" + bin + ":kcusdt:tick", "usdt:" + bin + ":kcusdt:gated"}})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			const n = 50
			if out, err := exec.Command(bin, fmt.Sprint(n)).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", bin, err, out)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			ticks, gated := 0, 0
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					t.Errorf("%v in the trace", it.Kind)
					return
				}
				switch it.Class.Name {
				case "sdt_kcusdt:tick":
					i := int64(ticks)
					got := []int64{field(vals, "arg1").Int(0), field(vals, "arg2").Int(0), field(vals, "arg4").Int(0), int64(field(vals, "arg5").Uint(0))}
					want := []int64{i, -100000 * i, 3*i - 50, 200 + i}
					if fmt.Sprint(got) != fmt.Sprint(want) || field(vals, "arg3").Uint(0) == 0 {
						t.Errorf("tick %d: arg1, 2, 4, 5 %v, want %v; arg3 (a pointer) %#x", ticks, got, want, field(vals, "arg3").Uint(0))
					}
					ticks++
				case "sdt_kcusdt:gated":
					if v := field(vals, "arg1").Int(0); v != int64(gated) {
						t.Errorf("gated %d: arg1 %d", gated, v)
					}
					gated++
				}
			})
			if ticks != n || gated != n {
				t.Fatalf("%d ticks and %d gated, want %d each", ticks, gated, n)
			}
		})
	}
}
