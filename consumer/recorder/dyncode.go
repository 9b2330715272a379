package recorder

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf/asm"
	"github.com/kconsume/kconsume/filter"
)

// Dynamic strings are copied to the stack before they are compared:
// dynBuf bytes at dynAt below the frame (the comm takes the 16 above).
const (
	dynBuf = 256
	dynAt  = -16 - dynBuf
)

// dynStringCode matches a __data_loc or __rel_loc string, found by
// dynLocCode. A substring search looks at the string's first dynBuf
// bytes.
func dynStringCode(p *filter.Pred, rec recAt, at string) (asm.Instructions, error) {
	pat := p.Pattern
	if len(pat)+1 > dynBuf {
		return nil, fmt.Errorf("%s: a pattern of %d bytes: %w", p.Field.Name, len(pat), errFilterUnsupported)
	}
	c, err := dynLocCode(p, rec)
	if err != nil {
		return nil, err
	}
	miss, hit, done := at+"_miss", at+"_hit", at+"_done"
	byteIs := func(k int, b byte) asm.Instructions {
		return asm.Instructions{asm.LoadMem(asm.R1, asm.R10, int16(dynAt+k), asm.Byte), asm.JNE.Imm(asm.R1, int32(b), miss)}
	}
	L := int32(len(pat))
	switch p.Match {
	case filter.MatchGlob:
		g, err := dynGlobCode(p, rec, at)
		if err != nil {
			return nil, err
		}
		return append(c, g...), nil
	case filter.MatchFull:
		// strcmp when n is 0, else strncmp over n, n at least L.
		c = append(c, dynCopy("", asm.R0, L+1, 0)...)
		c = append(c, asm.JEq.Imm(asm.R9, 0, at+"_nul"), asm.JLT.Imm(asm.R9, L, miss))
		for k := range len(pat) {
			c = append(c, byteIs(k, pat[k])...)
		}
		c = append(c, asm.JEq.Imm(asm.R9, L, hit))
		c = append(c, nop().WithSymbol(at+"_nul"))
		if len(pat) > 0 {
			// From n == 0: the pattern's bytes too.
			c = append(c, asm.JNE.Imm(asm.R9, 0, at+"_end"))
			for k := range len(pat) {
				c = append(c, byteIs(k, pat[k])...)
			}
		}
		c = append(c, byteIs(len(pat), 0)[0].WithSymbol(at+"_end"), byteIs(len(pat), 0)[1], asm.Ja.Label(hit))
	case filter.MatchFront:
		c = append(c, asm.JEq.Imm(asm.R9, 0, at+"_cmp"), asm.JLT.Imm(asm.R9, L, miss))
		c = append(c, dynCopy(at+"_cmp", asm.R0, max(L, 1), 0)...)
		for k := range len(pat) {
			c = append(c, byteIs(k, pat[k])...)
		}
		c = append(c, asm.Ja.Label(hit))
	case filter.MatchEnd:
		// The last L bytes of the n-1 the kernel takes the string to be.
		c = append(c, asm.Mov.Reg(asm.R4, asm.R9), asm.Sub.Imm(asm.R4, L+1), asm.JSLT.Imm(asm.R4, 0, miss),
			asm.Mov.Reg(asm.R9, asm.R4))
		c = append(c, dynCopy("", asm.R9, max(L, 1), 0)...)
		for k := range len(pat) {
			c = append(c, byteIs(k, pat[k])...)
		}
		c = append(c, asm.Ja.Label(hit))
	case filter.MatchMiddle:
		// memcmp at every start in the first n bytes (at most dynBuf).
		c = append(c, asm.JEq.Imm(asm.R9, 0, miss), asm.JLE.Imm(asm.R9, dynBuf, at+"_n"), asm.Mov.Imm(asm.R9, dynBuf),
			nop().WithSymbol(at+"_n"))
		// Zeroed first: verifiers before 6.2 take a copy of a size
		// known only by its bounds for a read of the whole buffer.
		c = append(c, asm.Mov.Imm(asm.R1, 0))
		for k := 0; k < dynBuf; k += 8 {
			c = append(c, asm.StoreMem(asm.R10, int16(dynAt+k), asm.R1, asm.DWord))
		}
		c = append(c, dynCopy("", asm.R0, 0, asm.R9)...)
		for st := 0; st+len(pat) <= dynBuf; st++ {
			next := fmt.Sprintf("%s_at%d", at, st+1)
			c = append(c, asm.JLT.Imm(asm.R9, int32(st+len(pat)), miss))
			for k := range len(pat) {
				c = append(c, asm.LoadMem(asm.R1, asm.R10, int16(dynAt+st+k), asm.Byte), asm.JNE.Imm(asm.R1, int32(pat[k]), next))
			}
			c = append(c, asm.Ja.Label(hit), nop().WithSymbol(next))
		}
		c = append(c, asm.Ja.Label(miss))
	}
	yes, no := int32(1), int32(0)
	if p.Not {
		yes, no = 0, 1
	}
	return append(c,
		asm.Mov.Imm(asm.R0, no).WithSymbol(miss), asm.Ja.Label(done),
		asm.Mov.Imm(asm.R0, yes).WithSymbol(hit),
		nop().WithSymbol(done)), nil
}

// dynCopy copies size bytes (sizeReg's, when size is 0) of the dynamic
// data at offset R8 of the record (plus register from, unless it is R0)
// to the stack buffer at dynAt; its first instruction is labelled label
// when set.
func dynCopy(label string, from asm.Register, size int32, sizeReg asm.Register) asm.Instructions {
	c := asm.Instructions{asm.Mov.Reg(asm.R3, asm.R8)}
	if from != asm.R0 {
		c = append(c, asm.Add.Reg(asm.R3, from))
	}
	c = append(c, asm.And.Imm(asm.R3, 0x1ffff), asm.Add.Reg(asm.R3, asm.R6),
		asm.Mov.Reg(asm.R1, asm.R10), asm.Add.Imm(asm.R1, dynAt))
	if size > 0 {
		c = append(c, asm.Mov.Imm(asm.R2, size))
	} else {
		c = append(c, asm.Mov.Reg(asm.R2, sizeReg))
	}
	c = append(c, asm.FnProbeReadKernel.Call())
	if label != "" {
		c[0] = c[0].WithSymbol(label)
	}
	return c
}

// dynLocCode reads the location word of p's __data_loc or __rel_loc
// field: R8 is where its data starts in the record and R9 its length.
// A location outside the record fails the whole filter, as the kernel's
// filter_match_preds would not read there (filter.Match's bad record).
func dynLocCode(p *filter.Pred, rec recAt) (asm.Instructions, error) {
	off := p.Field.Offset
	if off < 8 {
		return nil, fmt.Errorf("%s: %w", p.Field.Name, errFilterUnsupported)
	}
	// R8: the string's offset in the trace record, R9: its length.
	c := asm.Instructions{
		asm.LoadMem(asm.R8, asm.R6, int16(rec.off(off)), asm.Word),
		asm.Mov.Reg(asm.R9, asm.R8), asm.RSh.Imm(asm.R9, 16),
		asm.And.Imm(asm.R8, 0xffff),
	}
	if p.Field.Loc == filter.LocRelLoc {
		c = append(c, asm.Add.Imm(asm.R8, int32(off+4)))
	}
	// In the record (R7 + the cut bytes long), and past its common
	// fields: else the filter fails.
	c = append(c,
		asm.JLT.Imm(asm.R8, 8, rec.prefix+"drop"),
		asm.Mov.Reg(asm.R1, asm.R8), asm.Add.Reg(asm.R1, asm.R9),
		asm.Mov.Reg(asm.R2, asm.R7), asm.Add.Imm(asm.R2, rec.cut),
		asm.JGT.Reg(asm.R1, asm.R2, rec.prefix+"drop"),
		asm.Sub.Imm(asm.R8, rec.cut))
	return c, nil
}

// maskCode compares a __data_loc cpumask field (a bitmap of longs; bits
// past its length clear) with a CPUS{} set over the kernel's CPUs, as
// filter.Match's evalMask does (do_filter_cpumask): == when the two are
// equal, != when not, & when they meet. The bitmap is copied to the
// stack, so the kernel may have at most 8*dynBuf CPUs.
func maskCode(p *filter.Pred, rec recAt, at string) (asm.Instructions, error) {
	words := (p.NrCPUs + 63) / 64
	if p.NrCPUs <= 0 || 8*words > dynBuf {
		return nil, fmt.Errorf("%s: a cpumask of %d CPUs: %w", p.Field.Name, p.NrCPUs, errFilterUnsupported)
	}
	c, err := dynLocCode(p, rec)
	if err != nil {
		return nil, err
	}
	hit, miss, done := at+"_hit", at+"_miss", at+"_done"
	c = append(c, asm.Mov.Imm(asm.R1, 0))
	for w := range words {
		c = append(c, asm.StoreMem(asm.R10, int16(dynAt+8*w), asm.R1, asm.DWord))
	}
	c = append(c, asm.JLE.Imm(asm.R9, int32(8*words), at+"_n"), asm.Mov.Imm(asm.R9, int32(8*words)))
	c = append(c, dynCopy(at+"_n", asm.R0, 0, asm.R9)...)
	for w := range words {
		var want, valid uint64
		for b := range 64 {
			cpu := 64*w + b
			if cpu >= p.NrCPUs {
				break
			}
			valid |= 1 << b
			if _, in := slices.BinarySearch(p.CPUs, cpu); in {
				want |= 1 << b
			}
		}
		c = append(c, asm.LoadMem(asm.R1, asm.R10, int16(dynAt+8*w), asm.DWord),
			asm.LoadImm(asm.R2, int64(want), asm.DWord))
		if p.Op == filter.OpAnd {
			// A CPU in both: the predicate holds.
			c = append(c, asm.And.Reg(asm.R1, asm.R2), asm.JNE.Imm(asm.R1, 0, hit))
			continue
		}
		// A CPU in one only: the two differ.
		c = append(c, asm.LoadImm(asm.R3, int64(valid), asm.DWord), asm.And.Reg(asm.R1, asm.R3),
			asm.JNE.Reg(asm.R1, asm.R2, miss))
	}
	// Every word read: no CPU met (&), or none differed (==, !=).
	yes, no := int32(1), int32(0)
	switch p.Op {
	case filter.OpAnd:
		c = append(c, asm.Ja.Label(miss))
	case filter.OpEQ:
		c = append(c, asm.Ja.Label(hit))
	case filter.OpNE:
		yes, no = 0, 1
		c = append(c, asm.Ja.Label(hit))
	default:
		return nil, fmt.Errorf("%s: %s on a cpumask: %w", p.Field.Name, p.Op, errFilterUnsupported)
	}
	return append(c,
		asm.Mov.Imm(asm.R0, no).WithSymbol(miss), asm.Ja.Label(done),
		asm.Mov.Imm(asm.R0, yes).WithSymbol(hit),
		nop().WithSymbol(done)), nil
}
