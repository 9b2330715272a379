package filter

import (
	"os"
	"runtime"
	"strings"
	"sync"
)

// function reads FIELD.function's value: a number (an address in the
// function) or a symbol name running to the next space, for a field of
// the size of a long and == or != only (parse_pred, the function case).
func (c *predCtx) function(i int) (int, *Error) {
	s := c.str
	if c.field.Size != 8 {
		return 0, c.errAt(i, ErrIllegalFieldOp)
	}
	if c.pred.Op != OpEQ && c.pred.Op != OpNE {
		return 0, c.errAt(i, ErrInvalidOp)
	}
	c.pred.Kind = KindFunction
	syms := c.p.opts.Symbols
	start := i
	if isDigit(at(s, i)) {
		for isAlnum(at(s, i)) {
			i++
		}
		if i-start >= numBufLen {
			return 0, c.errAt(i, ErrOperandTooLong)
		}
		addr, err := kstrtoull(s[start:i])
		if err != nil {
			return 0, c.errAt(i, ErrInvalidValue)
		}
		c.pred.FuncStart = addr
		if syms != nil {
			lo, hi, ok := syms.Containing(addr)
			if !ok {
				return 0, c.errAt(i, ErrNoFunction)
			}
			c.pred.FuncStart, c.pred.FuncEnd = lo, hi
		}
		return i, nil
	}
	for i < len(s) && !isSpace(s[i]) {
		i++
	}
	c.pred.Func = s[start:i]
	if syms != nil {
		lo, hi, ok := syms.Lookup(c.pred.Func)
		if !ok {
			return 0, c.errAt(i, ErrNoFunction)
		}
		c.pred.FuncStart, c.pred.FuncEnd = lo, hi
	}
	return i, nil
}

// cpus reads "CPUS{list}": for a scalar field, a CPU pseudo field or a
// cpumask field, with ==, != or &. A one-CPU list on a scalar field or
// CPU becomes an integer equality, as the kernel optimises it.
func (c *predCtx) cpus(i int) (int, *Error) {
	s := c.str
	switch c.field.class {
	case clCPUMask, clCPU, clOther:
	default:
		return 0, c.errAt(i, ErrIllegalFieldOp)
	}
	switch c.pred.Op {
	case OpEQ, OpNE, OpAnd:
	default:
		return 0, c.errAt(i, ErrIllegalFieldOp)
	}
	i += len("CPUS")
	if at(s, i) != '{' {
		return 0, c.errAt(i+1, ErrMissingBraceOpen)
	}
	i++
	start := i
	end := strings.IndexByte(s[i:], '}')
	if end < 0 {
		return 0, c.errAt(len(s), ErrMissingBraceClose)
	}
	i += end
	if i == start {
		return 0, c.errAt(i, ErrInvalidCPUList)
	}
	nr := c.p.opts.NrCPUs
	set, ok := parseCPUList(s[start:i], nr)
	if !ok {
		return 0, c.errAt(i, ErrInvalidCPUList)
	}
	i++
	c.pred.NrCPUs = nr
	if len(set) == 1 && c.field.class != clCPUMask {
		if c.pred.Op == OpAnd {
			c.pred.Op = OpEQ
		}
		c.pred.Kind, c.pred.Value = KindInt, uint64(set[0])
		// select_comparison_fn(op, size, false): unsigned.
		c.pred.Signed = c.field.class == clCPU
		if c.field.class == clOther && !intSize(c.field.Size) {
			c.pred.Kind = KindNever
		}
		return i, nil
	}
	c.pred.Kind, c.pred.CPUs = KindCPUs, set
	if c.field.class == clOther && !intSize(c.field.Size) {
		c.pred.Kind = KindNever
	}
	return i, nil
}

// parseCPUList returns the CPUs of list as cpulist_parse reads it
// (bitmap_parselist, lib/bitmap-str.c) for nbits CPUs: regions split by
// commas or spaces, each N, A-B, "all", or a range with :USED/GROUP;
// N is the last CPU. ok is false where the kernel fails.
func parseCPUList(list string, nbits int) (cpus []int, ok bool) {
	mask := make([]bool, nbits)
	s := list
	for {
		for s != "" && (isSpace(s[0]) || s[0] == ',') {
			s = s[1:]
		}
		if s == "" || s[0] == '\n' {
			break
		}
		var r region
		var rest string
		if rest, ok = r.parse(s, nbits); !ok {
			return nil, false
		}
		if r.start > r.end || r.group == 0 || r.off > r.group || r.end >= uint64(nbits) {
			return nil, false
		}
		for st := r.start; st <= r.end; st += r.group {
			for b := st; b < st+min(r.end-st+1, r.off); b++ {
				mask[b] = true
			}
		}
		if s = rest; s == "" {
			break
		}
	}
	for cpu, on := range mask {
		if on {
			cpus = append(cpus, cpu)
		}
	}
	return cpus, true
}

// region is bitmap-str.c's: CPUs start..end, off of every group.
type region struct{ start, end, off, group uint64 }

// parse reads one region at s (bitmap_parse_region) and returns what
// follows it ("" at the end of the list).
func (r *region) parse(s string, nbits int) (string, bool) {
	last := uint64(nbits - 1)
	var ok bool
	if len(s) >= 3 && strings.EqualFold(s[:3], "all") {
		r.start, r.end, s = 0, last, s[3:]
	} else {
		if r.start, s, ok = getNum(s, last); !ok {
			return "", false
		}
		r.end = r.start
		if !endOfRegion(at(s, 0)) {
			if at(s, 0) != '-' {
				return "", false
			}
			if r.end, s, ok = getNum(s[1:], last); !ok {
				return "", false
			}
		}
	}
	if endOfRegion(at(s, 0)) {
		r.off, r.group = r.end+1, r.end+1
		if at(s, 0) == 0 || at(s, 0) == '\n' {
			return "", true
		}
		return s, true
	}
	if at(s, 0) != ':' {
		return "", false
	}
	if r.off, s, ok = getNum(s[1:], last); !ok || at(s, 0) != '/' {
		return "", false
	}
	r.group, s, ok = getNum(s[1:], last)
	return s, ok
}

// endOfRegion is bitmap-str.c's end_of_region.
func endOfRegion(c byte) bool {
	return isSpace(c) || c == ',' || c == 0 || c == '\n'
}

// getNum reads a decimal number that fits 32 bits, or N for last.
func getNum(s string, last uint64) (uint64, string, bool) {
	if at(s, 0) == 'N' {
		return last, s[1:], true
	}
	n := 0
	var v uint64
	for n < len(s) && isDigit(s[n]) {
		v = v*10 + uint64(s[n]-'0')
		if v > 0xffffffff {
			return 0, "", false
		}
		n++
	}
	return v, s[n:], n > 0
}

var (
	possibleOnce sync.Once
	possibleN    int
)

// possibleCPUs returns nr_cpu_ids: one more than the last CPU of
// /sys/devices/system/cpu/possible, or runtime.NumCPU without it.
func possibleCPUs() int {
	possibleOnce.Do(func() {
		possibleN = runtime.NumCPU()
		b, err := os.ReadFile("/sys/devices/system/cpu/possible")
		if err != nil {
			return
		}
		if set, ok := parseCPUList(strings.TrimSpace(string(b)), 1<<16); ok && len(set) > 0 {
			possibleN = set[len(set)-1] + 1
		}
	})
	return possibleN
}
