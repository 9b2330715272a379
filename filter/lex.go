package filter

// scan is what the kernel's first read of the filter finds (calc_stack,
// kernel/trace/trace_events_filter.c): how deep parentheses go and how
// many predicates there are.
type scan struct {
	parens int // deepest nesting, counting the whole expression as one
	preds  int
}

// calcStack returns the scan of expr, or an *Error for a quote left open
// (at the quote), a ')' without its '(' (at the ')'), or a '(' without
// its ')' (at that '('). Quotes hide parentheses; a predicate is a run of
// bytes other than spaces, parentheses, "&&" and "||".
func calcStack(expr string) (scan, *Error) {
	isPred := false
	preds, open, maxOpen := 0, 1, 1
	var quote byte
	lastQuote := 0
	i := 0
	for ; i < len(expr); i++ {
		c := expr[i]
		if isSpace(c) {
			continue
		}
		if quote != 0 {
			if c == quote {
				quote = 0
			}
			continue
		}
		switch c {
		case '\'', '"':
			quote, lastQuote = c, i
		case '|', '&':
			if at(expr, i+1) == c {
				isPred = false
				continue
			}
		case '(':
			isPred = false
			open++
			maxOpen = max(maxOpen, open)
			continue
		case ')':
			isPred = false
			if open == 1 {
				return scan{}, &Error{Expr: expr, Pos: i, Reason: ErrTooManyClose}
			}
			open--
			continue
		}
		if !isPred {
			preds++
			isPred = true
		}
	}
	if quote != 0 {
		return scan{}, &Error{Expr: expr, Pos: lastQuote, Reason: ErrMissingQuote}
	}
	if open != 1 {
		return scan{}, &Error{Expr: expr, Pos: unclosedParen(expr, open), Reason: ErrTooManyOpen}
	}
	return scan{parens: maxOpen, preds: preds}, nil
}

// unclosedParen returns where calc_stack reports a '(' without its ')':
// walking back from the end, the '(' at the outermost unclosed level.
func unclosedParen(expr string, open int) int {
	level := open
	var quote byte
	// The kernel's walk stops before index 0: a '(' there is reported at
	// 0 all the same.
	for i := len(expr) - 1; i > 0; i-- {
		c := expr[i]
		if quote != 0 {
			if c == quote {
				quote = 0
			}
			continue
		}
		switch c {
		case '(':
			if level == open {
				return i
			}
			level--
		case ')':
			level++
		case '\'', '"':
			quote = c
		}
	}
	return 0
}
