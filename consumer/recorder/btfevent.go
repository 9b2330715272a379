package recorder

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/kconsume/kconsume/consumer/recorder/hot"
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
	// hot is the table entry of a generated program (package hot),
	// whose layouts also name the tracepoint's arguments; nil for the
	// hand-written ones.
	hot *hot.Event
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

// btfEvents are the hand-written BTF programs and those generated from
// the hot events table.
var btfEvents = append([]btfEvent{
	{"sched", "sched_switch", gen.RingbufProgKcBtfSwitch, gen.RingbufVarKcSwitchKey, gen.RingbufVarKcSwitchId, "", [][]tracefs.Field{switchLayout}, nil},
	{"sched", "sched_waking", gen.RingbufProgKcBtfWaking, gen.RingbufVarKcWakingKey, gen.RingbufVarKcWakingId, gen.RingbufVarKcWakeSuccess, wakeLayouts, nil},
	{"sched", "sched_wakeup", gen.RingbufProgKcBtfWakeup, gen.RingbufVarKcWakeupKey, gen.RingbufVarKcWakeupId, gen.RingbufVarKcWakeSuccess, wakeLayouts, nil},
	{"sched", "sched_wakeup_new", gen.RingbufProgKcBtfWakeupNew, gen.RingbufVarKcWakeupNewKey, gen.RingbufVarKcWakeupNewId, gen.RingbufVarKcWakeSuccess, wakeLayouts, nil},
	{"task", "task_rename", gen.RingbufProgKcBtfRename, gen.RingbufVarKcRenameKey, gen.RingbufVarKcRenameId, gen.RingbufVarKcRenamePid, renameLayouts, nil},
}, hotEvents()...)

// hotEvents returns the BTF programs of the hot events table, with each
// layout's fields as the event's format gives them.
func hotEvents() []btfEvent {
	var out []btfEvent
	for i := range hot.Events {
		e := &hot.Events[i]
		b := btfEvent{system: e.System, name: e.Name, prog: e.Prog(), keyVar: e.Var("key"), idVar: e.Var("id"), layoutVar: e.Var("layout"), hot: e}
		for _, l := range e.Layouts {
			shapes, err := l.Shapes()
			if err != nil {
				panic(fmt.Sprintf("hot events table, %s: %v", e.Name, err)) // hot's tests and hotgen check it
			}
			var fields []tracefs.Field
			for j, sh := range shapes {
				f := tracefs.Field{Name: l.Fields[j].Name, Offset: sh.Offset, Size: sh.Size, Signed: sh.Signed, ArrayLen: sh.ArrayLen}
				if sh.Str {
					f.Loc = tracefs.DataLoc
				}
				fields = append(fields, f)
			}
			b.layouts = append(b.layouts, fields)
		}
		out = append(out, b)
	}
	return out
}

// strings reports whether layout l of e's program has strings: such a
// record takes no field filter (KC_HOT_RECORD_STRINGS).
func (e *btfEvent) strings(l int) bool {
	return e.hot != nil && e.hot.Layouts[l].Strings() > 0
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
		if e.hot != nil && e.hot.Preemptible && (Preemptibility().On || Testing.RawFromPerf) {
			// As task_rename: a program preempted where the kernel
			// calls the tracepoint preemptibly would make the next on
			// its CPU skip its event.
			return nil, 0
		}
		for j, l := range e.layouts {
			if sameFields(f, l) && (e.hot == nil || hotArgs(e.name, e.hot.Layouts[j])) {
				return e, j
			}
		}
	}
	return nil, 0
}

// BTFMismatch returns why the BTF path has no program for an event of
// format f that it has one for on other kernels: a layout of the record,
// or arguments of the tracepoint, that its table does not know. It
// returns "" where the path builds f, and for an event the path never
// builds.
func BTFMismatch(f *tracefs.Format) string {
	for i := range btfEvents {
		e := &btfEvents[i]
		if e.system != f.System || e.name != f.Name {
			continue
		}
		if len(f.Skipped) != 0 {
			return "its format has fields the recorder does not decode"
		}
		fields := false
		for j, l := range e.layouts {
			if !sameFields(f, l) {
				continue
			}
			fields = true
			if e.hot == nil || hotArgs(e.name, e.hot.Layouts[j]) {
				return ""
			}
		}
		if fields {
			return fmt.Sprintf("the tracepoint's arguments (btf_trace_%s) are not those of its record's layout in the table (consumer/recorder/hot)", e.name)
		}
		return "this kernel's layout of its record is not in the table (consumer/recorder/hot)"
	}
	return ""
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
		if g.Name != w.Name || g.Offset != w.Offset || g.Size != w.Size || g.ArrayLen != w.ArrayLen || g.Loc != w.Loc ||
			(w.Loc == tracefs.DataLoc && !g.IsChar()) || (w.ArrayLen == 0 && g.Signed != w.Signed) {
			return false
		}
	}
	return true
}

// hotArgs reports whether the kernel's tracepoint name passes the
// arguments that layout l reads: as many (its BTF prototype
// btf_trace_NAME has one more, the probe's data), each of the size l
// declares. A kernel without BTF passes none.
func hotArgs(name string, l hot.Layout) bool {
	proto, err := tracepointProto(name)
	if err != nil || len(proto.Params) != len(l.Args)+1 {
		return false
	}
	for i, a := range l.Args {
		want, err := hot.ArgSize(a)
		if err != nil {
			return false
		}
		typ := proto.Params[i+1].Type
		if got, err := btf.Sizeof(typ); err != nil || got != want {
			return false
		}
		// A pointer to a struct is one to the struct of that name.
		ptr, isPtr := btf.UnderlyingType(typ).(*btf.Pointer)
		decl := strings.Fields(strings.TrimPrefix(a, "const "))
		if len(decl) >= 2 && decl[0] == "struct" && strings.Contains(a, "*") {
			st, ok := btf.UnderlyingType(ptr.Target).(*btf.Struct)
			if !isPtr || !ok || st.Name != decl[1] {
				return false
			}
		} else if isPtr != strings.Contains(a, "*") && !strings.HasSuffix(decl[0], "_func_t") {
			return false
		}
	}
	return true
}

// tracepointProto returns the prototype of tracepoint name's probes
// (the kernel's BTF typedef btf_trace_NAME), or an error when the kernel
// has no BTF or no such tracepoint.
func tracepointProto(name string) (*btf.FuncProto, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("kernel BTF: %w", err)
	}
	var td *btf.Typedef
	if err := spec.TypeByName("btf_trace_"+name, &td); err != nil {
		return nil, fmt.Errorf("kernel BTF: %w", err)
	}
	ptr, ok := td.Type.(*btf.Pointer)
	if !ok {
		return nil, fmt.Errorf("btf_trace_%s is a %T, not a function pointer", name, td.Type)
	}
	proto, ok := ptr.Target.(*btf.FuncProto)
	if !ok {
		return nil, fmt.Errorf("btf_trace_%s points to a %T, not a function", name, ptr.Target)
	}
	return proto, nil
}

// SwitchStateArg reports whether the kernel's sched_switch tracepoint
// passes prev_state as an argument (Linux 5.18+): its BTF prototype
// btf_trace_sched_switch has five parameters (the first is the probe's
// data) instead of four. It fails when the kernel has no BTF or the
// prototype is neither.
func SwitchStateArg() (bool, error) {
	proto, err := tracepointProto("sched_switch")
	if err != nil {
		return false, err
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
	// raw holds the generated programs loaded again with their pointer
	// arguments read through a helper (dropRefused).
	raw map[string]bool
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

// dropRefused removes from spec the BTF program that the kernel refused
// in err, a load's error, so that its event alone takes the classic
// path, and says why in r.plan[PathBTF]. It reports whether err named
// such a program: cilium/ebpf names the program that failed ("program
// NAME: ...").
func (b *btfPath) dropRefused(r *Recorder, spec *ebpf.CollectionSpec, err error) bool {
	name, _, ok := strings.Cut(strings.TrimPrefix(err.Error(), "program "), ":")
	if !ok || !strings.HasPrefix(err.Error(), "program ") || !IsBTFProg(name) || spec.Programs[name] == nil {
		return false
	}
	if raw := name + "_raw"; strings.HasPrefix(name, "kc_hot_") && !b.raw[name] && spec.Variables[raw] != nil {
		// Older verifiers load no pointer argument to other than a
		// struct from ctx: the program reads those through a helper.
		if spec.Variables[raw].Set(uint32(1)) == nil {
			if b.raw == nil {
				b.raw = map[string]bool{}
			}
			b.raw[name] = true
			return true
		}
	}
	delete(spec.Programs, name)
	for key, p := range b.keys {
		if p == name {
			delete(b.keys, key)
			delete(b.base, key)
			delete(b.uses, key)
		}
	}
	r.plan[PathBTF].why = fmt.Errorf("loading: %w", err)
	r.plan[PathBTF].on = len(b.keys) > 0
	return true
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
