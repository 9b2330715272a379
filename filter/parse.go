package filter

import (
	"fmt"
	"strings"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// maxWrite is the longest filter a write to the filter file takes: a
// page less one byte (event_filter_write, kernel/trace/trace_events.c).
const maxWrite = 4095

// Options are what a parse needs from the machine, which the kernel
// knows and a format does not.
type Options struct {
	// NrCPUs is the kernel's nr_cpu_ids, the bound of CPUS{} lists (the
	// count of possible CPUs); 0 reads /sys/devices/system/cpu/possible.
	NrCPUs int
	// Symbols resolves FIELD.function values; nil leaves them unresolved
	// and accepts any name, where the kernel refuses one kallsyms lacks.
	Symbols Symbols
	// Kernel is the release whose parser to follow: the syntax and
	// pseudo fields that Changes says came later than it are refused as
	// that kernel refuses them, with a note naming the release that has
	// them. The zero Release is the newest kernel. A trailing && or ||
	// is refused on every kernel (FeatIncomplete): older ones accept it
	// with a meaning of their own.
	Kernel Release
}

// has reports whether the kernel of o has feature f.
func (o Options) has(f Feature) bool {
	return o.Kernel == (Release{}) || Has(o.Kernel, f)
}

// needs returns the note of an Error refused because o's kernel lacks
// feature f: what f is and the first release with it.
func (o Options) needs(f Feature, what string) string {
	for _, c := range Changes {
		if c.Feature == f {
			return fmt.Sprintf("%s needs Linux %d.%d or later; this kernel is %s", what, c.Mainline.Major, c.Mainline.Minor, o.Kernel)
		}
	}
	return ""
}

// Symbols is the kernel's symbol table as .function needs it.
type Symbols interface {
	// Lookup returns the start and end of the function named name.
	Lookup(name string) (start, end uint64, ok bool)
	// Containing returns the start and end of the function holding addr.
	Containing(addr uint64) (start, end uint64, ok bool)
}

// Parse returns expr parsed as the newest kernel parses a write to
// events/SYSTEM/EVENT/filter of the event f describes, with default
// Options. It fails with an *Error wherever that kernel refuses the
// write.
func Parse(expr string, f *tracefs.Format) (*Filter, error) {
	return ParseOptions(expr, f, Options{})
}

// ParseOptions is Parse with opts. The kernel reads a write up to its
// first NUL byte, and so does ParseOptions. "0" (spaces around it
// allowed) is the kernel's "no filter": a Filter with an empty program.
func ParseOptions(expr string, f *tracefs.Format, opts Options) (*Filter, error) {
	full := expr
	if len(full) > maxWrite {
		return nil, &Error{Expr: full, Pos: 0, Reason: ErrTooLong}
	}
	if i := strings.IndexByte(expr, 0); i >= 0 {
		expr = expr[:i]
	}
	// apply_event_filter: strstrip()ed "0" clears the filter. strstrip
	// ends the string in place after its last non-space byte, so the
	// parse, whose positions count from the unmoved start, never sees
	// trailing spaces.
	if trimSpace(expr) == "0" {
		return &Filter{Expr: full}, nil
	}
	for expr != "" && isSpace(expr[len(expr)-1]) {
		expr = expr[:len(expr)-1]
	}
	if opts.NrCPUs <= 0 {
		opts.NrCPUs = possibleCPUs()
	}
	sc, err := calcStack(expr)
	if err != nil {
		return nil, withExpr(err, full)
	}
	if sc.preds == 0 {
		return nil, &Error{Expr: full, Pos: 0, Reason: ErrEmpty}
	}
	p := &parser{expr: expr, fields: newFieldSet(f, opts), opts: opts, scan: sc}
	prog, perr := p.program()
	if perr != nil {
		return nil, withExpr(perr, full)
	}
	return &Filter{Expr: full, Prog: prog}, nil
}

// trimSpace is the kernel's strstrip: expr without the bytes isspace
// takes at either end.
func trimSpace(expr string) string {
	i, j := 0, len(expr)
	for i < j && isSpace(expr[i]) {
		i++
	}
	for j > i && isSpace(expr[j-1]) {
		j--
	}
	return expr[i:j]
}

// withExpr returns e for the caller's whole expression, its position
// capped at its length as append_filter_err caps it.
func withExpr(e *Error, expr string) *Error {
	e.Expr = expr
	e.Pos = min(e.Pos, len(expr))
	return e
}

// parser is one run of predicate_parse over expr.
type parser struct {
	expr   string
	fields fieldSet
	opts   Options
	scan   scan
}

// The bits of an entry of predicate_parse's stack of parentheses.
const (
	stInvert     = 1
	stProcessAnd = 2
	stProcessOr  = 4
)

// entry is a program entry while predicate_parse builds it: target is
// the kernel's (one less than where to continue).
type entry struct {
	pred   *Pred
	when   bool
	target int
	invert bool
}

// program returns the filter's program, built as predicate_parse
// builds it (the comment above it in trace_events_filter.c explains the
// three passes), or the *Error it stops at.
func (p *parser) program() ([]Inst, *Error) {
	s := p.expr
	stack := make([]int, 1, p.scan.parens)
	prog := make([]entry, 0, p.scan.preds+2)
	invert := false
	ptr := 0
	for ptr < len(s) {
		next := ptr
		ptr++
		c := s[next]
		if isSpace(c) {
			continue
		}
		if c == '(' {
			if len(stack) >= p.scan.parens {
				return nil, &Error{Pos: next, Reason: ErrNesting}
			}
			stack = append(stack, b2i(invert))
			continue
		}
		if c == '!' && at(s, next+1) != '=' && at(s, next+1) != '~' {
			invert = !invert
			continue
		}
		if len(prog) >= p.scan.preds {
			return nil, &Error{Pos: next, Reason: ErrTooManyPreds}
		}
		pred, n, err := p.parsePred(next, ptr)
		if err != nil {
			return nil, err
		}
		prog = append(prog, entry{pred: pred, target: len(prog) - 1, invert: invert})
		ptr = next + n
		var done bool
		ptr, done, err = p.afterPred(&prog, &stack, ptr)
		if err != nil {
			return nil, err
		}
		if done {
			return p.finish(prog, stack, ptr)
		}
		invert = stack[len(stack)-1]&stInvert != 0
	}
	// Only the inner loop can complete a non-empty expression.
	if len(prog) > 0 {
		return nil, &Error{Pos: ptr, Reason: ErrInvalidFilter}
	}
	return p.finish(prog, stack, ptr)
}

// afterPred is predicate_parse's inner loop after a predicate: it reads
// ")", "&&", "||" or the end, updating the pending && and || of the
// stack's top. It returns where reading goes on, and done at the end of
// the input.
func (p *parser) afterPred(prog *[]entry, stack *[]int, ptr int) (int, bool, *Error) {
	s := p.expr
	for {
		next := ptr
		ptr++
		c := at(s, next)
		if isSpace(c) {
			continue
		}
		switch c {
		case ')', 0:
		case '&', '|':
			if at(s, next+1) != c {
				return 0, false, &Error{Pos: next, Reason: ErrTooManyPreds}
			}
			ptr++
		default:
			return 0, false, &Error{Pos: next, Reason: ErrTooManyPreds}
		}
		top := &(*stack)[len(*stack)-1]
		invert := *top&stInvert != 0
		n := len(*prog) - 1
		if *top&stProcessAnd != 0 {
			updatePreds(*prog, n, invert)
			*top &^= stProcessAnd
		}
		if c == '&' {
			*top |= stProcessAnd
			return ptr, false, nil
		}
		if *top&stProcessOr != 0 {
			updatePreds(*prog, n, !invert)
			*top &^= stProcessOr
		}
		if c == '|' {
			*top |= stProcessOr
			return ptr, false, nil
		}
		if c == 0 {
			return ptr, true, nil
		}
		if len(*stack) == 1 {
			return 0, false, &Error{Pos: ptr, Reason: ErrTooManyClose}
		}
		*stack = (*stack)[:len(*stack)-1]
	}
}

// updatePreds is the kernel's update_preds: the entry prog[n] points at
// gets n as its label and branches when the result is when.
func updatePreds(prog []entry, n int, when bool) {
	t := prog[n].target
	s := prog[t].target
	prog[t].when = when
	prog[t].target = n
	prog[n].target = s
}

// finish checks the parentheses closed and the program is not empty,
// then runs predicate_parse's second and third passes and returns the
// program with Jump = the kernel's target + 1.
func (p *parser) finish(prog []entry, stack []int, ptr int) ([]Inst, *Error) {
	if len(stack) != 1 {
		return nil, &Error{Pos: ptr, Reason: ErrTooManyOpen}
	}
	n := len(prog)
	if n == 0 {
		return nil, &Error{Pos: ptr, Reason: ErrNoFilter}
	}
	// prog[n] is TRUE and prog[n+1] FALSE; they never branch.
	prog = append(prog, entry{target: 1}, entry{target: 0})
	prog[n-1].target = n
	prog[n-1].when = false
	for i := n - 2; i >= 0; i-- {
		t := prog[i].target
		if t < 0 || t > n {
			return nil, &Error{Pos: ptr, Reason: ErrBackward}
		}
		if prog[i].when == prog[t].when {
			prog[i].target = prog[t].target
		}
	}
	out := make([]Inst, n)
	for i := range n {
		// The kernel WARNs and refuses a program that would not move
		// forward (the third pass of predicate_parse).
		if prog[i].target <= i {
			return nil, &Error{Pos: ptr, Reason: ErrBackward}
		}
		out[i] = Inst{Pred: prog[i].pred, BranchIf: prog[i].invert != prog[i].when, Jump: prog[i].target + 1}
	}
	return out, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
