package main

import (
	"fmt"
	"slices"
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
		res.parse(r, strings.NewReader("goos: linux\n"+line+"\nPASS\n"), "")
		res.parse(r, strings.NewReader("BenchmarkDrain/cilium-ReadInto/64B-2 100 1 ns/op 20000000 rec/s\n"), "")
	}
	if got := summarize(res.get(m("Drain/kconsume/64B", "rec/s"))); got.med != 50e6 || got.min != 40e6 || got.max != 60e6 || got.n != 3 {
		t.Fatalf("summary %+v", got)
	}
	if got := summarize(res.ratio(m("Drain/kconsume/64B", "rec/s"), m("Drain/cilium-ReadInto/64B", "rec/s"))); got.med != 2.5 || got.min != 2 || got.max != 3 {
		t.Fatalf("ratio %+v", got)
	}
	table := render(res, 3, 0, true, nil)
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
		res.parse(r, strings.NewReader("BenchmarkTracepointCost-2 100 1 ns/op 50 kconsume-added-ns 0.5 added-cost-ratio "+lost+" kconsume-lost\n"), "")
	}
	if table := render(res, 2, 0, true, nil); !strings.Contains(table, "≤ 0.85 × trace-cmd's, nothing lost: **missed** (kconsume-lost in 1 of 2 rounds)") {
		t.Errorf("a lossy round is not judged:\n%s", table)
	}
	res = results{}
	res.parse(0, strings.NewReader("BenchmarkTracepointCost-2 100 1 ns/op 50 kconsume-added-ns 0.5 added-cost-ratio 0 kconsume-lost\n"), "")
	if table := render(res, 1, 0, true, nil); !strings.Contains(table, "≤ 0.85 × trace-cmd's, nothing lost: met") {
		t.Errorf("a round without loss is not met:\n%s", table)
	}
	res = results{}
	res.parse(0, strings.NewReader("BenchmarkTracepointCost-2 100 1 ns/op 50 kconsume-added-ns 0.5 added-cost-ratio\n"), "")
	if table := render(res, 1, 0, true, nil); !strings.Contains(table, "**missed** (kconsume-lost not reported)") {
		t.Errorf("a missing loss count is not judged:\n%s", table)
	}
}

// TestGuestRows reads a guest's console as runGuest does, round markers
// and all, and renders its rows under a heading that says where they
// were measured; a guest that could not boot leaves one line a section.
func TestGuestRows(t *testing.T) {
	res := results{}
	c := &guestConsole{res: res}
	for r, v := range []string{"1.05", "1.20", "1.08"} {
		fmt.Fprintf(c, "bench-guest: round %d family 0\n", r)
		fmt.Fprintf(c, "boot noise\nBenchmarkEventCost-2 200000 1 ns/op 900 rawperf-pinned-kconsume-added-ns-chunk %s rawperf-pinned-vs-btf-chunk 0 rawperf-kconsume-lost\n", v)
		fmt.Fprintf(c, "bench-guest: status 0\n")
	}
	fmt.Fprintf(c, "bench-guest: round 0 family 1\nBenchmarkPreemptKept-2 20000 1 ns/op 100 kconsume-kept-%% 100 ftrace-kept-%% 3 kconsume-lost 0 kconsume-skipped\nbench-guest: status 1\n")
	c.flush()
	if c.failed != "./consumer ^BenchmarkPreemptKept$" {
		t.Errorf("failed family %q", c.failed)
	}
	if got := summarize(res.get(m("EventCost@guest", "rawperf-pinned-vs-btf-chunk"))); got.med != 1.08 || got.n != 3 {
		t.Fatalf("guest ratio %+v", got)
	}
	if len(res.get(m("EventCost", "rawperf-pinned-vs-btf-chunk"))) != 0 {
		t.Fatal("a guest's figure counted as the host's")
	}
	table := render(res, 3, 0, false, &guestRun{kernel: "newest", release: "7.3.4+deb13-amd64", accel: "tcg"})
	for _, want := range []string{
		"QEMU TCG guest, Linux 7.3.4+deb13-amd64, 2 vCPUs: ratios only",
		"1.08 (1.05–1.20) × the same binary without the fix (`KCONSUME_RAW_FROM_PERF=0`) | ≤ 1.10 × without the fix (issue 57 item 4), nothing lost: met |",
		"every event ftrace keeps, in every round (issue 57 item 1), nothing lost: **missed** (kconsume-lost in 1 of 1 rounds)",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, "Drain") {
		t.Errorf("host rows in a guest-only table:\n%s", table)
	}
	table = render(res, 3, 0, true, &guestRun{kernel: "newest", err: fmt.Errorf("no qemu-system-x86_64")})
	if n := strings.Count(table, "not measured: no guest of kernel newest here: no qemu-system-x86_64"); n != 3 {
		t.Errorf("%d lines say why the guest did not run, want one a guest section:\n%s", n, table)
	}
	if strings.Contains(table, "kconsume, raw path from the perf tracepoints") {
		t.Errorf("a guest row without its guest:\n%s", table)
	}
}

// TestLossColumnsJudged: a row with a target whose other columns count
// lost, dropped, missed or skipped work judges them too: they are among
// its losses (met only where each was 0), or its target is itself a
// share of what was lost or delivered and says so.
func TestLossColumnsJudged(t *testing.T) {
	lossy := []string{"lost", "dropped", "missed", "missing", "overrun", "skipped", "discarded", "not in"}
	for _, sr := range rows() {
		r := sr.row
		if r.ok == nil {
			continue
		}
		judgedInTarget := strings.Contains(r.target, "lost") || strings.Contains(r.target, "deliver") || strings.Contains(r.target, "share")
		for _, e := range r.extra {
			isLoss := false
			for _, w := range lossy {
				isLoss = isLoss || strings.Contains(e.label, w)
			}
			// A time ("ms longest drainer overrun") counts no work.
			if !isLoss || strings.HasPrefix(e.label, "ms ") || judgedInTarget || slices.Contains(r.losses, e.m) {
				continue
			}
			t.Errorf("row %q (target %q): its column %q is not judged", r.what, r.target, e.label)
		}
	}
}
