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
