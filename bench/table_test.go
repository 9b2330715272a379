package main

import (
	"strings"
	"testing"
)

func TestParseAndRender(t *testing.T) {
	res := results{}
	for r, line := range []string{
		"BenchmarkDrain/kconsume/64B-2   	     100	  1 ns/op	  40000000 rec/s	21.5 cpu-ns/rec",
		"BenchmarkDrain/kconsume/64B-2   	     100	  1 ns/op	  50000000 rec/s	20.5 cpu-ns/rec",
		"BenchmarkDrain/kconsume/64B-2   	     100	  1 ns/op	  60000000 rec/s	19.5 cpu-ns/rec",
	} {
		res.parse(r, strings.NewReader("goos: linux\n"+line+"\nPASS\n"))
		res.parse(r, strings.NewReader("BenchmarkDrain/cilium-ReadInto/64B-2 100 1 ns/op 20000000 rec/s\n"))
	}
	if got := summarize(res.get(m("Drain/kconsume/64B", "rec/s"))); got.med != 50e6 || got.min != 40e6 || got.max != 60e6 || got.n != 3 {
		t.Fatalf("summary %+v", got)
	}
	if got := summarize(res.ratio(m("Drain/kconsume/64B", "rec/s"), m("Drain/cilium-ReadInto/64B", "rec/s"))); got.med != 2.5 || got.min != 2 || got.max != 3 {
		t.Fatalf("ratio %+v", got)
	}
	table := render(res, 3, 0)
	for _, want := range []string{
		"| kconsume drain + transcode into sub-buffers, 64 B | 50.0 (40.0–60.0) M rec/s; 20.5 (19.5–21.5) CPU ns/rec | 2.50 (2.00–3.00) × cilium ReadInto | ≥ 100 M rec/s and ≥ 2.5 × ReadInto: **missed** |",
		"| kconsume drain + transcode into sub-buffers, 32 B | not measured",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// TestLossesJudged holds a row with a loss count to missed wherever a
// round lost work, whatever its figure, and to met only where none did.
func TestLossesJudged(t *testing.T) {
	res := results{}
	for r, lost := range []string{"0", "3"} {
		res.parse(r, strings.NewReader("BenchmarkTracepointCost-2 100 1 ns/op 50 kconsume-added-ns 0.5 added-cost-ratio "+lost+" kconsume-lost\n"))
	}
	if table := render(res, 2, 0); !strings.Contains(table, "≤ 0.85 × trace-cmd's, nothing lost: **missed** (kconsume-lost in 1 of 2 rounds)") {
		t.Errorf("a lossy round is not judged:\n%s", table)
	}
	res = results{}
	res.parse(0, strings.NewReader("BenchmarkTracepointCost-2 100 1 ns/op 50 kconsume-added-ns 0.5 added-cost-ratio 0 kconsume-lost\n"))
	if table := render(res, 1, 0); !strings.Contains(table, "≤ 0.85 × trace-cmd's, nothing lost: met") {
		t.Errorf("a round without loss is not met:\n%s", table)
	}
	res = results{}
	res.parse(0, strings.NewReader("BenchmarkTracepointCost-2 100 1 ns/op 50 kconsume-added-ns 0.5 added-cost-ratio\n"))
	if table := render(res, 1, 0); !strings.Contains(table, "**missed** (kconsume-lost not reported)") {
		t.Errorf("a missing loss count is not judged:\n%s", table)
	}
}
