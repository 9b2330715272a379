// Package synth defines synthetic events: user-defined typed events,
// written in the kernel's synthetic_events language
// (Documentation/trace/histogram.rst, kernel/trace/trace_events_synth.c)
// and generated from BPF or from user space into a kconsume trace.
//
// A definition is "NAME TYPE FIELD; TYPE FIELD[N]; …", read as the
// kernel's create_or_delete_synth_event reads it (see kernel.go): the
// integer types u8…u64, s8…s64, char, unsigned char, int, unsigned int,
// long, unsigned long, bool, pid_t and gfp_t; fixed text char[N] (N up to
// 256) and strings char[] in both spellings ("char[16] f", "char f[16]");
// stacks of addresses "unsigned long[] f". kconsume refuses what the
// kernel accepts but a trace cannot hold (two fields of one name, names
// longer than our format allows or not ASCII) and, beyond the kernel,
// accepts fixed-size integer arrays "u16 f[4]".
//
// The payload lays the fields out in order, byte-aligned, little-endian:
// integers at their size, char[N] as N bytes, a string NUL-terminated, a
// stack as a u32 count then that many 8-byte addresses. This is the
// layout relayfmt declares (RelayFields), so a payload is written as is.
package synth

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kconsume/kconsume/relayfmt"
)

// MaxFields is the most fields an event may have, as the kernel's
// SYNTH_FIELDS_MAX (kernel/trace/trace_synth.h).
const MaxFields = 64

// MaxArray bounds a fixed integer array (kconsume's extension), so an
// event always fits a trace record.
const MaxArray = 4096

// MaxText is the largest N of a char[N] field, the kernel's
// STR_VAR_LEN_MAX.
const MaxText = 256

// MaxString bounds a string value (STR_VAR_LEN_MAX in the kernel is 256;
// markers are allowed more).
const MaxString = 1024

// MaxStack is the most addresses a stack field holds.
const MaxStack = 64

// MaxEventName is the longest event name: the trace format allows 255
// bytes for "synthetic:NAME".
const MaxEventName = relayfmt.MaxNameLen - len("synthetic:")

// ErrDefinition is wrapped by every error about a malformed definition.
var ErrDefinition = errors.New("bad synthetic event definition")

// Kind says what a field holds.
type Kind uint8

// Field kinds.
const (
	// Int is one integer.
	Int Kind = iota + 1
	// Text is char[N]: N bytes of text, NUL-padded.
	Text
	// String is char[] (or char[0]): NUL-terminated text of any length.
	String
	// Stack is long[] or unsigned long[]: a list of addresses.
	Stack
	// Array is N integers, kconsume's extension ("u16 f[4]").
	Array
)

// Field is one field of a synthetic event, as the kernel describes it in
// synthetic_events and in the event's format file.
type Field struct {
	Name string
	// Type is the type as the kernel lists it: the type words with the
	// array suffix moved onto them ("u64", "unsigned int", "char[16]",
	// "char[]", "unsigned long[]"; "u16[4]" for an extension array).
	Type string
	Kind Kind
	// Size is the kernel's size of the field: an integer's size, N for
	// char[N], 8 for a string or a stack (the kernel's __data_loc word);
	// for an Array, N times the element's size.
	Size int
	// Signed is the kernel's signedness in the event's format: all but
	// u* types and gfp_t, and every string and stack (the kernel judges
	// those by their "__data_loc" type). Elem says how values read.
	Signed bool
	// Len is N for Text and Array, else 0.
	Len int
	// Elem is the integer type of an Int, an Array's or a Stack's
	// elements.
	Elem relayfmt.IntType
}

// IsString reports whether f is a char[] string.
func (f Field) IsString() bool { return f.Kind == String }

// String returns the field as the kernel lists it: "TYPE NAME".
func (f Field) String() string { return f.Type + " " + f.Name }

// lengthName is the name of the count field a stack field f has in the
// trace, as lttng-modules names a sequence's length.
func lengthName(f string) string { return "_" + f + "_length" }

// Event is a synthetic event definition. Build one with Create, Parse or
// CreateFields, or piecewise with New, AddField, AddFields and Finalize.
type Event struct {
	Name   string
	Fields []Field
	final  bool
	byName map[string]int
}

// FieldDesc is one field given as a type and a name, as the kernel's
// struct synth_field_desc: {"char[16]", "next_comm_field"},
// {"unsigned long[]", "stack"}, {"u64", "ts"}.
type FieldDesc struct {
	Type string
	Name string
}

// New starts an empty definition (the kernel's synth_event_gen_cmd_start).
// It fails on a name the kernel refuses or our format cannot hold.
func New(name string) (*Event, error) {
	if err := checkEventName(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDefinition, err)
	}
	return &Event{Name: name, byName: map[string]int{}}, nil
}

// AddField adds one field given as the kernel reads one: "TYPE NAME",
// "TYPE NAME[N]", "TYPE[N] NAME", "unsigned TYPE NAME". It fails, naming
// the field and the reason, on what the kernel refuses, on a name used
// twice, on more than MaxFields fields, or after Finalize; the definition
// is then unchanged.
func (e *Event) AddField(decl string) error {
	if e.final {
		return fmt.Errorf("%w: %s: field %q added after finalize", ErrDefinition, e.Name, decl)
	}
	if strings.ContainsAny(decl, ";#\n\x00") {
		return fmt.Errorf("%w: %s: field %q: one field, without ';', '#', newline or NUL", ErrDefinition, e.Name, decl)
	}
	argv := splitArgs(decl)
	if len(argv) == 0 {
		return fmt.Errorf("%w: %s: empty field", ErrDefinition, e.Name)
	}
	f, n, err := parseField(argv, true)
	if err == nil && n < len(argv) {
		err = fmt.Errorf("field %q: %q after the field name (one field per call)", decl, strings.Join(argv[n:], " "))
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrDefinition, e.Name, err)
	}
	if err := e.add(f); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrDefinition, e.Name, err)
	}
	return nil
}

// AddFieldDesc adds one field given as a type and a name
// (synth_event_add_field); it fails as AddField.
func (e *Event) AddFieldDesc(d FieldDesc) error {
	if strings.TrimSpace(d.Type) == "" || strings.TrimSpace(d.Name) == "" {
		return fmt.Errorf("%w: %s: field {%q, %q}: want a type and a name", ErrDefinition, e.Name, d.Type, d.Name)
	}
	return e.AddField(d.Type + " " + d.Name)
}

// add appends f unless its name is taken or the event is full.
func (e *Event) add(f Field) error {
	if err := e.checkName(f); err != nil {
		return err
	}
	if len(e.Fields) >= MaxFields {
		return fmt.Errorf("field %s: too many fields (the kernel's limit is %d)", f.Name, MaxFields)
	}
	if e.byName == nil {
		e.byName = map[string]int{}
	}
	e.byName[f.Name] = len(e.Fields)
	if f.Kind == Stack {
		e.byName[lengthName(f.Name)] = -1
	}
	e.Fields = append(e.Fields, f)
	return nil
}

// checkName refuses a field name the trace cannot hold: one used twice
// (the kernel allows it), or the count field of a stack.
func (e *Event) checkName(f Field) error {
	if i, dup := e.byName[f.Name]; dup {
		if i < 0 {
			return fmt.Errorf("field %s: the name of a stack field's count in the trace (kconsume refuses it; the kernel allows it)", f.Name)
		}
		return fmt.Errorf("field %s: duplicate field name (kconsume refuses it; the kernel allows it)", f.Name)
	}
	if f.Kind == Stack {
		if _, dup := e.byName[lengthName(f.Name)]; dup {
			return fmt.Errorf("field %s: its count is recorded as %s, which is taken", f.Name, lengthName(f.Name))
		}
	}
	return nil
}

// AddFields adds several fields in order; on error none is added.
func (e *Event) AddFields(decls ...string) error {
	n := len(e.Fields)
	for _, d := range decls {
		if err := e.AddField(d); err != nil {
			e.truncate(n)
			return err
		}
	}
	return nil
}

// truncate drops the fields from index n on.
func (e *Event) truncate(n int) {
	for _, f := range e.Fields[n:] {
		delete(e.byName, f.Name)
		if f.Kind == Stack {
			delete(e.byName, lengthName(f.Name))
		}
	}
	e.Fields = e.Fields[:n]
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

// Create defines an event in one step from its name and fields, each as
// AddField takes it.
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

// CreateFields defines an event in one step from its name and a list of
// {Type, Name} fields, as the kernel's synth_event_create. It fails as
// AddField, naming the field.
func CreateFields(name string, fields []FieldDesc) (*Event, error) {
	e, err := New(name)
	if err != nil {
		return nil, err
	}
	for _, d := range fields {
		if err := e.AddFieldDesc(d); err != nil {
			return nil, err
		}
	}
	if err := e.Finalize(); err != nil {
		return nil, err
	}
	return e, nil
}

// Parse reads one definition as the kernel's synthetic_events reads a
// line: "NAME TYPE FIELD; TYPE FIELD[N]; …", with the kernel's spaces,
// stray semicolons, fields without semicolons between them and trailing
// "# comment". It fails, naming the field and the reason, on what the
// kernel refuses (except fixed integer arrays, kconsume's extension) and
// on what the kernel accepts but a trace cannot hold: two fields of one
// name, an event name over MaxEventName bytes, a name that is not ASCII.
func Parse(def string) (*Event, error) {
	e, err := parse(def, true)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDefinition, err)
	}
	return e, nil
}

// String returns the definition in the kernel's listing form, which
// Parse reads back: "NAME TYPE FIELD; TYPE FIELD".
func (e *Event) String() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.String()
	}
	return e.Name + " " + strings.Join(parts, "; ")
}

// Listing returns the line the kernel's synthetic_events shows for the
// event (__synth_event_show): the name, a tab, the fields.
func (e *Event) Listing() string {
	return strings.Replace(e.String(), " ", "\t", 1)
}

// Field returns the index of the named field, or -1.
func (e *Event) Field(name string) int {
	if i, ok := e.byName[name]; ok {
		return i
	}
	return -1
}

// RelayFields returns the fields as relayfmt declares them, in payload
// order; a stack field is preceded by its count, named as lengthName.
func (e *Event) RelayFields() []relayfmt.Field {
	out := make([]relayfmt.Field, 0, len(e.Fields))
	for _, f := range e.Fields {
		switch f.Kind {
		case String:
			out = append(out, relayfmt.StringField(f.Name))
		case Text:
			out = append(out, relayfmt.CharArrayField(f.Name, f.Len))
		case Array:
			out = append(out, relayfmt.ArrayField(f.Name, f.Elem, f.Len))
		case Stack:
			out = append(out, relayfmt.ScalarField(lengthName(f.Name), relayfmt.U32),
				relayfmt.SequenceField(f.Name, f.Elem, lengthName(f.Name)))
		default:
			out = append(out, relayfmt.ScalarField(f.Name, f.Elem))
		}
	}
	return out
}

// MaxPayload returns the largest payload the event can have.
func (e *Event) MaxPayload() int {
	n := 0
	for _, f := range e.Fields {
		switch f.Kind {
		case String:
			n += MaxString + 1
		case Text:
			n += f.Len
		case Array:
			n += f.Len * f.Elem.Size()
		case Stack:
			n += 4 + MaxStack*8
		default:
			n += f.Elem.Size()
		}
	}
	return n
}

// intType returns the relayfmt type of an integer of size bytes.
func intType(size int, signed bool) relayfmt.IntType {
	switch {
	case size == 1 && signed:
		return relayfmt.S8
	case size == 1:
		return relayfmt.U8
	case size == 2 && signed:
		return relayfmt.S16
	case size == 2:
		return relayfmt.U16
	case size == 4 && signed:
		return relayfmt.S32
	case size == 4:
		return relayfmt.U32
	case signed:
		return relayfmt.S64
	}
	return relayfmt.U64
}
