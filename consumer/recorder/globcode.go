package recorder

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/kconsume/kconsume/filter"
	"golang.org/x/sys/unix"
)

// Globs (~ with *, ?, [...]) on fixed strings and COMM, compiled into
// the pattern's automaton; stringCode calls globCode.

// globElem is one element of a glob: a byte, any byte (?), a run of any
// bytes (*), or a class of ranges ([a-z], [!a-z]).
type globElem struct {
	kind   byte // 'c', '?', '*' or '['
	b      byte
	ranges [][2]byte
	not    bool
}

// parseGlob splits pat into its elements as lib/glob.c reads them: \
// quotes the next byte, a class without its closing ']' is a literal
// '['. A trailing \ is refused.
func parseGlob(pat string) ([]globElem, error) {
	var out []globElem
	for i := 0; i < len(pat); i++ {
		switch c := pat[i]; c {
		case '*', '?':
			out = append(out, globElem{kind: c})
		case '\\':
			if i+1 == len(pat) {
				return nil, fmt.Errorf("a glob ending in a backslash: %w", errFilterUnsupported)
			}
			i++
			out = append(out, globElem{kind: 'c', b: pat[i]})
		case '[':
			e, end, ok := parseClass(pat, i+1)
			if !ok {
				out = append(out, globElem{kind: 'c', b: '['})
				continue
			}
			out = append(out, e)
			i = end - 1
		default:
			out = append(out, globElem{kind: 'c', b: c})
		}
	}
	return out, nil
}

// parseClass reads the class whose text starts at pat[i] (after its
// '['), as lib/glob.c does: a first ']' is a member, a '-' between two
// bytes makes a range. It returns the class, the offset past its ']',
// and false for a class without one.
func parseClass(pat string, i int) (globElem, int, bool) {
	e := globElem{kind: '['}
	if i < len(pat) && pat[i] == '!' {
		e.not = true
		i++
	}
	first := true
	for i < len(pat) {
		a := pat[i]
		if a == ']' && !first {
			return e, i + 1, true
		}
		first = false
		b := a
		if i+2 < len(pat) && pat[i+1] == '-' && pat[i+2] != ']' {
			b = pat[i+2]
			i += 2
		}
		e.ranges = append(e.ranges, [2]byte{a, b})
		i++
	}
	return e, 0, false
}

// globCode matches the string of at most n bytes at off from base (up
// to its first NUL) with the predicate's
// glob, by running the pattern's automaton over it: bit j of R8 says
// the first j elements match what was read. Branch-free per byte but
// for the string's end, so the verifier walks it once.
func globCode(p *filter.Pred, base asm.Register, off, n int, at string) (asm.Instructions, error) {
	elems, err := parseGlob(p.Pattern)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Field.Name, err)
	}
	m := len(elems)
	if m > 62 {
		return nil, fmt.Errorf("%s: a glob of %d elements: %w", p.Field.Name, m, errFilterUnsupported)
	}
	end := at + "_gend"
	// closure sets bit j+1 wherever bit j is set and element j is a *.
	closure := func(r asm.Register) asm.Instructions {
		var c asm.Instructions
		for j, e := range elems {
			if e.kind == '*' {
				c = append(c, asm.Mov.Reg(asm.R2, r), asm.RSh.Imm(asm.R2, int32(j)), asm.And.Imm(asm.R2, 1),
					asm.LSh.Imm(asm.R2, int32(j+1)), asm.Or.Reg(r, asm.R2))
			}
		}
		return c
	}
	c := asm.Instructions{asm.Mov.Imm(asm.R8, 1)}
	c = append(c, closure(asm.R8)...)
	for k := 0; k < n; k++ {
		c = append(c, asm.LoadMem(asm.R1, base, int16(off+k), asm.Byte), asm.JEq.Imm(asm.R1, 0, end), asm.Mov.Imm(asm.R9, 0))
		for j, e := range elems {
			// R2: bit j of the mask.
			c = append(c, asm.Mov.Reg(asm.R2, asm.R8), asm.RSh.Imm(asm.R2, int32(j)), asm.And.Imm(asm.R2, 1))
			shift := int32(j + 1)
			switch e.kind {
			case '*':
				shift = int32(j)
			case 'c':
				c = append(c, byteEq(e.b)...)
				c = append(c, asm.And.Reg(asm.R2, asm.R3))
			case '[':
				c = append(c, classHas(e)...)
				c = append(c, asm.And.Reg(asm.R2, asm.R3))
			}
			c = append(c, asm.LSh.Imm(asm.R2, shift), asm.Or.Reg(asm.R9, asm.R2))
		}
		c = append(c, closure(asm.R9)...)
		c = append(c, asm.Mov.Reg(asm.R8, asm.R9))
	}
	yes, no := int32(1), int32(0)
	if p.Not {
		yes, no = 0, 1
	}
	return append(c,
		asm.RSh.Imm(asm.R8, int32(m)).WithSymbol(end), asm.And.Imm(asm.R8, 1),
		asm.Mov.Imm(asm.R0, no), asm.JEq.Imm(asm.R8, 0, at+"_gdone"), asm.Mov.Imm(asm.R0, yes),
		nop().WithSymbol(at+"_gdone")), nil
}

// byteEq sets R3 to 1 when the byte in R1 is b, else 0, without a
// branch: (R1 ^ b) - 1 has its top bit set only for 0.
func byteEq(b byte) asm.Instructions {
	return asm.Instructions{asm.Mov.Reg(asm.R3, asm.R1), asm.Xor.Imm(asm.R3, int32(b)), asm.Sub.Imm(asm.R3, 1), asm.RSh.Imm(asm.R3, 63)}
}

// classHas sets R3 to 1 when the byte in R1 is in class e, else 0,
// without a branch: a <= c is the top bit of c - a clear, and c <= b
// that of b - c.
func classHas(e globElem) asm.Instructions {
	c := asm.Instructions{asm.Mov.Imm(asm.R3, 0)}
	for _, r := range e.ranges {
		c = append(c,
			asm.Mov.Reg(asm.R4, asm.R1), asm.Sub.Imm(asm.R4, int32(r[0])), asm.RSh.Imm(asm.R4, 63), asm.Xor.Imm(asm.R4, 1),
			asm.Mov.Imm(asm.R0, int32(r[1])), asm.Sub.Reg(asm.R0, asm.R1), asm.RSh.Imm(asm.R0, 63), asm.Xor.Imm(asm.R0, 1),
			asm.And.Reg(asm.R4, asm.R0), asm.Or.Reg(asm.R3, asm.R4))
	}
	if e.not {
		c = append(c, asm.Xor.Imm(asm.R3, 1))
	}
	return c
}

// Globs on dynamic strings run the same automaton, as shift-and over a
// table: entry b (globEntry bytes at b*globEntry) holds, for byte b,
// the mask T of the states a non-* element matching b leads to, the
// mask U of the * states b keeps (every * but on NUL), the mask V of the
// accepting state (on NUL only), and S, the * states. The table is a
// read-only array map the loader creates from the pattern named in the
// reference (globTableRef).
const (
	globEntry = 32
	globChunk = 64 // bytes copied and matched per loop round
	// globMaxBytes bounds the bytes of a string a glob reads: the
	// verifier walks every round of the loop, once for each way the
	// program reaches the filter, and a program must stay under its
	// million instructions with several globs.
	globMaxBytes = 1024
	globRefPfx   = "kc_glob:"
	// The loop's spill slots, in dynStringCode's buffer above the chunk.
	globMask, globRes, globPos, globOff, globLen = -24, -32, -40, -48, -56
)

// globTableRef returns the map reference of pattern pat's table.
func globTableRef(pat string) string { return globRefPfx + hex.EncodeToString([]byte(pat)) }

// dynGlobElems returns pat's elements with runs of * made one, which
// then needs one closure step.
func dynGlobElems(pat string) ([]globElem, error) {
	elems, err := parseGlob(pat)
	if err != nil {
		return nil, err
	}
	out := elems[:0:0]
	for _, e := range elems {
		if e.kind == '*' && len(out) > 0 && out[len(out)-1].kind == '*' {
			continue
		}
		out = append(out, e)
	}
	if len(out) > 62 {
		return nil, fmt.Errorf("a glob of %d elements: %w", len(out), errFilterUnsupported)
	}
	return out, nil
}

// matches reports whether element e (not a *) takes byte b.
func (e globElem) matches(b byte) bool {
	switch e.kind {
	case '?':
		return true
	case 'c':
		return e.b == b
	}
	in := false
	for _, r := range e.ranges {
		in = in || r[0] <= b && b <= r[1]
	}
	return in != e.not
}

// globTable returns the table of pattern pat, as the map value the
// reference names.
func globTable(pat string) ([]byte, error) {
	elems, err := dynGlobElems(pat)
	if err != nil {
		return nil, err
	}
	var S uint64
	for j, e := range elems {
		if e.kind == '*' {
			S |= 1 << j
		}
	}
	tab := make([]byte, 256*globEntry)
	for b := range 256 {
		var T, U, V uint64
		for j, e := range elems {
			if b != 0 && e.kind != '*' && e.matches(byte(b)) {
				T |= 1 << (j + 1)
			}
		}
		if b == 0 {
			V = 1 << len(elems)
		} else {
			U = S
		}
		for k, v := range []uint64{T, U, V, S} {
			binary.NativeEndian.PutUint64(tab[b*globEntry+8*k:], v)
		}
	}
	return tab, nil
}

// globTables adds to spec the table map of every glob reference its
// programs make. It fails for a reference whose pattern has no table.
func globTables(spec *ebpf.CollectionSpec) error {
	for _, ps := range spec.Programs {
		for _, ins := range ps.Instructions {
			ref := ins.Reference()
			if !strings.HasPrefix(ref, globRefPfx) || spec.Maps[ref] != nil {
				continue
			}
			pat, err := hex.DecodeString(ref[len(globRefPfx):])
			if err != nil {
				return fmt.Errorf("glob table %q: %w", ref, err)
			}
			tab, err := globTable(string(pat))
			if err != nil {
				return fmt.Errorf("glob table for %q: %w", pat, err)
			}
			spec.Maps[ref] = &ebpf.MapSpec{
				Name: "kc_glob", Type: ebpf.Array, KeySize: 4, ValueSize: uint32(len(tab)), MaxEntries: 1,
				Flags:    unix.BPF_F_RDONLY_PROG,
				Contents: []ebpf.MapKV{{Key: uint32(0), Value: tab}},
			}
		}
	}
	return nil
}

// dynGlobCode matches the dynamic string of R9 bytes at offset R8 of the
// record (dynStringCode's registers, checked to lie in it) with p's glob,
// leaving the result in R0: it copies the string globChunk bytes at a
// time to the stack, zero past its end, and steps the automaton a byte
// at a time, branch-free, until the string ends or no state is left.
// The string ends at its first NUL or after its n bytes, as filter.Match
// (glob_match over the field's length) has it; a longer string than
// globMaxBytes is taken to end there.
func dynGlobCode(p *filter.Pred, rec recAt, at string) (asm.Instructions, error) {
	elems, err := dynGlobElems(p.Pattern)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Field.Name, err)
	}
	m := len(elems)
	var start uint64 = 1
	for j, e := range elems {
		if e.kind == '*' && start&(1<<j) != 0 {
			start |= 1 << (j + 1)
		}
	}
	loop, fin, res := at+"_gloop", at+"_gfin", at+"_gres"
	spill := func(off int16, r asm.Register) asm.Instruction { return asm.StoreMem(asm.R10, off, r, asm.DWord) }
	fill := func(r asm.Register, off int16) asm.Instruction { return asm.LoadMem(r, asm.R10, off, asm.DWord) }
	c := asm.Instructions{
		spill(globOff, asm.R8), spill(globLen, asm.R9),
		asm.LoadImm(asm.R1, int64(start), asm.DWord), spill(globMask, asm.R1),
		asm.Mov.Imm(asm.R1, 0), spill(globRes, asm.R1), spill(globPos, asm.R1),
		// R2: the bytes left, at most a chunk.
		fill(asm.R4, globPos).WithSymbol(loop), fill(asm.R2, globLen), asm.Sub.Reg(asm.R2, asm.R4),
		asm.JSLE.Imm(asm.R2, 0, fin),
		// min(R2, globChunk) without a branch, which would have the
		// verifier walk the chunk twice: R2 + ((R2-C) & (R2-C)>>63).
		// The mask tells it the size is below 2C.
		asm.Sub.Imm(asm.R2, globChunk), asm.Mov.Reg(asm.R1, asm.R2), asm.ArSh.Imm(asm.R1, 63),
		asm.And.Reg(asm.R2, asm.R1), asm.Add.Imm(asm.R2, globChunk), asm.And.Imm(asm.R2, 2*globChunk-1),
		asm.Mov.Imm(asm.R1, 0),
	}
	for k := 0; k < globChunk; k += 8 {
		c = append(c, asm.StoreMem(asm.R10, int16(dynAt+k), asm.R1, asm.DWord))
	}
	c = append(c, fill(asm.R8, globOff))
	c = append(c, dynCopy("", asm.R4, 0, asm.R2)...)
	c = append(c,
		fill(asm.R8, globMask), fill(asm.R9, globRes),
		asm.LoadMapValue(asm.R5, 0, 0).WithReference(globTableRef(p.Pattern)),
		asm.LoadMem(asm.R0, asm.R5, 24, asm.DWord))
	for k := 0; k < globChunk; k++ {
		c = append(c,
			asm.LoadMem(asm.R1, asm.R10, int16(dynAt+k), asm.Byte), asm.LSh.Imm(asm.R1, 5),
			asm.Mov.Reg(asm.R2, asm.R5), asm.Add.Reg(asm.R2, asm.R1),
			// The string ended before this byte where it is NUL: keep
			// whether the accepting state was reached.
			asm.LoadMem(asm.R1, asm.R2, 16, asm.DWord), asm.And.Reg(asm.R1, asm.R8), asm.Or.Reg(asm.R9, asm.R1),
			asm.LoadMem(asm.R4, asm.R2, 8, asm.DWord), asm.And.Reg(asm.R4, asm.R8),
			asm.LoadMem(asm.R3, asm.R2, 0, asm.DWord),
			asm.LSh.Imm(asm.R8, 1), asm.And.Reg(asm.R8, asm.R3), asm.Or.Reg(asm.R8, asm.R4),
			asm.Mov.Reg(asm.R3, asm.R8), asm.And.Reg(asm.R3, asm.R0), asm.LSh.Imm(asm.R3, 1), asm.Or.Reg(asm.R8, asm.R3))
	}
	c = append(c,
		spill(globMask, asm.R8), spill(globRes, asm.R9),
		fill(asm.R4, globPos), asm.Add.Imm(asm.R4, globChunk), spill(globPos, asm.R4),
		asm.JEq.Imm(asm.R8, 0, res),
		asm.JLT.Imm(asm.R4, globMaxBytes, loop),
		// The string's n bytes read without a NUL: it ends here.
		fill(asm.R8, globMask).WithSymbol(fin), fill(asm.R9, globRes),
		asm.LoadImm(asm.R1, int64(1)<<m, asm.DWord), asm.And.Reg(asm.R8, asm.R1), asm.Or.Reg(asm.R9, asm.R8),
		asm.Mov.Reg(asm.R0, asm.R9).WithSymbol(res), asm.RSh.Imm(asm.R0, int32(m)), asm.And.Imm(asm.R0, 1))
	if p.Not {
		c = append(c, asm.Xor.Imm(asm.R0, 1))
	}
	return c, nil
}
