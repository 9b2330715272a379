package filter

import (
	"slices"
	"strings"
)

// maxStrVal is MAX_FILTER_STR_VAL: a quoted value must be shorter.
const maxStrVal = 256

// numBufLen is parse_pred's num_buf: a number must be shorter.
const numBufLen = 24

// predCtx is one predicate being read, as parse_pred reads it: str is
// the filter from the predicate's first byte; errors are at pos+i, pos
// being one past that byte (the kernel passes ptr, already advanced).
type predCtx struct {
	p     *parser
	str   string
	pos   int
	field kfield
	pred  *Pred
}

// errAt returns an *Error at the kernel's position for offset i.
func (c *predCtx) errAt(i int, r Reason) *Error {
	return &Error{Pos: c.pos + i, Reason: r}
}

// parsePred reads the predicate at offset next of the filter (pos is
// next+1, the kernel's ptr): FIELD[.ustring][.function] OP VALUE. It
// returns the predicate and the bytes it took, or the *Error where the
// kernel's parse_pred refuses it.
func (p *parser) parsePred(next, pos int) (*Pred, int, *Error) {
	c := &predCtx{p: p, str: p.expr[next:], pos: pos}
	s := c.str
	i := 0
	for isSpace(at(s, i)) {
		i++
	}
	start := i
	for isAlnum(at(s, i)) || at(s, i) == '_' {
		i++
	}
	if i == start {
		return nil, 0, &Error{Pos: next, Reason: ErrMissingField}
	}
	f, ok := p.fields.find(s[start:i])
	if !ok {
		e := c.errAt(i, ErrFieldNotFound)
		if slices.Contains(p.fields.lacks, s[start:i]) {
			e.Note = p.opts.needs(FeatStacktrace, "the pseudo field "+s[start:i])
		}
		return nil, 0, e
	}
	c.field = f
	function := false
	if strings.HasPrefix(s[i:], ".ustring") {
		// .ustring reads a char * from user space; Match cannot either way.
		i += len(".ustring")
	}
	if strings.HasPrefix(s[i:], ".function") {
		if !p.opts.has(FeatFunction) {
			// The older parse_pred ends the name at the '.' and finds no
			// operator there.
			e := c.errAt(i, ErrInvalidOp)
			e.Note = p.opts.needs(FeatFunction, "FIELD.function")
			return nil, 0, e
		}
		function = true
		i += len(".function")
	}
	for isSpace(at(s, i)) {
		i++
	}
	op, ok := lookupOp(s[i:])
	if !ok {
		return nil, 0, c.errAt(i, ErrInvalidOp)
	}
	i += len(opText[op])
	for isSpace(at(s, i)) {
		i++
	}
	c.pred = &Pred{Field: f.Field, Op: op, Signed: f.Signed, Pos: next + start}
	n, err := c.value(i, function)
	if err != nil {
		return nil, 0, err
	}
	return c.pred, n, nil
}

// lookupOp returns the operator s starts with, trying them in the
// kernel's order so "<=" wins over "<".
func lookupOp(s string) (Op, bool) {
	for op, t := range opText {
		if strings.HasPrefix(s, t) {
			return Op(op), true
		}
	}
	return 0, false
}

// value reads the value at offset i, in parse_pred's order of cases:
// .function, CPUS{...}, a quoted string, a number. It returns the offset
// past the value.
func (c *predCtx) value(i int, function bool) (int, *Error) {
	s := c.str
	switch {
	case function:
		return c.function(i)
	case strings.HasPrefix(s[i:], "CPUS") && c.p.opts.has(FeatCPUS):
		return c.cpus(i)
	case strings.HasPrefix(s[i:], "CPUS"):
		e := c.errAt(i, ErrInvalidValue)
		e.Note = c.p.opts.needs(FeatCPUS, "CPUS{list}")
		return 0, e
	case at(s, i) == '\'' || at(s, i) == '"':
		return c.quoted(i)
	case isDigit(at(s, i)) || at(s, i) == '-':
		return c.number(i)
	}
	return 0, c.errAt(i, ErrInvalidValue)
}

// quoted reads a string value: the operator must be ==, != or ~ and the
// field a string; the value runs to the same quote again, no escapes.
func (c *predCtx) quoted(i int) (int, *Error) {
	s := c.str
	switch c.pred.Op {
	case OpNE:
		c.pred.Not = true
	case OpGlob, OpEQ:
	default:
		return 0, c.errAt(i, ErrIllegalFieldOp)
	}
	if !c.field.class.isString() {
		return 0, c.errAt(i, ErrExpectDigit)
	}
	q := s[i]
	start := i + 1
	end := strings.IndexByte(s[start:], q)
	if end < 0 {
		return 0, c.errAt(len(s), ErrMissingQuote)
	}
	i = start + end
	if i-start >= maxStrVal {
		return 0, c.errAt(i, ErrOperandTooLong)
	}
	c.pred.Kind = KindString
	if c.field.class == clPtrString {
		c.pred.Kind = KindPtrString
	}
	c.pred.Pattern, c.pred.Match = s[start:i], MatchFull
	if c.pred.Op == OpGlob {
		var not bool
		c.pred.Pattern, c.pred.Match, not = parseRegex(c.pred.Pattern)
		c.pred.Not = not
	}
	return i + 1, nil
}

// number reads an integer value: not for a string field, not with ~;
// an optional '-', then letters and digits, read by kstrtoll for a
// signed field and kstrtoull otherwise.
func (c *predCtx) number(i int) (int, *Error) {
	s := c.str
	if c.field.class.isString() {
		return 0, c.errAt(i, ErrExpectString)
	}
	if c.pred.Op == OpGlob {
		return 0, c.errAt(i, ErrIllegalFieldOp)
	}
	start := i
	if s[i] == '-' {
		i++
	}
	for isAlnum(at(s, i)) {
		i++
	}
	if i-start >= numBufLen {
		return 0, c.errAt(i, ErrOperandTooLong)
	}
	var val uint64
	var err error
	if c.field.Signed {
		var v int64
		v, err = kstrtoll(s[start:i])
		val = uint64(v)
	} else {
		val, err = kstrtoull(s[start:i])
	}
	if err != nil {
		return 0, c.errAt(start, ErrIllegalIntval)
	}
	c.pred.Value = val
	c.pred.Kind = KindInt
	switch {
	case c.field.Loc == LocCPU:
	case !intSize(c.field.Size):
		c.pred.Kind = KindNever
	case c.field.Loc != LocInline:
		// A cpumask compared with a number: the kernel compares the u32
		// location word (select_comparison_fn on the field's size).
		c.pred.Field.Loc = LocInline
	}
	return i, nil
}

// intSize reports whether the kernel has integer predicates for a field
// of size bytes (select_comparison_fn); others get its NOP predicate.
func intSize(size int) bool {
	return size == 1 || size == 2 || size == 4 || size == 8
}
