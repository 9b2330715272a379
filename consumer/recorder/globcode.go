package recorder

import (
	"fmt"

	"github.com/cilium/ebpf/asm"
	"github.com/kconsume/kconsume/filter"
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
