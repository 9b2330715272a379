// Package synth defines synthetic events: user-defined typed events,
// written in the kernel's synthetic_events syntax
// (Documentation/trace/histogram.rst, kernel/trace/trace_events_synth.c)
// and generated from BPF or from user space into a kconsume trace.
//
// A definition is "NAME TYPE FIELD; TYPE FIELD[N]; …". Types are pid_t,
// u8…u64, s8…s64, int, unsigned int, char[N] (written "char f[N]", fixed
// text), char[] (written "char f[]" or "char[] f", a string), and arrays
// "TYPE f[N]" of the integer types. The payload lays the fields out in
// order, byte-aligned, little-endian; a string is NUL-terminated. This is
// the layout relayfmt declares, so a payload is written as is.
package synth

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kconsume/kconsume/relayfmt"
)

// MaxFields is the most fields an event may have, as the kernel's
// SYNTH_FIELDS_MAX (kernel/trace/trace_synth.h).
const MaxFields = 64

// MaxArray bounds a fixed array or char[N] field, so an event always
// fits a trace record.
const MaxArray = 4096

// MaxString bounds a string value (STR_VAR_LEN_MAX in the kernel is 256;
// markers are allowed more).
const MaxString = 1024

// ErrDefinition is wrapped by every error about a malformed definition.
var ErrDefinition = errors.New("bad synthetic event definition")

// Type is the element type of a field.
type Type struct {
	Name   string // as written: "pid_t", "u32", "unsigned int", "char"
	Size   int    // bytes
	Signed bool
}

var types = map[string]Type{}

func init() {
	for _, t := range []Type{
		{"u8", 1, false}, {"u16", 2, false}, {"u32", 4, false}, {"u64", 8, false},
		{"s8", 1, true}, {"s16", 2, true}, {"s32", 4, true}, {"s64", 8, true},
		{"pid_t", 4, true}, {"int", 4, true}, {"unsigned int", 4, false},
		{"char", 1, true},
	} {
		types[t.Name] = t
	}
}

// Field is one field of a synthetic event.
type Field struct {
	Name string
	Type Type
	// Len is 0 for a scalar, N for a fixed array or char[N], and -1 for a
	// string (char[]).
	Len int
}

// IsString reports whether f is a char[] string.
func (f Field) IsString() bool { return f.Len < 0 }

// String returns the field in definition syntax.
func (f Field) String() string {
	switch {
	case f.Len < 0:
		return f.Type.Name + " " + f.Name + "[]"
	case f.Len > 0:
		return fmt.Sprintf("%s %s[%d]", f.Type.Name, f.Name, f.Len)
	}
	return f.Type.Name + " " + f.Name
}

// Event is a synthetic event definition. Build one with Create or Parse,
// or piecewise with New, AddField, AddFields and Finalize.
type Event struct {
	Name   string
	Fields []Field
	final  bool
	byName map[string]int
}

// New starts an empty definition (the kernel's synth_event_gen_cmd_start).
// It fails on a name that is not an identifier.
func New(name string) (*Event, error) {
	if !isIdent(name) {
		return nil, fmt.Errorf("%w: event name %q is not an identifier", ErrDefinition, name)
	}
	return &Event{Name: name, byName: map[string]int{}}, nil
}

// AddField adds one field given as "TYPE NAME", "TYPE NAME[N]" or
// "char NAME[]" / "char[] NAME". It fails on an unknown type, a bad or
// missing array size, a duplicate name, more than MaxFields fields, or
// after Finalize; the definition is then unchanged.
func (e *Event) AddField(decl string) error {
	if e.final {
		return fmt.Errorf("%w: %s: field %q added after finalize", ErrDefinition, e.Name, decl)
	}
	f, err := parseField(decl)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrDefinition, e.Name, err)
	}
	if _, dup := e.byName[f.Name]; dup {
		return fmt.Errorf("%w: %s: duplicate field name %q", ErrDefinition, e.Name, f.Name)
	}
	if len(e.Fields) >= MaxFields {
		return fmt.Errorf("%w: %s: too many fields (the limit is %d)", ErrDefinition, e.Name, MaxFields)
	}
	e.byName[f.Name] = len(e.Fields)
	e.Fields = append(e.Fields, f)
	return nil
}

// AddFields adds several fields in order; on error none is added.
func (e *Event) AddFields(decls ...string) error {
	n := len(e.Fields)
	for _, d := range decls {
		if err := e.AddField(d); err != nil {
			for _, f := range e.Fields[n:] {
				delete(e.byName, f.Name)
			}
			e.Fields = e.Fields[:n]
			return err
		}
	}
	return nil
}

// Finalize ends the definition (synth_event_gen_cmd_end). It fails on an
// event without fields.
func (e *Event) Finalize() error {
	if len(e.Fields) == 0 {
		return fmt.Errorf("%w: %s has no fields", ErrDefinition, e.Name)
	}
	e.final = true
	return nil
}

// Final reports whether the definition is finalized.
func (e *Event) Final() bool { return e.final }

// Create defines an event in one step from its name and fields
// (synth_event_create).
func Create(name string, decls ...string) (*Event, error) {
	e, err := New(name)
	if err != nil {
		return nil, err
	}
	if err := e.AddFields(decls...); err != nil {
		return nil, err
	}
	if err := e.Finalize(); err != nil {
		return nil, err
	}
	return e, nil
}

// Parse reads a definition in the kernel's synthetic_events syntax:
// "NAME TYPE FIELD; TYPE FIELD[N]; …".
func Parse(def string) (*Event, error) {
	def = strings.TrimSpace(def)
	name, rest, _ := strings.Cut(def, " ")
	var decls []string
	for _, d := range strings.Split(rest, ";") {
		if d = strings.TrimSpace(d); d != "" {
			decls = append(decls, d)
		}
	}
	return Create(name, decls...)
}

// String returns the definition in synthetic_events syntax.
func (e *Event) String() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.String()
	}
	return e.Name + " " + strings.Join(parts, "; ")
}

// Field returns the index of the named field, or -1.
func (e *Event) Field(name string) int {
	if i, ok := e.byName[name]; ok {
		return i
	}
	return -1
}

// RelayFields returns the fields as relayfmt declares them, in payload
// order.
func (e *Event) RelayFields() []relayfmt.Field {
	out := make([]relayfmt.Field, len(e.Fields))
	for i, f := range e.Fields {
		switch {
		case f.IsString():
			out[i] = relayfmt.StringField(f.Name)
		case f.Type.Name == "char":
			out[i] = relayfmt.CharArrayField(f.Name, f.Len)
		case f.Len > 0:
			out[i] = relayfmt.ArrayField(f.Name, intType(f.Type), f.Len)
		default:
			out[i] = relayfmt.ScalarField(f.Name, intType(f.Type))
		}
	}
	return out
}

// MaxPayload returns the largest payload the event can have.
func (e *Event) MaxPayload() int {
	n := 0
	for _, f := range e.Fields {
		switch {
		case f.IsString():
			n += MaxString + 1
		case f.Len > 0:
			n += f.Len * f.Type.Size
		default:
			n += f.Type.Size
		}
	}
	return n
}

func intType(t Type) relayfmt.IntType {
	switch {
	case t.Size == 1 && t.Signed:
		return relayfmt.S8
	case t.Size == 1:
		return relayfmt.U8
	case t.Size == 2 && t.Signed:
		return relayfmt.S16
	case t.Size == 2:
		return relayfmt.U16
	case t.Size == 4 && t.Signed:
		return relayfmt.S32
	case t.Size == 4:
		return relayfmt.U32
	case t.Signed:
		return relayfmt.S64
	}
	return relayfmt.U64
}

// parseField reads "TYPE NAME", "TYPE NAME[N]", "char NAME[]" or
// "char[] NAME".
func parseField(decl string) (Field, error) {
	d := strings.Join(strings.Fields(decl), " ")
	var f Field
	if rest, ok := strings.CutPrefix(d, "char[] "); ok {
		d = "char " + rest + "[]"
	}
	if i := strings.IndexByte(d, '['); i >= 0 {
		if !strings.HasSuffix(d, "]") {
			return f, fmt.Errorf("field %q: bad array specification", decl)
		}
		spec := strings.TrimSpace(d[i+1 : len(d)-1])
		d = strings.TrimSpace(d[:i])
		switch {
		case spec == "":
			f.Len = -1
		default:
			n, err := strconv.Atoi(spec)
			if err != nil || n <= 0 || n > MaxArray {
				return f, fmt.Errorf("field %q: array size %q must be 1..%d", decl, spec, MaxArray)
			}
			f.Len = n
		}
	}
	j := strings.LastIndexByte(d, ' ')
	if j < 0 {
		return f, fmt.Errorf("field %q: want TYPE NAME", decl)
	}
	tname, name := d[:j], d[j+1:]
	t, ok := types[tname]
	if !ok {
		return f, fmt.Errorf("field %q: unknown type %q (pid_t, u8..u64, s8..s64, int, unsigned int, char[N], char[])", decl, tname)
	}
	if !isIdent(name) {
		return f, fmt.Errorf("field %q: name %q is not an identifier", decl, name)
	}
	if t.Name == "char" && f.Len == 0 {
		return f, fmt.Errorf("field %q: char needs a size (char %s[N]) or [] for a string", decl, name)
	}
	if f.Len < 0 && t.Name != "char" {
		return f, fmt.Errorf("field %q: only char may be a [] string; give %s an array size", decl, name)
	}
	f.Name, f.Type = name, t
	return f, nil
}

// isIdent accepts names of at most 64 bytes, as the kernel's
// MAX_EVENT_NAME_LEN, that are relayfmt identifiers.
func isIdent(s string) bool { return len(s) <= 64 && relayfmt.IsIdent(s) }
