package filter

// Op is a predicate's operator, in the kernel's order (OPS in
// kernel/trace/trace_events_filter.c).
type Op uint8

// The operators.
const (
	OpGlob Op = iota // ~
	OpNE             // !=
	OpEQ             // ==
	OpLE             // <=
	OpLT             // <
	OpGE             // >=
	OpGT             // >
	OpAnd            // & (bitwise: true when any bit is common)
)

// opText is the kernel's ops[]; "<=" precedes "<" so the longer matches.
var opText = [...]string{"~", "!=", "==", "<=", "<", ">=", ">", "&"}

func (o Op) String() string {
	if int(o) < len(opText) {
		return opText[o]
	}
	return "?"
}

// Loc says where a predicate's field is read from.
type Loc uint8

// The locations.
const (
	// LocInline: Size bytes at Offset of the record.
	LocInline Loc = iota
	// LocDataLoc: a u32 at Offset, low 16 bits the data's offset from the
	// record's start, high 16 bits its length.
	LocDataLoc
	// LocRelLoc: like LocDataLoc, the offset counting from the end of the
	// u32 (Offset+4).
	LocRelLoc
	// LocComm: the current task's comm (pseudo fields COMM, comm), not in
	// the record.
	LocComm
	// LocCPU: the CPU the event fires on (pseudo fields CPU, cpu,
	// common_cpu), not in the record.
	LocCPU
	// LocNone: a field with nothing to read (pseudo fields stacktrace,
	// STACKTRACE).
	LocNone
)

// Kind is what a predicate compares, which says how it evaluates.
type Kind uint8

// The kinds.
const (
	// KindInt compares an integer field with Value: OpEQ/OpNE on the
	// field's Size bytes, the others as Signed or unsigned of that size;
	// OpAnd is true when field&Value != 0. On LocCPU the CPU number is
	// an int compared with int32(Value), and OpAnd is always false
	// (filter_pred_cpu).
	KindInt Kind = iota
	// KindString matches a string field with Pattern as Match says; Not
	// inverts (!= and "~ "!..."").
	KindString
	// KindPtrString is a "char *" field: the kernel reads the string it
	// points at, which the record does not hold, so Match is false.
	KindPtrString
	// KindNever is a predicate the kernel accepts and never matches: an
	// integer compare on a field whose size is not 1, 2, 4 or 8, or on
	// stacktrace (its FILTER_PRED_FN_NOP).
	KindNever
	// KindCPUs compares with the CPU set CPUs (FIELD OP CPUS{list}): on
	// a data_loc cpumask field OpEQ is set equality, OpNE its negation,
	// OpAnd a non-empty intersection; on a scalar field or LocCPU, OpEQ
	// is false, OpNE true and OpAnd membership, and a scalar field's
	// value at or past NrCPUs is false for all three. A one-CPU set on a
	// scalar or LocCPU becomes a KindInt equality instead.
	KindCPUs
	// KindFunction is FIELD.function == SYMBOL: true when the field's
	// value is in [FuncStart, FuncEnd), or outside for OpNE; false while
	// the symbol is unresolved (FuncEnd == 0).
	KindFunction
)

// MatchKind is how a string pattern matches, the kernel's regex_type.
type MatchKind uint8

// The match kinds (filter_parse_regex). Only ~ classifies; == and !=
// are always MatchFull of the whole quoted text.
const (
	MatchFull   MatchKind = iota // the string equals Pattern
	MatchFront                   // "abc*": starts with Pattern
	MatchMiddle                  // "*abc*": contains Pattern
	MatchEnd                     // "*abc": ends with Pattern (see glob.go)
	MatchGlob                    // anything with *, ?, [ or \ inside: glob_match
)

// Field is the field a predicate reads.
type Field struct {
	Name   string
	Loc    Loc
	Offset int
	// Size is the inline field's size in bytes (4 for data_loc/rel_loc);
	// 0 for pseudo fields.
	Size   int
	Signed bool
	// StrLen is the length the kernel bounds an inline string by: the
	// array's size, 16 for comm, 0 for a flexible array (NUL-terminated).
	StrLen int
}

// Pred is one typed predicate, the leaf of a filter program.
type Pred struct {
	Field Field
	Op    Op
	Kind  Kind
	// Signed: KindInt compares as signed (the field's signedness, except
	// after a CPUS{} rewrite, which compares unsigned).
	Signed bool
	// Value is the integer constant as the kernel parsed it (kstrtoll for
	// signed fields, kstrtoull otherwise), before truncation to Size.
	Value uint64
	// Pattern and Match: a string predicate's pattern, after ~ took off
	// its '!' and the '*' that chose Match.
	Pattern string
	Match   MatchKind
	Not     bool
	// CPUs is a KindCPUs set, ascending; NrCPUs the kernel's nr_cpu_ids
	// it was parsed against.
	CPUs   []int
	NrCPUs int
	// Func names a KindFunction's symbol ("" when given as an address);
	// FuncStart and FuncEnd are its range once resolved.
	Func               string
	FuncStart, FuncEnd uint64
	// Pos is the byte offset of the predicate's first byte in the filter.
	Pos int
}

// Inst is one entry of the kernel's filter program (struct prog_entry):
// evaluate Pred; when the result equals BranchIf go to Jump, else to
// the next entry. Reaching index len(Prog), by a jump or by running
// past the last entry, means the record matches; a jump to len(Prog)+1
// means it does not. Jumps only go forward.
type Inst struct {
	Pred     *Pred
	BranchIf bool
	Jump     int
}

// Filter is a parsed event filter: the kernel's program of predicates
// with jump targets (predicate_parse, all three passes). '!' is folded
// into BranchIf and never appears in a Pred.
type Filter struct {
	Expr string
	// Prog is empty for "0", which the kernel takes as "no filter": every
	// record matches.
	Prog []Inst
}

// Preds returns the program's predicates in order.
func (f *Filter) Preds() []*Pred {
	out := make([]*Pred, len(f.Prog))
	for i, in := range f.Prog {
		out[i] = in.Pred
	}
	return out
}
