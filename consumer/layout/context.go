package layout

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kconsume/kconsume/relayfmt"
)

// Context is one of LTTng's kernel contexts (lttng add-context -k),
// recorded behind an event's record, before its call chains: its name
// as LTTng spells it, the field it adds, and its bit in the recorder's
// kc_tp_info.ctx (KC_CTX_* of bpf/kc/context.h, which writes them in
// the order of Contexts).
type Context struct {
	Name  string
	Field relayfmt.Field
	Bit   uint16
	// Perf is the counter of a perf context (Bit 0 until the recorder
	// gives it a slot), nil for the others.
	Perf *PerfCounter
}

// PerfCounter is a perf event the recorder reads for a perf context:
// perf_event_attr's type and config (include/uapi/linux/perf_event.h).
type PerfCounter struct {
	Type, Config uint64
}

// Size returns the bytes the context takes in a record.
func (c Context) Size() int {
	if c.Field.Kind == relayfmt.Array {
		return c.Field.Len
	}
	return c.Field.Elem.Size()
}

// MaxPerf mirrors KC_CTX_PERF_MAX (bpf/kc/context.h; TestMirrorsC): the
// most perf contexts an event records.
const MaxPerf = 4

// ctxPerf0 mirrors KC_CTX_PERF0: the bit of perf counter slot 0.
const ctxPerf0 = 1 << 11

// Contexts are the contexts other than perf counters, in the order the
// recorder writes them; their bits mirror KC_CTX_*.
var Contexts = []Context{
	{Name: "procname", Field: relayfmt.CharArrayField("procname", 16), Bit: 1 << 0},
	{Name: "pid", Field: relayfmt.ScalarField("pid", relayfmt.S32), Bit: 1 << 1},
	{Name: "tid", Field: relayfmt.ScalarField("tid", relayfmt.S32), Bit: 1 << 2},
	{Name: "ppid", Field: relayfmt.ScalarField("ppid", relayfmt.S32), Bit: 1 << 3},
	{Name: "prio", Field: relayfmt.ScalarField("prio", relayfmt.S32), Bit: 1 << 4},
	{Name: "nice", Field: relayfmt.ScalarField("nice", relayfmt.S32), Bit: 1 << 5},
	{Name: "vpid", Field: relayfmt.ScalarField("vpid", relayfmt.S32), Bit: 1 << 6},
	{Name: "vtid", Field: relayfmt.ScalarField("vtid", relayfmt.S32), Bit: 1 << 7},
	{Name: "vppid", Field: relayfmt.ScalarField("vppid", relayfmt.S32), Bit: 1 << 8},
	{Name: "cpu_id", Field: relayfmt.ScalarField("cpu_id", relayfmt.S32), Bit: 1 << 9},
	{Name: "cgroup", Field: relayfmt.ScalarField("cgroup", relayfmt.U64), Bit: 1 << 10},
}

// perf_event_attr types and the counters LTTng names
// (include/uapi/linux/perf_event.h).
const (
	perfHardware = 0
	perfSoftware = 1
	perfHWCache  = 3
)

// PerfContexts are the perf counters a context may read, by LTTng's
// names (perf:cpu:NAME): the hardware counters, their cache events and
// the software ones.
var PerfContexts = map[string]PerfCounter{
	"cpu-cycles": {perfHardware, 0}, "cycles": {perfHardware, 0},
	"instructions":        {perfHardware, 1},
	"cache-references":    {perfHardware, 2},
	"cache-misses":        {perfHardware, 3},
	"branch-instructions": {perfHardware, 4}, "branches": {perfHardware, 4},
	"branch-misses":           {perfHardware, 5},
	"bus-cycles":              {perfHardware, 6},
	"stalled-cycles-frontend": {perfHardware, 7}, "idle-cycles-frontend": {perfHardware, 7},
	"stalled-cycles-backend": {perfHardware, 8}, "idle-cycles-backend": {perfHardware, 8},
	// PERF_COUNT_HW_CACHE_*: cache | op << 8 | result << 16.
	"L1-dcache-loads": {perfHWCache, 0}, "L1-dcache-load-misses": {perfHWCache, 1 << 16},
	"L1-dcache-stores": {perfHWCache, 1 << 8}, "L1-dcache-store-misses": {perfHWCache, 1<<8 | 1<<16},
	"L1-icache-loads": {perfHWCache, 1}, "L1-icache-load-misses": {perfHWCache, 1 | 1<<16},
	"LLC-loads": {perfHWCache, 2}, "LLC-load-misses": {perfHWCache, 2 | 1<<16},
	"LLC-stores": {perfHWCache, 2 | 1<<8}, "LLC-store-misses": {perfHWCache, 2 | 1<<8 | 1<<16},
	"dTLB-loads": {perfHWCache, 3}, "dTLB-load-misses": {perfHWCache, 3 | 1<<16},
	"iTLB-loads": {perfHWCache, 4}, "iTLB-load-misses": {perfHWCache, 4 | 1<<16},
	"cpu-clock":  {perfSoftware, 0},
	"page-fault": {perfSoftware, 2}, "faults": {perfSoftware, 2},
	"context-switches": {perfSoftware, 3}, "cs": {perfSoftware, 3},
	"cpu-migrations": {perfSoftware, 4}, "migrations": {perfSoftware, 4},
	"minor-faults":     {perfSoftware, 5},
	"major-faults":     {perfSoftware, 6},
	"alignment-faults": {perfSoftware, 7},
	"emulation-faults": {perfSoftware, 8},
}

// ParseContexts returns the contexts names asks for, in the order the
// recorder writes them, each once; a perf counter gets the next slot.
// It fails for an unknown name, listing the known ones, or for more
// perf counters than the recorder reads.
func ParseContexts(names []string) ([]Context, error) {
	want := map[string]bool{}
	var perf []Context
	for _, n := range names {
		if want[n] {
			continue
		}
		want[n] = true
		if c, ok := strings.CutPrefix(n, "perf:cpu:"); ok {
			pc, known := PerfContexts[c]
			if !known {
				return nil, fmt.Errorf("unknown perf counter %q: want perf:cpu: and one of %s", n, strings.Join(slices.Sorted(maps.Keys(PerfContexts)), ", "))
			}
			field := "perf_cpu_" + strings.NewReplacer("-", "_", ":", "_").Replace(c)
			perf = append(perf, Context{Name: n, Field: relayfmt.ScalarField(field, relayfmt.U64), Perf: &pc})
			continue
		}
		if !slices.ContainsFunc(Contexts, func(c Context) bool { return c.Name == n }) {
			var known []string
			for _, c := range Contexts {
				known = append(known, c.Name)
			}
			return nil, fmt.Errorf("unknown context %q: want one of %s, or perf:cpu:COUNTER", n, strings.Join(known, ", "))
		}
	}
	if len(perf) > MaxPerf {
		return nil, fmt.Errorf("%d perf counters: the recorder reads at most %d", len(perf), MaxPerf)
	}
	var out []Context
	for _, c := range Contexts {
		if want[c.Name] {
			out = append(out, c)
		}
	}
	for k, c := range perf {
		c.Bit = ctxPerf0 << k
		out = append(out, c)
	}
	return out, nil
}

// ContextBits returns the recorder's bits of ctxs and the bytes they
// take.
func ContextBits(ctxs []Context) (bits uint16, size int) {
	for _, c := range ctxs {
		bits |= c.Bit
		size += c.Size()
	}
	return bits, size
}
