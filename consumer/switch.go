package consumer

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
)

// The BTF sched_switch path (kc_switch in bpf/kconsume.bpf.c) records
// sched:sched_switch from the tracepoint's arguments instead of through
// perf: no perf trace record is built for it, and perf's bpf_prog_active
// guard, which drops the event whenever another BPF program of the
// tracepoint or kprobe kind holds the CPU, does not apply.

// switchFields is the layout kc_switch builds: struct
// trace_event_raw_sched_switch (include/trace/events/sched.h), the same
// from Linux 4.x to 7.x.
var switchFields = []tracefs.Field{
	{Name: "prev_comm", Offset: 8, Size: 16, ArrayLen: 16, Signed: true},
	{Name: "prev_pid", Offset: 24, Size: 4, Signed: true},
	{Name: "prev_prio", Offset: 28, Size: 4, Signed: true},
	{Name: "prev_state", Offset: 32, Size: 8, Signed: true},
	{Name: "next_comm", Offset: 40, Size: 16, ArrayLen: 16, Signed: true},
	{Name: "next_pid", Offset: 56, Size: 4, Signed: true},
	{Name: "next_prio", Offset: 60, Size: 4, Signed: true},
}

// switchShape reports whether f is sched:sched_switch with the layout
// kc_switch builds.
func switchShape(f *tracefs.Format) bool {
	if f.System != "sched" || f.Name != "sched_switch" || len(f.Skipped) != 0 || f.FixedSize() != 64 || len(f.Fields) != len(switchFields) {
		return false
	}
	for i, w := range switchFields {
		g := f.Fields[i]
		// char arrays are signed or not by architecture: only the size counts.
		if g.Name != w.Name || g.Offset != w.Offset || g.Size != w.Size || g.ArrayLen != w.ArrayLen || g.Loc != tracefs.Inline ||
			(w.ArrayLen == 0 && g.Signed != w.Signed) {
			return false
		}
	}
	return true
}

// switchStateArg reports whether the kernel's sched_switch tracepoint
// passes prev_state as an argument (Linux 5.18+): its BTF prototype
// btf_trace_sched_switch has five parameters (the first is the probe's
// data) instead of four. It fails when the kernel has no BTF or the
// prototype is neither.
func switchStateArg() (bool, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false, fmt.Errorf("kernel BTF: %w", err)
	}
	var td *btf.Typedef
	if err := spec.TypeByName("btf_trace_sched_switch", &td); err != nil {
		return false, fmt.Errorf("kernel BTF: %w", err)
	}
	ptr, ok := td.Type.(*btf.Pointer)
	if !ok {
		return false, fmt.Errorf("btf_trace_sched_switch is a %T, not a function pointer", td.Type)
	}
	proto, ok := ptr.Target.(*btf.FuncProto)
	if !ok {
		return false, fmt.Errorf("btf_trace_sched_switch points to a %T, not a function", ptr.Target)
	}
	switch n := len(proto.Params); n {
	case 4:
		return false, nil
	case 5:
		return true, nil
	default:
		return false, fmt.Errorf("btf_trace_sched_switch has %d parameters, want 4 or 5", n)
	}
}

// setupSwitch prepares spec for kc_switch to record event key (-1: none)
// with trace event id, or removes kc_switch from spec when it cannot or
// need not run, saying why in r.switchErr when key was one.
func (r *recorder) setupSwitch(spec *ebpf.CollectionSpec, set map[string]any, key, id int) {
	if spec.Programs[gen.RingbufProgKcSwitch] == nil {
		return
	}
	if key < 0 || r.transport != Ringbuf {
		delete(spec.Programs, gen.RingbufProgKcSwitch)
		return
	}
	arg, err := switchStateArg()
	if err != nil {
		r.switchErr = err
		delete(spec.Programs, gen.RingbufProgKcSwitch)
		return
	}
	r.kcSwitch = key
	set[gen.RingbufVarKcSwitchKey] = uint32(key)
	set[gen.RingbufVarKcSwitchId] = uint32(id)
	set[gen.RingbufVarKcSwitchStateArg] = boolU32(arg)
}

// attachSwitch attaches kc_switch, loaded for event key, and returns
// true; or it returns false, saying why in r.switchErr, when kc_switch
// was not loaded or the kernel refuses it.
func (r *recorder) attachSwitch(key int) bool {
	p := r.coll.Programs[gen.RingbufProgKcSwitch]
	if p == nil || key != r.kcSwitch {
		return false
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: p})
	if err != nil {
		r.switchErr = fmt.Errorf("attaching %s for event key %d: %w", gen.RingbufProgKcSwitch, key, err)
		return false
	}
	r.links = append(r.links, l)
	return true
}

// SwitchPath returns whether sched:sched_switch is recorded from its BTF
// tracepoint (kc_switch) and, when it was to be but the kernel refused,
// why. The path is not tried when the event is not recorded, not in the
// layout kc_switch builds, with synthetic:wakeup_latency, or on the perf
// transport.
func (s *Session) SwitchPath() (btf bool, why error) {
	return slices.Contains(s.rec.tpProgs, gen.RingbufProgKcSwitch), s.rec.switchErr
}
