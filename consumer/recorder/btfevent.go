package recorder

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/gen"
)

// The BTF event path records sched:sched_switch, sched_waking,
// sched_wakeup, sched_wakeup_new and task:task_rename with tp_btf
// programs of their own (kc_btf_* in bpf/kc/sched_btf.bpf.h) that build the
// record from the tracepoint's arguments, instead of through perf: no
// perf trace record is built for them, and perf's bpf_prog_active
// guard, which drops an event whenever another BPF program of the
// tracepoint or kprobe kind holds the CPU
// (kernel/trace/bpf_trace.c:trace_call_bpf), does not apply; a tp_btf
// program guards only against itself.

// btfEvent is an event a tp_btf program of the recorder builds: the
// layouts it can build, as struct trace_event_raw_* lays them out, each
// ending at its last field.
type btfEvent struct {
	system, name  string
	prog          string
	keyVar, idVar string
	// layoutVar, when set, is the program's variable that gets the index
	// of the layout the running kernel has.
	layoutVar string
	layouts   [][]tracefs.Field
}

var (
	// struct trace_event_raw_sched_switch (include/trace/events/sched.h),
	// the same from Linux 4.x to 7.x.
	switchLayout = []tracefs.Field{
		{Name: "prev_comm", Offset: 8, Size: 16, ArrayLen: 16},
		{Name: "prev_pid", Offset: 24, Size: 4, Signed: true},
		{Name: "prev_prio", Offset: 28, Size: 4, Signed: true},
		{Name: "prev_state", Offset: 32, Size: 8, Signed: true},
		{Name: "next_comm", Offset: 40, Size: 16, ArrayLen: 16},
		{Name: "next_pid", Offset: 56, Size: 4, Signed: true},
		{Name: "next_prio", Offset: 60, Size: 4, Signed: true},
	}
	// struct trace_event_raw_sched_wakeup_template, and the same with
	// success (always 1) before target_cpu, as 5.10 has it
	// (kc_wake_success).
	wakeLayouts = [][]tracefs.Field{{
		{Name: "comm", Offset: 8, Size: 16, ArrayLen: 16},
		{Name: "pid", Offset: 24, Size: 4, Signed: true},
		{Name: "prio", Offset: 28, Size: 4, Signed: true},
		{Name: "target_cpu", Offset: 32, Size: 4, Signed: true},
	}, {
		{Name: "comm", Offset: 8, Size: 16, ArrayLen: 16},
		{Name: "pid", Offset: 24, Size: 4, Signed: true},
		{Name: "prio", Offset: 28, Size: 4, Signed: true},
		{Name: "success", Offset: 32, Size: 4, Signed: true},
		{Name: "target_cpu", Offset: 36, Size: 4, Signed: true},
	}}
	// struct trace_event_raw_task_rename (include/trace/events/task.h)
	// without pid, as Linux 6.14 to 6.17 have it, and with it, as before
	// and since (kc_rename_pid).
	renameLayouts = [][]tracefs.Field{{
		{Name: "oldcomm", Offset: 8, Size: 16, ArrayLen: 16},
		{Name: "newcomm", Offset: 24, Size: 16, ArrayLen: 16},
		{Name: "oom_score_adj", Offset: 40, Size: 2, Signed: true},
	}, {
		{Name: "pid", Offset: 8, Size: 4, Signed: true},
		{Name: "oldcomm", Offset: 12, Size: 16, ArrayLen: 16},
		{Name: "newcomm", Offset: 28, Size: 16, ArrayLen: 16},
		{Name: "oom_score_adj", Offset: 44, Size: 2, Signed: true},
	}}
)

var btfEvents = []btfEvent{
	{"sched", "sched_switch", gen.RingbufProgKcBtfSwitch, gen.RingbufVarKcSwitchKey, gen.RingbufVarKcSwitchId, "", [][]tracefs.Field{switchLayout}},
	{"sched", "sched_waking", gen.RingbufProgKcBtfWaking, gen.RingbufVarKcWakingKey, gen.RingbufVarKcWakingId, gen.RingbufVarKcWakeSuccess, wakeLayouts},
	{"sched", "sched_wakeup", gen.RingbufProgKcBtfWakeup, gen.RingbufVarKcWakeupKey, gen.RingbufVarKcWakeupId, gen.RingbufVarKcWakeSuccess, wakeLayouts},
	{"sched", "sched_wakeup_new", gen.RingbufProgKcBtfWakeupNew, gen.RingbufVarKcWakeupNewKey, gen.RingbufVarKcWakeupNewId, gen.RingbufVarKcWakeSuccess, wakeLayouts},
	{"task", "task_rename", gen.RingbufProgKcBtfRename, gen.RingbufVarKcRenameKey, gen.RingbufVarKcRenameId, gen.RingbufVarKcRenamePid, renameLayouts},
}

// btfUse is an event a BTF program records: its key, its trace event id
// and which of the program's layouts it has.
type btfUse struct {
	key, id, layout int
}

// btfShape returns the BTF program that builds f's record and which of
// its layouts f has, or nil when none does.
func btfShape(f *tracefs.Format) (*btfEvent, int) {
	if len(f.Skipped) != 0 {
		return nil, 0
	}
	for i := range btfEvents {
		e := &btfEvents[i]
		if e.system != f.System || e.name != f.Name {
			continue
		}
		if e.name == "task_rename" && (Preemptibility().On || Testing.RawFromPerf) && !Testing.RenameBTF {
			// __set_task_comm calls it with preemption on (it takes no
			// task_lock since 6.13): where tp_btf programs run
			// preemptibly (preempt.go), its perf tracepoint, which keeps
			// preemption off, loses none of it.
			return nil, 0
		}
		for j, l := range e.layouts {
			if sameFields(f, l) {
				return e, j
			}
		}
	}
	return nil, 0
}

// sameFields reports whether f has exactly the fields of l, in order, and
// nothing after the last one.
func sameFields(f *tracefs.Format, l []tracefs.Field) bool {
	last := l[len(l)-1]
	if len(f.Fields) != len(l) || f.FixedSize() != last.Offset+last.Size {
		return false
	}
	for i, w := range l {
		g := f.Fields[i]
		// Whether char is signed depends on the architecture and the
		// kernel's version of the format: only the size counts there.
		if g.Name != w.Name || g.Offset != w.Offset || g.Size != w.Size || g.ArrayLen != w.ArrayLen || g.Loc != tracefs.Inline ||
			(w.ArrayLen == 0 && g.Signed != w.Signed) {
			return false
		}
	}
	return true
}

// SwitchStateArg reports whether the kernel's sched_switch tracepoint
// passes prev_state as an argument (Linux 5.18+): its BTF prototype
// btf_trace_sched_switch has five parameters (the first is the probe's
// data) instead of four. It fails when the kernel has no BTF or the
// prototype is neither.
func SwitchStateArg() (bool, error) {
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

// btfPath is the BTF event path: programs that build an event's record
// from its tracepoint's arguments (tp_btf), keyed by the event they
// record.
type btfPath struct {
	keys map[int]string // event key → the BTF program loaded for it
	// base holds each one's program before a filter was compiled in,
	// uses its use, links its link once attached (a change of filter
	// replaces them, refilter.go).
	base  map[int]*ebpf.ProgramSpec
	uses  map[int]btfUse
	links map[int]link.Link
}

// setup keeps in spec the BTF programs of uses (by program name) and
// sets their variables in set; it removes the others (the perf object
// has none). When the kernel cannot run one, it is removed and r.plan[PathBTF]
// says why.
func (b *btfPath) setup(r *Recorder, spec *ebpf.CollectionSpec, set map[string]any, uses map[string]btfUse) {
	for _, e := range btfEvents {
		if spec.Programs[e.prog] == nil {
			continue
		}
		u, ok := uses[e.prog]
		if !ok {
			delete(spec.Programs, e.prog)
			continue
		}
		if e.prog == gen.RingbufProgKcBtfSwitch {
			arg, err := SwitchStateArg()
			if err != nil {
				r.plan[PathBTF].why = err
				delete(spec.Programs, e.prog)
				continue
			}
			set[gen.RingbufVarKcSwitchStateArg] = boolU32(arg)
		}
		if e.layoutVar != "" {
			set[e.layoutVar] = uint32(u.layout)
		}
		if b.base == nil {
			b.base, b.uses = map[int]*ebpf.ProgramSpec{}, map[int]btfUse{}
		}
		b.base[u.key], b.uses[u.key] = spec.Programs[e.prog].Copy(), u
		if flt := r.tp.filter(u.key); flt != nil {
			ps, err := btfFilterProg(spec.Programs[e.prog], e.prog, u, flt, r.tp.formats[u.key])
			if err != nil {
				r.plan[PathBTF].why = err
				delete(spec.Programs, e.prog)
				continue
			}
			spec.Programs[e.prog] = ps
		}
		set[e.keyVar] = uint32(u.key)
		set[e.idVar] = uint32(u.id)
		b.keys[u.key] = e.prog
	}
}

// btfFilterProg returns a copy of base, the BTF program of e, with the
// field filter flt of its event (of format f, use u) compiled in, on the
// record the program builds on the stack (kc_btf_shift in
// bpf/kc/sched_btf.bpf.h).
func btfFilterProg(base *ebpf.ProgramSpec, prog string, u btfUse, flt *filter.Filter, f *tracefs.Format) (*ebpf.ProgramSpec, error) {
	shift := 0
	if prog == gen.RingbufProgKcBtfRename && u.layout == 1 {
		shift = 4
	}
	rec := recAt{prefix: "kcf_", off: func(o int) int { return o + shift }}
	return filterProgAt(base, base.Name, flt, f, rec)
}

// drop removes every BTF program from spec.
func (b *btfPath) drop(spec *ebpf.CollectionSpec) {
	for _, e := range btfEvents {
		delete(spec.Programs, e.prog)
	}
	clear(b.keys)
}

// attach attaches the BTF program loaded for event key and returns
// its name; or it returns "", saying why in r.plan[PathBTF], when none was
// loaded for key or the kernel refuses it.
func (b *btfPath) attach(r *Recorder, key int) string {
	name := b.keys[key]
	p := r.coll.Programs[name]
	if p == nil {
		return ""
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: p})
	if err != nil {
		r.plan[PathBTF].why = fmt.Errorf("attaching %s: %w", name, err)
		return ""
	}
	r.links = append(r.links, l)
	if b.links == nil {
		b.links = map[int]link.Link{}
	}
	b.links[key] = l
	return name
}

// IsBTFProg reports whether name is one of the BTF event programs.
func IsBTFProg(name string) bool {
	for _, e := range btfEvents {
		if e.prog == name {
			return true
		}
	}
	return false
}
