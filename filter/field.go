package filter

import (
	"strings"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// class is the kernel's filter_type of a field (enum filter_type in
// include/linux/trace_events.h), which decides the operators and values
// it takes.
type class uint8

const (
	clOther class = iota
	clStaticString
	clDynString
	clRelString
	clPtrString
	clCPUMask
	clComm
	clCPU
	clStacktrace
)

// isString is the kernel's is_string_field (kernel/trace/trace.h).
func (c class) isString() bool {
	switch c {
	case clStaticString, clDynString, clRelString, clPtrString, clComm:
		return true
	}
	return false
}

// kfield is a field as the kernel's filter sees it.
type kfield struct {
	Field
	class class
}

// fieldSet is the fields a filter of one event can name.
type fieldSet struct {
	own, generic, common []kfield
	// lacks are the newest kernel's pseudo fields the parsed-for
	// kernel does not have.
	lacks []string
}

// commLen is TASK_COMM_LEN, the bytes of a task's comm.
const commLen = 16

// generic are the pseudo fields (trace_define_generic_fields,
// kernel/trace/trace_events.c, newest kernel), found after the event's
// own fields and before the common ones.
var generic = []kfield{
	{Field{Name: "CPU", Loc: LocCPU, Signed: true}, clCPU},
	{Field{Name: "cpu", Loc: LocCPU, Signed: true}, clCPU},
	{Field{Name: "common_cpu", Loc: LocCPU, Signed: true}, clCPU},
	{Field{Name: "COMM", Loc: LocComm, StrLen: commLen}, clComm},
	{Field{Name: "comm", Loc: LocComm, StrLen: commLen}, clComm},
	{Field{Name: "stacktrace", Loc: LocNone}, clStacktrace},
	{Field{Name: "STACKTRACE", Loc: LocNone}, clStacktrace},
}

// newFieldSet returns f's fields as the kernel of opts classifies them,
// with the pseudo fields it has.
func newFieldSet(f *tracefs.Format, opts Options) fieldSet {
	var fs fieldSet
	for _, k := range generic {
		if k.class == clStacktrace && !opts.has(FeatStacktrace) {
			fs.lacks = append(fs.lacks, k.Name)
			continue
		}
		fs.generic = append(fs.generic, k)
	}
	if f == nil {
		return fs
	}
	for _, fl := range f.Common {
		fs.common = append(fs.common, classify(fl))
	}
	for _, fl := range f.Fields {
		fs.own = append(fs.own, classify(fl))
	}
	// A flexible array ("char buf[]", size 0) is left out of the format's
	// fields; the kernel filters it as a NUL-terminated string where it
	// starts, the end of the fixed part (ftrace:print's buf). Its type is
	// not kept, so it is taken as char, the only such field filters meet.
	for _, name := range f.Skipped {
		fs.own = append(fs.own, kfield{Field{Name: name, Loc: LocInline, Offset: f.FixedSize()}, clStaticString})
	}
	return fs
}

// classify returns fl with the kernel's class: filter_assign_type
// (kernel/trace/trace_events_filter.c) reads the C type, where an array
// type has its "[N]" and a dynamic one its "__data_loc"/"__rel_loc".
func classify(fl tracefs.Field) kfield {
	k := kfield{Field: Field{Name: fl.Name, Offset: fl.Offset, Size: fl.Size, Signed: fl.Signed}}
	hasChar := strings.Contains(fl.Type, "char")
	switch {
	// A dynamic field of another type is an integer to the kernel: the
	// u32 location word itself, inline.
	case fl.Loc == tracefs.DataLoc && hasChar:
		k.Loc, k.class = LocDataLoc, clDynString
	case fl.Loc == tracefs.DataLoc && strings.Contains(fl.Type, "cpumask_t"):
		k.Loc, k.class = LocDataLoc, clCPUMask
	case fl.Loc == tracefs.RelLoc && hasChar:
		k.Loc, k.class = LocRelLoc, clRelString
	case fl.ArrayLen > 0 && hasChar:
		k.class, k.StrLen = clStaticString, fl.Size
	case fl.ArrayLen == 0 && (fl.Type == "char *" || fl.Type == "const char *"):
		k.class = clPtrString
	}
	return k
}

// find returns the field a filter's name means, as
// trace_find_event_field looks it up: the event's own fields, then the
// pseudo fields, then the common fields.
func (fs fieldSet) find(name string) (kfield, bool) {
	for _, list := range [][]kfield{fs.own, fs.generic, fs.common} {
		// The kernel adds fields at the head of its list: of two with one
		// name the last defined is found first.
		for i := len(list) - 1; i >= 0; i-- {
			if list[i].Name == name {
				return list[i], true
			}
		}
	}
	return kfield{}, false
}
