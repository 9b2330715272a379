package filter

import "fmt"

// Reason is why the kernel refuses a filter. The texts of the kernel's
// own errors are its err_text[] (kernel/trace/trace_events_filter.c,
// newest kernel), as it prints them after "parse_error: " in the filter
// file; the refusals it reports without a text ("Error: (N)") have texts
// of ours, in lower case.
type Reason string

// The kernel's err_text[] entries a tracefs event filter can produce.
const (
	ErrInvalidOp         Reason = "Invalid operator"
	ErrTooManyOpen       Reason = "Too many '('"
	ErrTooManyClose      Reason = "Too few '('"
	ErrMissingQuote      Reason = "Missing matching quote"
	ErrMissingBraceOpen  Reason = "Missing '{'"
	ErrMissingBraceClose Reason = "Missing '}'"
	ErrOperandTooLong    Reason = "Operand too long"
	ErrExpectString      Reason = "Expecting string field"
	ErrExpectDigit       Reason = "Expecting numeric field"
	ErrIllegalFieldOp    Reason = "Illegal operation for field type"
	ErrFieldNotFound     Reason = "Field not found"
	ErrIllegalIntval     Reason = "Illegal integer value"
	ErrTooManyPreds      Reason = "Too many terms in predicate expression"
	ErrInvalidFilter     Reason = "Meaningless filter expression"
	ErrInvalidCPUList    Reason = "Invalid cpulist"
	ErrInvalidValue      Reason = "Invalid value (did you forget quotes)?"
	ErrNoFunction        Reason = "Function not found"
	ErrNoFilter          Reason = "No filter found"
)

// Refusals the kernel reports with an errno and no text (the filter
// file then reads "Error: (0)" or "Error: (-N)").
const (
	// ErrEmpty: nothing but spaces and parentheses (process_preds finds
	// no predicate: EINVAL).
	ErrEmpty Reason = "empty filter"
	// ErrMissingField: a predicate starts with no field name, as in
	// "== 1" or "a == 1 && )" (parse_pred returns -1: EPERM).
	ErrMissingField Reason = "missing field name"
	// ErrTooLong: the write is a page or longer (event_filter_write:
	// EINVAL).
	ErrTooLong Reason = "filter of 4096 bytes or more"
	// ErrNesting: a '(' deeper than the kernel's pre-scan counted
	// (predicate_parse: EINVAL).
	ErrNesting Reason = "parenthesis past the counted nesting"
	// ErrBackward: a program that would jump backward (predicate_parse
	// WARNs: EINVAL); no expression is known to make one.
	ErrBackward Reason = "program jumps backward"
)

// Error is a filter the kernel would refuse: the reason and where.
type Error struct {
	Expr string
	// Pos is the byte offset of expr that the kernel's caret points at
	// in the filter file after a refused write (its lasterr_pos, capped
	// at len(Expr)). For errors inside a predicate the kernel counts
	// from one past the predicate's first byte, so Pos is often one byte
	// right of the offending token: it is the kernel's number, kept so.
	Pos    int
	Reason Reason
	// Note says why, where the kernel's reason alone does not: the
	// syntax or field came with a later kernel than the one parsed for.
	Note string
}

// Error returns `filter "EXPR": position N: REASON`, and `(NOTE)` after
// it when there is a note.
func (e *Error) Error() string {
	if e.Note != "" {
		return fmt.Sprintf("filter %q: position %d: %s (%s)", e.Expr, e.Pos, e.Reason, e.Note)
	}
	return fmt.Sprintf("filter %q: position %d: %s", e.Expr, e.Pos, e.Reason)
}

// Kernel reports whether the kernel prints the reason as a parse_error
// text (its err_text[]) rather than an errno.
func (e *Error) Kernel() bool {
	switch e.Reason {
	case ErrEmpty, ErrMissingField, ErrTooLong, ErrNesting, ErrBackward:
		return false
	}
	return true
}
