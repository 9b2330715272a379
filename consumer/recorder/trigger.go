package recorder

import (
	"fmt"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/gen"
)

// Triggers (bpf/kc/trigger.h) are decided in the program copy of their
// event: the condition, a field filter compiled as filtercode.go
// compiles one, goes in place of kc_trig_filter's body, and the copy's
// KC_TRIG_PLACEHOLDER becomes the trigger's slot in kc_trig_map plus
// one. An event with a trigger is recorded through its tracepoint's
// general program, kc_tracepoint, never the function or BTF paths; a
// syscall event the raw path can build stays on it, whose programs
// evaluate the conditions of their events' triggers in
// kc_sys_trig_filter, dispatched on the event key as their field
// filters are (bpf/kc/syscall.h): on kernels whose tracepoint programs
// run preemptibly, the raw path's perf tracepoints are where the kernel
// skips no run of the program, and a trigger's event is never missed.

// TriggerAction is what a trigger does when its condition holds.
type TriggerAction uint32

// The actions, mirroring KC_TRIG_* of bpf/kc/trigger.h (TestMirrorsC).
const (
	TriggerSnapshot TriggerAction = 1 // write the flight recorder's retained sub-buffers
	TriggerStop     TriggerAction = 2 // close the gate
	TriggerStart    TriggerAction = 3 // open the gate
	TriggerRotate   TriggerAction = 4 // close the trace's chunk and begin the next
)

// String returns the action's name as record --trigger takes it.
func (a TriggerAction) String() string {
	switch a {
	case TriggerSnapshot:
		return "snapshot"
	case TriggerStop:
		return "stop"
	case TriggerStart:
		return "start"
	case TriggerRotate:
		return "rotate"
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// trigPlaceholder mirrors KC_TRIG_PLACEHOLDER; trigFilterFunc is the
// function the loader replaces.
const (
	trigPlaceholder = 0x6b63545247
	trigFilterFunc  = "kc_trig_filter"
)

// TriggerDef is one trigger's action and rate limit, by its slot.
type TriggerDef struct {
	Action   TriggerAction
	Interval time.Duration // least time between two actions, more than 0
}

// Triggers are the session's triggers: their definitions by slot, and
// for each event key the slot of its trigger (-1: none) and its
// condition (nil: always true).
type Triggers struct {
	Defs []TriggerDef
	Slot []int
	Cond []*filter.Filter
}

// of returns event key i's trigger slot, or -1.
func (t *Triggers) of(i int) int {
	if t == nil || i >= len(t.Slot) {
		return -1
	}
	return t.Slot[i]
}

// WithTriggers has the events with a trigger in ts recorded by
// programs that evaluate the trigger before the event takes ring space:
// the raw syscall path's, or their tracepoints' general program. It
// takes them off the function, BTF and size-specialised paths.
func (o *Options) WithTriggers(ts *Triggers) *Options {
	if ts == nil || len(ts.Defs) == 0 {
		return o
	}
	o.trigs = ts
	for i := range o.sysEvents {
		o.sysEvents[i].trig = ts.of(o.sysEvents[i].key) >= 0
	}
	for i := range o.small {
		if ts.of(i) >= 0 {
			o.small[i] = 0
		}
	}
	for prog, u := range o.btf {
		if ts.of(u.key) >= 0 {
			delete(o.btf, prog)
		}
	}
	return o
}

// trig reports whether event key i has a trigger.
func (r *Recorder) trig(i int) bool { return r.trigs.of(i) >= 0 }

// trigProg returns ps with event key i's trigger compiled in, or ps
// itself when the event has none.
func (t *tracepoints) trigProg(ps *ebpf.ProgramSpec, ts *Triggers, i int, f *tracefs.Format) (*ebpf.ProgramSpec, error) {
	slot := ts.of(i)
	if slot < 0 {
		return ps, nil
	}
	cond := ts.Cond[i]
	if cond == nil || len(cond.Prog) == 0 {
		cond = &filter.Filter{Expr: "1"} // no predicate: always true
	}
	code, err := compileCond(cond, f)
	if err != nil {
		return nil, err
	}
	out, err := patchImm(ps, ps.Name, trigPlaceholder, uint32(slot+1))
	if err != nil {
		return nil, err
	}
	if !replaceFunc(out, trigFilterFunc, code) {
		return nil, fmt.Errorf("recorder program %s has no %s", ps.Name, trigFilterFunc)
	}
	return out, nil
}

// sysTrigFunc is the raw syscall programs' function the loader
// replaces with their events' trigger conditions.
const sysTrigFunc = "kc_sys_trig_filter"

// sysTriggers puts in every program of spec that calls
// kc_sys_trig_filter the conditions of the triggers of the syscall
// events evs (of formats) that have one, dispatched on the event key,
// and returns whether one of them is a start trigger.
func sysTriggers(spec *ebpf.CollectionSpec, ts *Triggers, evs []sysEvent, formats []*tracefs.Format) (start bool, err error) {
	conds, ff := map[int]*filter.Filter{}, map[int]*tracefs.Format{}
	for _, e := range evs {
		slot := ts.of(e.key)
		if slot < 0 {
			continue
		}
		start = start || ts.Defs[slot].Action == TriggerStart
		if c := ts.Cond[e.key]; c != nil && len(c.Prog) > 0 {
			conds[e.key], ff[e.key] = c, formats[e.key]
		}
	}
	if len(conds) == 0 {
		return start, nil // every condition always holds, as built
	}
	code, err := dispatch(conds, ff, func(k int) recAt { return sysRecAs("kct", k) }, asm.Mov.Imm(asm.R2, sysRecLen))
	if err != nil {
		return false, fmt.Errorf("trigger: %w", err)
	}
	for _, ps := range spec.Programs {
		replaceFunc(ps, sysTrigFunc, code)
	}
	return start, nil
}

// trigRec is the ring record in the scratch record, as kc_trig_filter
// gets it; its labels differ from kc_field_filter's, in the same program.
var trigRec = recAt{prefix: "kct_", off: ringRec.off, cut: ringRec.cut}

// compileCond returns kc_trig_filter's body for cond on events of
// format f: the filter's code, or for a condition without predicates
// one that always holds.
func compileCond(cond *filter.Filter, f *tracefs.Format) (asm.Instructions, error) {
	if len(cond.Prog) == 0 {
		return asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}, nil
	}
	return compileFilter(cond, f, trigRec)
}

// CheckTrigger returns nil when the recorder can evaluate cond as a
// trigger's condition on events of format f, else why not.
func CheckTrigger(cond *filter.Filter, f *tracefs.Format) error {
	_, err := compileCond(cond, f)
	return err
}

// setTriggers fills kc_trig_map with the triggers' definitions.
func (r *Recorder) setTriggers() error {
	if r.trigs == nil {
		return nil
	}
	m := r.coll.Maps[gen.RingbufMapKcTrigMap]
	for slot, d := range r.trigs.Defs {
		v := gen.RingbufKcTrig{Interval: uint64(d.Interval), Action: uint32(d.Action)}
		if err := m.Put(uint32(slot), v); err != nil {
			return fmt.Errorf("trigger %d: %w", slot+1, err)
		}
	}
	return nil
}

// LiveTriggers lets the triggers act (on) or not: from the session's
// first start to its close.
func (r *Recorder) LiveTriggers(on bool) error {
	if r.trigs == nil || r.coll == nil {
		return nil
	}
	v := r.coll.Variables[gen.RingbufVarKcTrigLive]
	if v == nil {
		return nil
	}
	return v.Set(boolU32(on))
}

// TriggerRing returns the ring through which snapshot triggers wake the
// consumer, or nil when the session has no trigger.
func (r *Recorder) TriggerRing() *ebpf.Map {
	if r.trigs == nil || r.coll == nil {
		return nil
	}
	return r.coll.Maps[gen.RingbufMapKcTrigRing]
}

// TriggerCount is what a trigger did so far: the recorded events on
// which its condition held, and the actions it took.
type TriggerCount struct {
	Matched, Fired uint64
}

// TriggerCounts returns each trigger's counts, by slot.
func (r *Recorder) TriggerCounts() ([]TriggerCount, error) {
	if r.trigs == nil || r.coll == nil {
		return nil, nil
	}
	m := r.coll.Maps[gen.RingbufMapKcTrigMap]
	out := make([]TriggerCount, len(r.trigs.Defs))
	for slot := range out {
		var v gen.RingbufKcTrig
		if err := m.Lookup(uint32(slot), &v); err != nil {
			return nil, fmt.Errorf("trigger %d: %w", slot+1, err)
		}
		out[slot] = TriggerCount{Matched: v.Matched, Fired: v.Fired}
	}
	return out, nil
}

// Running reports whether the gate is open: the consumer's last Start
// or Stop, or a trigger's since.
func (r *Recorder) Running() bool {
	if r.running == nil {
		return false
	}
	var on uint32
	if err := r.running.Get(&on); err != nil {
		return false
	}
	return on != 0
}
