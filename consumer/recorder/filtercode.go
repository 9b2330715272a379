package recorder

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
)

// A field filter (filter.Filter, ftrace's event filter language) is
// compiled into BPF and put in place of kc_field_filter's body
// (bpf/kc/fields.h) in its event's program copy: the kernel's filter
// program, entry by entry (filter_match_preds in
// kernel/trace/trace_events_filter.c), each predicate leaving its result
// in R0 and its entry jumping on it. The function gets the ring record
// in the scratch record (R1, a map value: the entry, then the trace
// record from byte 8 on, layout.RingCut bytes before its trace-record
// offsets) and its length (R2).
//
// The syscall programs, which serve every syscall event, get the filters
// of all their filtered events in kc_sys_field_filter's body
// (bpf/kc/syscall.h), dispatched on the event key (R1), each on the
// record as the kernel lays it out (R2, on the stack, sysRecLen bytes).

// recAt says where compiled filter code finds its event's record: the
// prefix of its labels, the record's offset of each trace-record offset,
// and how many bytes the record lacks before those offsets.
type recAt struct {
	prefix string
	off    func(int) int
	cut    int32
}

// ringRec is the ring record in the scratch record (kc_field_filter).
var ringRec = recAt{prefix: "kcf_", off: layout.RingOff, cut: layout.RingCut}

// sysRec is the syscall record of event key (kc_sys_field_filter).
func sysRec(key int) recAt { return sysRecAs("kcs", key) }

// sysRecAs is sysRec with labels of their own, starting with prefix, for
// another function of the same program (kc_sys_trig_filter).
func sysRecAs(prefix string, key int) recAt {
	return recAt{prefix: prefix + strconv.Itoa(key) + "_", off: func(o int) int { return o }}
}

// fieldFilterFunc and sysFilterFunc are the functions the loader
// replaces; filterPlaceholder mirrors KC_FILTER_PLACEHOLDER (TestMirrorsC).
const (
	fieldFilterFunc   = "kc_field_filter"
	sysFilterFunc     = "kc_sys_field_filter"
	userFilterFunc    = "kc_user_field_filter"
	filterPlaceholder = 0x6b6346494c
	sysRecLen         = 64 // KC_SYS_REC
)

// maxUnrolled bounds the bytes of a fixed string a substring match
// (MatchMiddle) searches with unrolled compares.
const maxUnrolled = 64

// errFilterUnsupported wraps what the recorder cannot yet evaluate in
// BPF though the kernel's language has it.
var errFilterUnsupported = errors.New("not evaluated in the recorder yet")

// CheckFilter returns nil when the recorder can evaluate flt on events of
// format f, else why not (naming the predicate's position).
func CheckFilter(flt *filter.Filter, f *tracefs.Format) error {
	_, err := compileFilter(flt, f, ringRec)
	if _, ok := SysShape(f); ok && err == nil {
		_, err = compileFilter(flt, f, sysRec(0))
	}
	return err
}

// filterProg returns a copy of program base named name whose field
// filter is flt, for events of format f, on the ring record in the
// scratch record.
func filterProg(base *ebpf.ProgramSpec, name string, flt *filter.Filter, f *tracefs.Format) (*ebpf.ProgramSpec, error) {
	return filterProgAt(base, name, flt, f, ringRec)
}

// filterProgAt is filterProg on the record rec says.
func filterProgAt(base *ebpf.ProgramSpec, name string, flt *filter.Filter, f *tracefs.Format, rec recAt) (*ebpf.ProgramSpec, error) {
	code, err := compileFilter(flt, f, rec)
	if err != nil {
		return nil, err
	}
	ps, err := patchImm(base, name, filterPlaceholder, 1)
	if err != nil {
		return nil, err
	}
	if !replaceFunc(ps, fieldFilterFunc, code) {
		return nil, fmt.Errorf("recorder program %s has no %s", base.Name, fieldFilterFunc)
	}
	return ps, nil
}

// replaceFunc puts code in place of the body of function fn in ps, and
// returns false when ps has no fn.
func replaceFunc(ps *ebpf.ProgramSpec, fn string, code asm.Instructions) bool {
	start := -1
	for i := range ps.Instructions {
		if ps.Instructions[i].Symbol() == fn {
			start = i
			break
		}
	}
	if start < 0 {
		return false
	}
	end := len(ps.Instructions)
	for i := start + 1; i < len(ps.Instructions); i++ {
		if btf.FuncMetadata(&ps.Instructions[i]) != nil {
			end = i
			break
		}
	}
	code = slices.Clone(code)
	// The first instruction carries the function's symbol and BTF, and
	// keeps its own jump target.
	ref := code[0].Reference()
	code[0].Metadata = ps.Instructions[start].Metadata
	if ref != "" {
		code[0] = code[0].WithReference(ref)
	}
	ps.Instructions = append(append(ps.Instructions[:start:start], code...), ps.Instructions[end:]...)
	return true
}

// sysFilters puts in every program of spec that calls
// kc_sys_field_filter the filters of the syscall events sysKeys (by key,
// of formats), as sysDispatch builds them, and in those that call
// kc_user_field_filter (bpf/kc/sys_user.bpf.h) those of the syscall
// events with user-space fields userKeys, on their ring record. It
// leaves a function as it is when its keys are none.
func sysFilters(spec *ebpf.CollectionSpec, sysKeys, userKeys []int, flts []*filter.Filter, formats []*tracefs.Format) error {
	for _, ring := range []bool{false, true} {
		keys, fn := sysKeys, sysFilterFunc
		if ring {
			keys, fn = userKeys, userFilterFunc
		}
		if len(keys) == 0 {
			continue
		}
		fm, ff := map[int]*filter.Filter{}, map[int]*tracefs.Format{}
		for _, k := range keys {
			fm[k], ff[k] = flts[k], formats[k]
		}
		code, err := sysDispatch(fm, ff, ring)
		if err != nil {
			return err
		}
		for _, ps := range spec.Programs {
			replaceFunc(ps, fn, code)
		}
	}
	return nil
}

// sysDispatch returns the body of kc_sys_field_filter for the filters
// flts of syscall events (by key, with their formats): a dispatch on the
// event key, each to its filter, every other key kept. With ring set it
// returns kc_user_field_filter's, on the ring record and its length.
func sysDispatch(flts map[int]*filter.Filter, formats map[int]*tracefs.Format, ring bool) (asm.Instructions, error) {
	if ring {
		return dispatch(flts, formats, func(k int) recAt {
			return recAt{prefix: "kcu" + strconv.Itoa(k) + "_", off: layout.RingOff, cut: layout.RingCut}
		}, asm.Mov.Reg(asm.R2, asm.R3))
	}
	return dispatch(flts, formats, sysRec, asm.Mov.Imm(asm.R2, sysRecLen))
}

// dispatch returns the body of a function that takes an event key (R1)
// and its record (R2, with its length in R3 where it varies) and
// returns the result of that key's filter in flts, or 1 for a key
// without one: each filter on the record as rec says, given its length
// by length.
func dispatch(flts map[int]*filter.Filter, formats map[int]*tracefs.Format, rec func(int) recAt, length asm.Instruction) (asm.Instructions, error) {
	keys := slices.Sorted(maps.Keys(flts))
	code := asm.Instructions{}
	for _, k := range keys {
		code = append(code, asm.JEq.Imm(asm.R1, int32(k), rec(k).prefix+"go"))
	}
	code = append(code, asm.Mov.Imm(asm.R0, 1), asm.Return())
	for _, k := range keys {
		c, err := compileFilter(flts[k], formats[k], rec(k))
		if err != nil {
			return nil, fmt.Errorf("event %s: %w", formats[k].FullName(), err)
		}
		// Each filter takes the record and its length as
		// kc_field_filter does.
		code = append(code, asm.Mov.Reg(asm.R1, asm.R2).WithSymbol(rec(k).prefix+"go"), length)
		code = append(code, c...)
	}
	return code, nil
}

// compileFilter returns the body of kc_field_filter for flt on events
// of format f. It fails, naming the predicate, for what the recorder
// cannot read (common_flags and common_preempt_count, which the kernel
// hides from BPF) or cannot yet evaluate in BPF.
func compileFilter(flt *filter.Filter, f *tracefs.Format, rec recAt) (asm.Instructions, error) {
	n := len(flt.Prog)
	label := func(i int) string {
		switch i {
		case n:
			return rec.prefix + "keep"
		case n + 1:
			return rec.prefix + "drop"
		}
		return rec.prefix + strconv.Itoa(i)
	}
	code := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1), asm.Mov.Reg(asm.R7, asm.R2)}
	for i, in := range flt.Prog {
		if in.Pred == nil {
			return nil, errors.New("filter program entry without a predicate")
		}
		pc, err := predCode(in.Pred, f, rec, label(i))
		if err != nil {
			return nil, fmt.Errorf("filter %q: position %d: %w", flt.Expr, in.Pred.Pos, err)
		}
		pc[0] = pc[0].WithSymbol(label(i))
		code = append(code, pc...)
		want := int32(0)
		if in.BranchIf {
			want = 1
		}
		code = append(code, asm.JEq.Imm(asm.R0, want, label(in.Jump)))
	}
	code = append(code,
		asm.Mov.Imm(asm.R0, 1).WithSymbol(label(n)), asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol(label(n+1)), asm.Return())
	return code, nil
}

// predCode returns the code that leaves predicate p's result, 0 or 1, in
// R0, reading the record where rec says; its local labels start with at.
func predCode(p *filter.Pred, f *tracefs.Format, rec recAt, at string) (asm.Instructions, error) {
	switch p.Kind {
	case filter.KindNever, filter.KindPtrString:
		// The kernel's result for these is false (filter.Match).
		return asm.Instructions{asm.Mov.Imm(asm.R0, 0)}, nil
	case filter.KindInt:
		return intCode(p, f, rec, at)
	case filter.KindString:
		return stringCode(p, rec, at)
	case filter.KindCPUs:
		return cpusCode(p, rec, at)
	case filter.KindFunction:
		return functionCode(p, rec, at)
	}
	return nil, fmt.Errorf("%s: %w", p.Field.Name, errFilterUnsupported)
}

// cpusCode compares the CPU, or a scalar field read as a CPU number,
// with a CPUS{} set, as filter.Match's evalCPUs does (the kernel's
// filter_pred_cpu_cpumask and filter_pred_{8..64}_cpumask): & is true
// when the CPU is in the set, != always, the others never. A cpumask
// field is maskCode's.
func cpusCode(p *filter.Pred, rec recAt, at string) (asm.Instructions, error) {
	if p.Field.Loc == filter.LocDataLoc || p.Field.Loc == filter.LocRelLoc {
		return maskCode(p, rec, at)
	}
	switch p.Op {
	case filter.OpNE:
		return asm.Instructions{asm.Mov.Imm(asm.R0, 1)}, nil
	case filter.OpAnd:
	default:
		return asm.Instructions{asm.Mov.Imm(asm.R0, 0)}, nil
	}
	var c asm.Instructions
	miss, hit, done := at+"_miss", at+"_hit", at+"_done"
	switch p.Field.Loc {
	case filter.LocCPU:
		c = append(c, asm.FnGetSmpProcessorId.Call(), asm.Mov.Reg32(asm.R3, asm.R0))
	case filter.LocInline:
		sz, ok := loadSize(p.Field.Size)
		if !ok || p.Field.Offset < 8 {
			return nil, fmt.Errorf("%s: %w", p.Field.Name, errFilterUnsupported)
		}
		// Read into an unsigned int: a u64's high half is dropped, and
		// a number past the kernel's CPUs is in no set.
		c = append(c, asm.LoadMem(asm.R3, asm.R6, int16(rec.off(p.Field.Offset)), sz), asm.Mov.Reg32(asm.R3, asm.R3),
			asm.JGE.Imm(asm.R3, int32(p.NrCPUs), miss))
	default:
		return nil, fmt.Errorf("%s: a cpumask field: %w", p.Field.Name, errFilterUnsupported)
	}
	// The set as ranges of consecutive CPUs; R3 holds the CPU (the
	// labels' nop writes R1).
	for i := 0; i < len(p.CPUs); {
		j := i
		for j+1 < len(p.CPUs) && p.CPUs[j+1] == p.CPUs[j]+1 {
			j++
		}
		next := fmt.Sprintf("%s_r%d", at, j+1)
		c = append(c, asm.JLT.Imm(asm.R3, int32(p.CPUs[i]), next), asm.JLE.Imm(asm.R3, int32(p.CPUs[j]), hit), nop().WithSymbol(next))
		i = j + 1
	}
	return append(c,
		asm.Mov.Imm(asm.R0, 0).WithSymbol(miss), asm.Ja.Label(done),
		asm.Mov.Imm(asm.R0, 1).WithSymbol(hit),
		nop().WithSymbol(done)), nil
}

// functionCode compares an address field with the function the filter
// names (FIELD.function == SYMBOL): true when the address falls inside
// it, for ==, or outside, for !=; never when the function was not
// resolved (the loader resolves it from /proc/kallsyms).
func functionCode(p *filter.Pred, rec recAt, at string) (asm.Instructions, error) {
	if p.FuncEnd == 0 {
		return asm.Instructions{asm.Mov.Imm(asm.R0, 0)}, nil
	}
	if p.Field.Loc != filter.LocInline || p.Field.Size != 8 || p.Field.Offset < 8 {
		return nil, fmt.Errorf("%s: %w", p.Field.Name, errFilterUnsupported)
	}
	in, out, done := int32(1), int32(0), at+"_done"
	if p.Op != filter.OpEQ {
		in, out = 0, 1
	}
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.R6, int16(rec.off(p.Field.Offset)), asm.DWord),
		asm.Mov.Imm(asm.R0, out),
		asm.LoadImm(asm.R2, int64(p.FuncStart), asm.DWord), asm.JLT.Reg(asm.R1, asm.R2, done),
		asm.LoadImm(asm.R2, int64(p.FuncEnd), asm.DWord), asm.JGE.Reg(asm.R1, asm.R2, done),
		asm.Mov.Imm(asm.R0, in),
		nop().WithSymbol(done),
	}, nil
}

// intCode compares an integer field, as the kernel's filter_pred_* do:
// == and != on the field's bytes, the others signed or unsigned of its
// size, & true when a bit is common.
func intCode(p *filter.Pred, f *tracefs.Format, rec recAt, at string) (asm.Instructions, error) {
	var c asm.Instructions
	size := p.Field.Size
	switch {
	case p.Field.Loc == filter.LocCPU:
		if p.Op == filter.OpAnd {
			return asm.Instructions{asm.Mov.Imm(asm.R0, 0)}, nil // filter_pred_cpu has no '&'
		}
		c = append(c, asm.FnGetSmpProcessorId.Call(), asm.Mov.Reg(asm.R1, asm.R0))
		size = 4
	case p.Field.Loc != filter.LocInline:
		return nil, fmt.Errorf("%s: %w", p.Field.Name, errFilterUnsupported)
	case p.Field.Name == "common_type":
		c = append(c, asm.Mov.Imm(asm.R1, int32(f.ID)))
	case p.Field.Name == "common_pid":
		c = append(c, asm.FnGetCurrentPidTgid.Call(), asm.Mov.Reg32(asm.R1, asm.R0))
	case p.Field.Offset < 8:
		return nil, fmt.Errorf("%s: the kernel hands BPF the record with its common fields overwritten", p.Field.Name)
	default:
		sz, ok := loadSize(size)
		if !ok {
			return asm.Instructions{asm.Mov.Imm(asm.R0, 0)}, nil
		}
		c = append(c, asm.LoadMem(asm.R1, asm.R6, int16(rec.off(p.Field.Offset)), sz))
	}
	bits := uint(size * 8)
	v := p.Value
	if bits < 64 {
		v &= 1<<bits - 1
	}
	signed := p.Signed && p.Op != filter.OpEQ && p.Op != filter.OpNE || p.Field.Loc == filter.LocCPU
	if signed && bits < 64 {
		sh := int32(64 - bits)
		c = append(c, asm.LSh.Imm(asm.R1, sh), asm.ArSh.Imm(asm.R1, sh))
		v = uint64(int64(v<<(64-bits)) >> (64 - bits))
	}
	c = append(c, asm.LoadImm(asm.R2, int64(v), asm.DWord), asm.Mov.Imm(asm.R0, 1))
	done := at + "_done"
	if p.Op == filter.OpAnd {
		c = append(c, asm.And.Reg(asm.R1, asm.R2), asm.JNE.Imm(asm.R1, 0, done))
	} else {
		c = append(c, jumpOp(p.Op, signed).Reg(asm.R1, asm.R2, done))
	}
	return append(c, asm.Mov.Imm(asm.R0, 0), nop().WithSymbol(done)), nil
}

// loadSize returns the load of an integer field of size bytes, false
// for a size no load has (the kernel's filter then never matches).
func loadSize(size int) (asm.Size, bool) {
	switch size {
	case 1:
		return asm.Byte, true
	case 2:
		return asm.Half, true
	case 4:
		return asm.Word, true
	case 8:
		return asm.DWord, true
	}
	return 0, false
}

// jumpOp returns the jump taken when a OP b holds.
func jumpOp(op filter.Op, signed bool) asm.JumpOp {
	switch op {
	case filter.OpEQ:
		return asm.JEq
	case filter.OpNE:
		return asm.JNE
	case filter.OpLT:
		if signed {
			return asm.JSLT
		}
		return asm.JLT
	case filter.OpLE:
		if signed {
			return asm.JSLE
		}
		return asm.JLE
	case filter.OpGT:
		if signed {
			return asm.JSGT
		}
		return asm.JGT
	}
	if signed {
		return asm.JSGE
	}
	return asm.JGE
}

// stringCode matches a fixed string field or the task's comm with the
// predicate's pattern, byte by byte, as the kernel's regex_match_* do
// over the field's length (filter.Match); Not inverts the result.
func stringCode(p *filter.Pred, rec recAt, at string) (asm.Instructions, error) {
	var c asm.Instructions
	base, off, n := asm.R6, 0, p.Field.StrLen
	switch p.Field.Loc {
	case filter.LocComm:
		// bpf_get_current_comm pads with NULs, as the kernel's comm.
		c = append(c, asm.Mov.Reg(asm.R1, asm.R10), asm.Add.Imm(asm.R1, -16), asm.Mov.Imm(asm.R2, 16), asm.FnGetCurrentComm.Call())
		base, off, n = asm.R10, -16, 16
	case filter.LocInline:
		if p.Field.Offset < 8 || n == 0 {
			return nil, fmt.Errorf("%s: %w", p.Field.Name, errFilterUnsupported)
		}
		off = rec.off(p.Field.Offset)
	default:
		return dynStringCode(p, rec, at)
	}
	miss, done := at+"_miss", at+"_done"
	// byteIs jumps to miss unless byte k of the string is b.
	byteIs := func(k int, b byte) asm.Instructions {
		return asm.Instructions{asm.LoadMem(asm.R1, base, int16(off+k), asm.Byte), asm.JNE.Imm(asm.R1, int32(b), miss)}
	}
	pat := p.Pattern
	hit, ok := true, true
	switch p.Match {
	case filter.MatchFull:
		ok = n >= len(pat)
		for k := 0; ok && k < len(pat); k++ {
			c = append(c, byteIs(k, pat[k])...)
		}
		if ok && len(pat) < n {
			c = append(c, byteIs(len(pat), 0)...)
		}
	case filter.MatchFront:
		ok = n >= len(pat)
		for k := 0; ok && k < len(pat); k++ {
			c = append(c, byteIs(k, pat[k])...)
		}
	case filter.MatchEnd:
		// regex_match_end takes the string to be n-1 bytes long.
		l := n - 1
		ok = l >= len(pat)
		for k := 0; ok && k < len(pat); k++ {
			c = append(c, byteIs(l-len(pat)+k, pat[k])...)
		}
	case filter.MatchMiddle:
		if n > maxUnrolled {
			return nil, fmt.Errorf("%s: a substring of a %d-byte array: %w", p.Field.Name, n, errFilterUnsupported)
		}
		ok = n >= len(pat)
		for s := 0; ok && s+len(pat) <= n; s++ {
			next := fmt.Sprintf("%s_at%d", at, s+1)
			for k := 0; k < len(pat); k++ {
				c = append(c, asm.LoadMem(asm.R1, base, int16(off+s+k), asm.Byte), asm.JNE.Imm(asm.R1, int32(pat[k]), next))
			}
			c = append(c, asm.Ja.Label(done+"_hit"), nop().WithSymbol(next))
		}
		hit = false // every start tried: a miss
	default:
		if n > maxUnrolled {
			return nil, fmt.Errorf("%s: a glob on a %d-byte array: %w", p.Field.Name, n, errFilterUnsupported)
		}
		g, err := globCode(p, base, off, n, at)
		if err != nil {
			return nil, err
		}
		return append(c, g...), nil
	}
	yes, no := int32(1), int32(0)
	if p.Not {
		yes, no = 0, 1
	}
	if !ok {
		// Longer than the field: the kernel's compare fails.
		return append(c, asm.Mov.Imm(asm.R0, no)), nil
	}
	if hit {
		c = append(c, asm.Ja.Label(done+"_hit"))
	}
	return append(c,
		asm.Mov.Imm(asm.R0, no).WithSymbol(miss), asm.Ja.Label(done),
		asm.Mov.Imm(asm.R0, yes).WithSymbol(done+"_hit"),
		nop().WithSymbol(done)), nil
}

// nop is an instruction that does nothing the code after it reads (R1 is
// loaded anew wherever a label leads): a target for labels.
func nop() asm.Instruction { return asm.Mov.Imm(asm.R1, 0) }
