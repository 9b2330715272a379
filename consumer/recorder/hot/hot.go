// Package hot is the table of the events that fire most on busy
// machines and that the recorder builds from their tracepoints'
// arguments (tp_btf programs) instead of copying the record the kernel
// builds for perf: for each event, the layouts of its trace record the
// kernel has had, and for each field the C expression of the tracepoint's
// arguments that TP_fast_assign stores there (include/trace/events/).
//
// The table is the one source of both sides: hotgen writes the BPF
// programs from it (bpf/kc/hot_btf.bpf.h, `make generate`), and the
// recorder matches a running kernel's event format and tracepoint
// prototype against its layouts (Layout.Fields, Layout.Args). An event
// whose format or prototype no layout has keeps the classic tracepoint
// path.
package hot

import (
	"fmt"
	"strings"
)

// Event is one tracepoint of the table.
type Event struct {
	System, Name string
	// Preemptible marks a tracepoint that the kernel calls with
	// preemption on (kfree, a work item's start): where tp_btf programs
	// run preemptibly, a program preempted there would make the next on
	// its CPU skip its event, and the classic path, which keeps
	// preemption off, records it instead.
	Preemptible bool
	Layouts     []Layout
}

// Layout is one shape of an event's record and of its tracepoint's
// arguments, as some range of kernels have it.
type Layout struct {
	// Args are the tracepoint's parameters as C declarations, in order
	// (TP_PROTO), after the probe's data pointer.
	Args []string
	// Fields are the record's fields after the common ones, in order.
	Fields []Field
	// Kernels says which kernels have this shape, for the reader.
	Kernels string
}

// Field is one field of a record: its name, its C type as the format
// file prints it (a char array as "char[16]"), and the C expression of
// the arguments that gives its value (for a char array, the address of
// its bytes).
type Field struct {
	Name, Type, Expr string
}

// Shape is a field's place in the record as the kernel's struct
// trace_event_raw_* lays it out.
type Shape struct {
	Offset, Size int
	Signed       bool
	ArrayLen     int  // a char array's length, else 0 (-1 for a string)
	Str          bool // a __data_loc char[] of StrMax bytes at most
}

// StrMax is the bytes of a string field's data at most, its NUL
// included: a task's comm (TASK_COMM_LEN), a network device's name
// (IFNAMSIZ).
const StrMax = 16

// typeShapes gives each scalar type of the table its size and sign.
var typeShapes = map[string]Shape{
	"int": {Size: 4, Signed: true}, "pid_t": {Size: 4, Signed: true}, "s32": {Size: 4, Signed: true},
	"clockid_t":    {Size: 4, Signed: true},
	"unsigned int": {Size: 4}, "u32": {Size: 4}, "enum": {Size: 4}, "gfp_t": {Size: 4},
	"s64": {Size: 8, Signed: true}, "long": {Size: 8, Signed: true}, "ktime_t": {Size: 8, Signed: true},
	"u64": {Size: 8}, "unsigned long": {Size: 8}, "size_t": {Size: 8}, "void *": {Size: 8},
	"short": {Size: 2, Signed: true}, "u16": {Size: 2},
	"bool": {Size: 1}, "u8": {Size: 1},
}

// TypeShape returns the size, sign and array length of a field's type,
// or an error for a type the table does not know. Type "str16" is a
// __data_loc char[] of StrMax bytes at most (__string(comm, p->comm),
// __string(name, dev->name)): its expression is the string's address,
// its data the string and its NUL after the record's fixed fields.
func TypeShape(typ string) (Shape, error) {
	if typ == "str16" {
		return Shape{Size: 4, ArrayLen: -1, Str: true}, nil
	}
	if rest, ok := strings.CutPrefix(typ, "char["); ok {
		var n int
		if _, err := fmt.Sscanf(rest, "%d]", &n); err != nil || n <= 0 || fmt.Sprintf("char[%d]", n) != typ {
			return Shape{}, fmt.Errorf("field type %q: want char[N]", typ)
		}
		return Shape{Size: n, ArrayLen: n}, nil
	}
	s, ok := typeShapes[typ]
	if !ok {
		return Shape{}, fmt.Errorf("field type %q is not one the table knows", typ)
	}
	return s, nil
}

// ArgSize returns the bytes of a tracepoint parameter, declared in C as
// Layout.Args has it: a pointer's or a function pointer type's (a
// *_func_t) 8, an enum's 4, a scalar type of the table its size. It
// fails on another type.
func ArgSize(decl string) (int, error) {
	fields := strings.Fields(decl)
	if len(fields) < 2 {
		return 0, fmt.Errorf("parameter %q: want a type and a name", decl)
	}
	typ := strings.Join(fields[:len(fields)-1], " ")
	switch {
	case strings.Contains(decl, "*"), strings.HasSuffix(typ, "_func_t"):
		return 8, nil
	case strings.HasPrefix(typ, "enum "):
		return 4, nil
	}
	s, ok := typeShapes[typ]
	if !ok {
		return 0, fmt.Errorf("parameter %q: a type the table does not know", decl)
	}
	return s.Size, nil
}

// Shapes returns the place of each of l's fields: from byte 8, after
// the common fields, each at the next multiple of its alignment (its
// size, a char array's 1), as the C compiler lays out the kernel's
// struct. It fails on a type the table does not know.
func (l Layout) Shapes() ([]Shape, error) {
	off := 8
	out := make([]Shape, 0, len(l.Fields))
	for _, f := range l.Fields {
		s, err := TypeShape(f.Type)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		align := s.Size
		if s.ArrayLen > 0 {
			align = 1
		}
		off = (off + align - 1) / align * align
		s.Offset = off
		off += s.Size
		out = append(out, s)
	}
	return out, nil
}

// Strings returns how many string fields l has.
func (l Layout) Strings() int {
	n := 0
	for _, f := range l.Fields {
		if f.Type == "str16" {
			n++
		}
	}
	return n
}

// Size returns the bytes of l's record up to the end of its last field,
// its fixed part: strings' data come after.
func (l Layout) Size() int {
	s, err := l.Shapes()
	if err != nil || len(s) == 0 {
		return 8
	}
	last := s[len(s)-1]
	return last.Offset + last.Size
}

// Prog returns the name of the BPF program that records e.
func (e *Event) Prog() string { return "kc_hot_" + e.Name }

// Var returns the name of e's program's read-only variable what: key
// (its event key), id (its trace event id), layout (the index of the
// layout the running kernel has) or raw (set where the kernel's verifier
// refuses a load of a pointer argument to other than a struct).
func (e *Event) Var(what string) string { return "kc_hot_" + e.Name + "_" + what }

// comm is a task's comm as the sched events copied it until 6.17 (memcpy
// of TASK_COMM_LEN bytes); dcomm as they copy it since, a __string.
func comm(name, task string) Field  { return Field{name, "char[16]", task + "->comm"} }
func dcomm(name, task string) Field { return Field{name, "str16", task + "->comm"} }

// Events is the table: the events that fire most on busy machines,
// whose records hold no dynamic field in some range of the kernels
// kconsume supports. sched_switch, the wakeups and task_rename have
// hand-written programs (bpf/kc/sched_btf.bpf.h).
var Events = []Event{
	// include/trace/events/irq.h
	{System: "irq", Name: "irq_handler_exit", Layouts: []Layout{{
		Args:   []string{"int irq", "struct irqaction *action", "int ret"},
		Fields: []Field{{"irq", "int", "irq"}, {"ret", "int", "ret"}},
	}}},
	{System: "irq", Name: "softirq_entry", Layouts: softirq},
	{System: "irq", Name: "softirq_exit", Layouts: softirq},
	{System: "irq", Name: "softirq_raise", Layouts: softirq},

	// include/trace/events/timer.h
	{System: "timer", Name: "timer_init", Preemptible: true, Layouts: timerOnly},
	{System: "timer", Name: "timer_cancel", Layouts: timerOnly},
	{System: "timer", Name: "timer_expire_exit", Layouts: timerOnly},
	{System: "timer", Name: "hrtimer_cancel", Layouts: hrtimerOnly},
	{System: "timer", Name: "hrtimer_expire_exit", Layouts: hrtimerOnly},
	{System: "timer", Name: "hrtimer_expire_entry", Layouts: []Layout{{
		Kernels: "to 6.18",
		Args:    []string{"struct hrtimer *hrtimer", "ktime_t *now"},
		Fields: []Field{{"hrtimer", "void *", "hrtimer"}, {"now", "s64", "kc_read_s64(now)"},
			{"function", "void *", "hrtimer->function"}},
	}, {
		Kernels: "7.x (now passed by value)",
		Args:    []string{"struct hrtimer *hrtimer", "ktime_t now"},
		Fields:  []Field{{"hrtimer", "void *", "hrtimer"}, {"now", "s64", "now"}, {"function", "void *", "hrtimer->function"}},
	}}},
	{System: "timer", Name: "hrtimer_start", Layouts: []Layout{{
		Kernels: "5.10",
		Args:    []string{"struct hrtimer *hrtimer", "enum hrtimer_mode mode"},
		Fields:  hrtimerStart,
	}, {
		Kernels: "6.1 on",
		Args:    []string{"struct hrtimer *hrtimer", "enum hrtimer_mode mode", "bool was_armed"},
		Fields:  append(hrtimerStart[:len(hrtimerStart):len(hrtimerStart)], Field{"was_armed", "bool", "was_armed"}),
	}}},

	// include/trace/events/workqueue.h
	{System: "workqueue", Name: "workqueue_execute_start", Preemptible: true, Layouts: []Layout{{
		Args:   []string{"struct work_struct *work"},
		Fields: []Field{{"work", "void *", "work"}, {"function", "void *", "work->func"}},
	}}},
	{System: "workqueue", Name: "workqueue_execute_end", Preemptible: true, Layouts: []Layout{{
		Args:   []string{"struct work_struct *work", "work_func_t function"},
		Fields: []Field{{"work", "void *", "work"}, {"function", "void *", "function"}},
	}}},
	{System: "workqueue", Name: "workqueue_activate_work", Layouts: []Layout{{
		Kernels: "to 6.1",
		Args:    []string{"struct work_struct *work"},
		Fields:  []Field{{"work", "void *", "work"}},
	}, {
		Kernels: "6.12 on",
		Args:    []string{"struct work_struct *work"},
		Fields:  []Field{{"work", "void *", "work"}, {"function", "void *", "work->func"}},
	}}},

	// include/trace/events/net.h
	{System: "net", Name: "net_dev_queue", Layouts: netDev},
	{System: "net", Name: "netif_receive_skb", Layouts: netDev},
	{System: "net", Name: "netif_rx", Layouts: netDev},
	{System: "net", Name: "net_dev_xmit", Layouts: []Layout{{
		Args: []string{"struct sk_buff *skb", "int rc", "struct net_device *dev", "unsigned int skb_len"},
		Fields: []Field{{"skbaddr", "void *", "skb"}, {"len", "unsigned int", "skb_len"}, {"rc", "int", "rc"},
			{"name", "str16", "dev->name"}},
	}}},

	// include/trace/events/kmem.h
	{System: "kmem", Name: "kfree", Preemptible: true, Layouts: []Layout{{
		Args:   []string{"unsigned long call_site", "const void *ptr"},
		Fields: []Field{{"call_site", "unsigned long", "call_site"}, {"ptr", "void *", "ptr"}},
	}}},

	{System: "kmem", Name: "kmalloc", Preemptible: true, Layouts: []Layout{{
		Kernels: "5.10",
		Args: []string{"unsigned long call_site", "const void *ptr", "size_t bytes_req", "size_t bytes_alloc",
			"gfp_t gfp_flags"},
		Fields: append(kmallocSizes[:4:4], Field{"gfp_flags", "gfp_t", "gfp_flags"}),
	}, {
		Kernels: "6.1 on",
		Args: []string{"unsigned long call_site", "const void *ptr", "size_t bytes_req", "size_t bytes_alloc",
			"gfp_t gfp_flags", "int node"},
		Fields: append(kmallocSizes[:4:4], Field{"gfp_flags", "unsigned long", "gfp_flags"}, Field{"node", "int", "node"}),
	}}},

	// include/trace/events/sched.h
	{System: "sched", Name: "sched_wake_idle_without_ipi", Layouts: []Layout{{
		Args:   []string{"int cpu"},
		Fields: []Field{{"cpu", "int", "cpu"}},
	}}},
	{System: "sched", Name: "sched_migrate_task", Layouts: []Layout{{
		Kernels: "5.10 to 7.3",
		Args:    []string{"struct task_struct *p", "int dest_cpu"},
		Fields: []Field{comm("comm", "p"), {"pid", "pid_t", "p->pid"}, {"prio", "int", "p->prio"},
			{"orig_cpu", "int", "kc_task_cpu(p)"}, {"dest_cpu", "int", "dest_cpu"}},
	}, {
		Kernels: "with a __string comm (the development VM's 6.18)",
		Args:    []string{"struct task_struct *p", "int dest_cpu"},
		Fields: []Field{dcomm("comm", "p"), {"pid", "pid_t", "p->pid"}, {"prio", "int", "p->prio"},
			{"orig_cpu", "int", "kc_task_cpu(p)"}, {"dest_cpu", "int", "dest_cpu"}},
	}}},
	{System: "sched", Name: "sched_process_free", Layouts: []Layout{{
		Kernels: "5.10 to 7.3",
		Args:    []string{"struct task_struct *p"},
		Fields:  []Field{comm("comm", "p"), {"pid", "pid_t", "p->pid"}, {"prio", "int", "p->prio"}},
	}, {
		Kernels: "with a __string comm (the development VM's 6.18)",
		Args:    []string{"struct task_struct *p"},
		Fields:  []Field{dcomm("comm", "p"), {"pid", "pid_t", "p->pid"}, {"prio", "int", "p->prio"}},
	}}},
	{System: "sched", Name: "sched_process_exit", Preemptible: true, Layouts: []Layout{{
		Kernels: "5.10 to 7.3",
		Args:    []string{"struct task_struct *p"},
		Fields:  []Field{comm("comm", "p"), {"pid", "pid_t", "p->pid"}, {"prio", "int", "p->prio"}},
	}, {
		Kernels: "some 6.18 builds (the development VM's)",
		Args:    []string{"struct task_struct *p", "bool group_dead"},
		Fields: []Field{comm("comm", "p"), {"pid", "pid_t", "p->pid"}, {"prio", "int", "p->prio"},
			{"group_dead", "bool", "group_dead"}},
	}}},
	{System: "sched", Name: "sched_process_fork", Preemptible: true, Layouts: []Layout{{
		Kernels: "5.10 to 7.3",
		Args:    []string{"struct task_struct *parent", "struct task_struct *child"},
		Fields: []Field{comm("parent_comm", "parent"), {"parent_pid", "pid_t", "parent->pid"},
			comm("child_comm", "child"), {"child_pid", "pid_t", "child->pid"}},
	}, {
		Kernels: "with a __string comm (the development VM's 6.18)",
		Args:    []string{"struct task_struct *parent", "struct task_struct *child"},
		Fields: []Field{dcomm("parent_comm", "parent"), {"parent_pid", "pid_t", "parent->pid"},
			dcomm("child_comm", "child"), {"child_pid", "pid_t", "child->pid"}},
	}}},
	{System: "sched", Name: "sched_stat_runtime", Layouts: []Layout{{
		Kernels: "to 6.1",
		Args:    []string{"struct task_struct *tsk", "u64 runtime", "u64 vruntime"},
		Fields: []Field{comm("comm", "tsk"), {"pid", "pid_t", "tsk->pid"}, {"runtime", "u64", "runtime"},
			{"vruntime", "u64", "vruntime"}},
	}, {
		Kernels: "6.12 on",
		Args:    []string{"struct task_struct *tsk", "u64 runtime"},
		Fields:  []Field{comm("comm", "tsk"), {"pid", "pid_t", "tsk->pid"}, {"runtime", "u64", "runtime"}},
	}, {
		Kernels: "with a __string comm (the development VM's 6.18)",
		Args:    []string{"struct task_struct *tsk", "u64 runtime"},
		Fields:  []Field{dcomm("comm", "tsk"), {"pid", "pid_t", "tsk->pid"}, {"runtime", "u64", "runtime"}},
	}}},
}

var (
	softirq = []Layout{{
		Args:   []string{"unsigned int vec_nr"},
		Fields: []Field{{"vec", "unsigned int", "vec_nr"}},
	}}
	timerOnly = []Layout{{
		Args:   []string{"struct timer_list *timer"},
		Fields: []Field{{"timer", "void *", "timer"}},
	}}
	hrtimerOnly = []Layout{{
		Args:   []string{"struct hrtimer *hrtimer"},
		Fields: []Field{{"hrtimer", "void *", "hrtimer"}},
	}}
	kmallocSizes = []Field{{"call_site", "unsigned long", "call_site"}, {"ptr", "void *", "ptr"},
		{"bytes_req", "size_t", "bytes_req"}, {"bytes_alloc", "size_t", "bytes_alloc"}}
	// net_dev_template: the name is the device's (IFNAMSIZ bytes at most).
	netDev = []Layout{{
		Args:   []string{"struct sk_buff *skb"},
		Fields: []Field{{"skbaddr", "void *", "skb"}, {"len", "unsigned int", "skb->len"}, {"name", "str16", "skb->dev->name"}},
	}}
	hrtimerStart = []Field{{"hrtimer", "void *", "hrtimer"}, {"function", "void *", "hrtimer->function"},
		{"expires", "s64", "hrtimer->node.expires"}, {"softexpires", "s64", "hrtimer->_softexpires"},
		{"mode", "enum", "mode"}}
)

// Find returns the table's event system:name, or nil.
func Find(system, name string) *Event {
	for i := range Events {
		if Events[i].System == system && Events[i].Name == name {
			return &Events[i]
		}
	}
	return nil
}
