package filter

import (
	"encoding/binary"
	"slices"
)

// Match reports whether the kernel would keep a record of the event
// under this filter, running its program as filter_match_preds does.
// rec is the raw record as the Format lays it out (host byte order,
// little-endian here), comm the task's name and cpu the CPU the event
// fired on, for the pseudo fields. A record the program cannot read,
// too short for a field it evaluates or with a data_loc pointing outside
// it, does not match, whatever negations surround the field; Match never
// panics.
func (f *Filter) Match(rec []byte, comm string, cpu int) bool {
	if f == nil || len(f.Prog) == 0 {
		return true
	}
	env := &env{rec: rec, cpu: cpu}
	copy(env.comm[:commLen-1], comm)
	n := len(f.Prog)
	i := 0
	for i >= 0 && i < n {
		in := f.Prog[i]
		if in.Pred == nil {
			return false
		}
		r := in.Pred.eval(env)
		if env.bad {
			return false
		}
		if r == in.BranchIf {
			// A hand-built program could jump back; parsed ones never do.
			if in.Jump <= i {
				return false
			}
			i = in.Jump
			continue
		}
		i++
	}
	// The program ends at n (the kernel's TRUE entry) or n+1 (FALSE).
	return i == n
}

// env is what a predicate reads.
type env struct {
	rec  []byte
	comm [commLen]byte
	cpu  int
	// bad is set by a read outside rec.
	bad bool
}

// eval returns the predicate's result on one record.
func (p *Pred) eval(e *env) bool {
	switch p.Kind {
	case KindInt:
		return p.evalInt(e)
	case KindString:
		str, n, ok := p.str(e)
		e.bad = e.bad || !ok
		return ok && matchString(p, str, n) != p.Not
	case KindCPUs:
		return p.evalCPUs(e)
	case KindFunction:
		v, ok := p.uint(e.rec)
		e.bad = e.bad || !ok
		in := v >= p.FuncStart && v < p.FuncEnd
		return ok && p.FuncEnd != 0 && in == (p.Op == OpEQ)
	case KindPtrString, KindNever:
		// The kernel's predicate reads nothing from the record here, or
		// reads a pointer Match cannot follow; its result is false.
		return false
	}
	return false
}

// uint returns the field's Size bytes at Offset, zero-extended.
func (p *Pred) uint(rec []byte) (uint64, bool) {
	off, size := p.Field.Offset, p.Field.Size
	if off < 0 || size <= 0 || off > len(rec)-size {
		return 0, false
	}
	b := rec[off : off+size]
	switch size {
	case 1:
		return uint64(b[0]), true
	case 2:
		return uint64(binary.LittleEndian.Uint16(b)), true
	case 4:
		return uint64(binary.LittleEndian.Uint32(b)), true
	case 8:
		return binary.LittleEndian.Uint64(b), true
	}
	return 0, false
}

// evalInt is the kernel's filter_pred_{8,16,32,64} for == and != and
// filter_pred_{s,u}{8..64} for the others, with Value truncated to the
// field's size; on the CPU pseudo field, filter_pred_cpu.
func (p *Pred) evalInt(e *env) bool {
	if p.Field.Loc == LocCPU {
		// filter_pred_cpu compares ints and has no '&'.
		return p.Op != OpAnd && compare(p.Op, int64(int32(e.cpu)), int64(int32(p.Value)))
	}
	v, ok := p.uint(e.rec)
	if !ok {
		e.bad = true
		return false
	}
	bits := uint(p.Field.Size * 8)
	mask := ^uint64(0) >> (64 - bits)
	a, b := v&mask, p.Value&mask
	if p.Signed && p.Op != OpEQ && p.Op != OpNE {
		sa := int64(a<<(64-bits)) >> (64 - bits)
		sb := int64(b<<(64-bits)) >> (64 - bits)
		return compare(p.Op, sa, sb)
	}
	return compare(p.Op, a, b)
}

// compare returns a OP b, signed or unsigned as T is.
func compare[T int64 | uint64](op Op, a, b T) bool {
	switch op {
	case OpEQ:
		return a == b
	case OpNE:
		return a != b
	case OpLT:
		return a < b
	case OpLE:
		return a <= b
	case OpGT:
		return a > b
	case OpGE:
		return a >= b
	case OpAnd:
		return a&b != 0
	}
	return false
}

// str returns a string predicate's bytes from the string's start to the
// record's end, and the length the kernel bounds the match by.
func (p *Pred) str(e *env) ([]byte, int, bool) {
	fl := p.Field
	switch fl.Loc {
	case LocComm:
		return e.comm[:], commLen, true
	case LocInline:
		if fl.Offset < 0 || fl.Offset > len(e.rec) || fl.Offset+fl.StrLen > len(e.rec) {
			return nil, 0, false
		}
		return e.rec[fl.Offset:], fl.StrLen, true
	}
	start, n, ok := p.dyn(e.rec)
	if !ok {
		return nil, 0, false
	}
	return e.rec[start:], n, true
}

// dyn returns where a data_loc or rel_loc field's data starts in rec and
// its length; ok is false when the word or the data is outside rec.
func (p *Pred) dyn(rec []byte) (start, n int, ok bool) {
	off := p.Field.Offset
	if off < 0 || off > len(rec)-4 {
		return 0, 0, false
	}
	w := binary.LittleEndian.Uint32(rec[off:])
	start, n = int(w&0xffff), int(w>>16)
	if p.Field.Loc == LocRelLoc {
		start += off + 4
	}
	if start > len(rec) || start+n > len(rec) {
		return 0, 0, false
	}
	return start, n, true
}

// evalCPUs is the kernel's CPUS{} predicates: do_filter_cpumask for a
// cpumask field, do_filter_scalar_cpumask for a scalar or the CPU.
func (p *Pred) evalCPUs(e *env) bool {
	var cpu uint64
	switch p.Field.Loc {
	case LocCPU:
		cpu = uint64(e.cpu)
	case LocDataLoc, LocRelLoc:
		r, ok := p.evalMask(e.rec)
		e.bad = e.bad || !ok
		return r
	default:
		v, ok := p.uint(e.rec)
		e.bad = e.bad || !ok
		// filter_pred_{8..64}_cpumask read the field into an unsigned
		// int: a u64's high half is dropped.
		v = uint64(uint32(v))
		if !ok || v >= uint64(p.NrCPUs) {
			return false
		}
		cpu = v
	}
	switch p.Op {
	case OpNE:
		return true
	case OpAnd:
		_, in := slices.BinarySearch(p.CPUs, int(cpu))
		return cpu < 1<<31 && in
	}
	return false
}

// evalMask compares a cpumask field (a bitmap of longs in the record's
// dynamic area; bits past its length are clear) with CPUs; ok is false
// when the bitmap is outside rec.
func (p *Pred) evalMask(rec []byte) (result, ok bool) {
	start, n, ok := p.dyn(rec)
	if !ok {
		return false, false
	}
	bits := rec[start : start+n]
	set := func(cpu int) bool {
		return cpu/8 < len(bits) && bits[cpu/8]&(1<<(cpu%8)) != 0
	}
	equal, meet := true, false
	for cpu := 0; cpu < p.NrCPUs; cpu++ {
		_, want := slices.BinarySearch(p.CPUs, cpu)
		have := set(cpu)
		equal = equal && want == have
		meet = meet || want && have
	}
	switch p.Op {
	case OpEQ:
		return equal, true
	case OpNE:
		return !equal, true
	case OpAnd:
		return meet, true
	}
	return false, true
}
