package synth

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/kconsume/kconsume/relayfmt"
)

// ErrValue is wrapped by every error about the values of an event being
// generated.
var ErrValue = errors.New("bad synthetic event value")

// Encode appends to dst the payload of one event with values in field
// order and returns it: the kernel's synth_event_trace, and with a slice,
// Encode(dst, vals...), its synth_event_trace_array. Integer fields take
// any Go integer (bool fields also true or false; char fields also a
// one-byte string); char[N] and char[] take a string, copied up to its
// first NUL: char[N] keeps N bytes, as a reader of the kernel's record
// sees through its format (size N), char[] MaxString; a stack takes a
// slice of at most MaxStack addresses (any integer type, kept as their
// 64 bits); an array a slice of exactly N integers. It fails on a wrong
// number of values, a wrong type, or a value out of range; dst is then
// returned unchanged.
func (e *Event) Encode(dst []byte, values ...any) ([]byte, error) {
	if !e.final {
		return dst, fmt.Errorf("%w: %s is not finalized", ErrValue, e.Name)
	}
	if len(values) != len(e.Fields) {
		return dst, fmt.Errorf("%w: %s takes %d values, got %d", ErrValue, e.Name, len(e.Fields), len(values))
	}
	out := dst
	for i, f := range e.Fields {
		var err error
		if out, err = appendValue(out, f, values[i]); err != nil {
			return dst, fmt.Errorf("%w: %s.%s: %w", ErrValue, e.Name, f.Name, err)
		}
	}
	return out, nil
}

// Trace returns the payload of one event with values in field order, as
// Encode(nil, values...).
func (e *Event) Trace(values ...any) ([]byte, error) { return e.Encode(nil, values...) }

// TraceArray is Trace with the values in a slice (synth_event_trace_array).
func (e *Event) TraceArray(values []any) ([]byte, error) { return e.Encode(nil, values...) }

// appendValue appends the encoding of v for field f to dst, or returns
// dst and an error when v does not fit f.
func appendValue(dst []byte, f Field, v any) ([]byte, error) {
	switch f.Kind {
	case Text, String:
		s, ok := v.(string)
		if !ok {
			return dst, fmt.Errorf("want a string for %s, got %T", f.Type, v)
		}
		if i := strings.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		}
		if f.Kind == String {
			if len(s) > MaxString {
				s = s[:MaxString]
			}
			return append(append(dst, s...), 0), nil
		}
		if len(s) > f.Len {
			s = s[:f.Len]
		}
		dst = append(dst, s...)
		return append(dst, make([]byte, f.Len-len(s))...), nil
	case Array, Stack:
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array {
			return dst, fmt.Errorf("want a slice of integers for %s, got %T", f.Type, v)
		}
		n := rv.Len()
		if f.Kind == Array && n != f.Len {
			return dst, fmt.Errorf("want %d integers, got %d", f.Len, n)
		}
		out := dst
		if f.Kind == Stack {
			if n > MaxStack {
				return dst, fmt.Errorf("%d addresses, at most %d", n, MaxStack)
			}
			out = binary.LittleEndian.AppendUint32(out, uint32(n))
		}
		for i := 0; i < n; i++ {
			var err error
			if f.Kind == Stack {
				out, err = appendAddr(out, rv.Index(i).Interface())
			} else {
				out, err = appendInt(out, f, rv.Index(i).Interface())
			}
			if err != nil {
				return dst, fmt.Errorf("element %d: %w", i, err)
			}
		}
		return out, nil
	}
	return appendInt(dst, f, v)
}

// appendAddr appends the 64 bits of the integer v.
func appendAddr(dst []byte, v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return binary.LittleEndian.AppendUint64(dst, uint64(rv.Int())), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return binary.LittleEndian.AppendUint64(dst, rv.Uint()), nil
	}
	return dst, fmt.Errorf("want an address (an integer), got %T", v)
}

// appendInt appends integer v as an element of f.
func appendInt(dst []byte, f Field, v any) ([]byte, error) {
	t := f.Elem
	rv := reflect.ValueOf(v)
	var u uint64
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		i := rv.Int()
		if !fitsSigned(i, t) {
			return dst, fmt.Errorf("%d does not fit %s", i, f.Type)
		}
		u = uint64(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		x := rv.Uint()
		if !fitsUnsigned(x, t) {
			return dst, fmt.Errorf("%d does not fit %s", x, f.Type)
		}
		u = x
	case reflect.Bool:
		if rv.Bool() {
			u = 1
		}
	case reflect.String:
		if s := rv.String(); t.Size() == 1 && len(s) == 1 {
			u = uint64(s[0])
			break
		}
		fallthrough
	default:
		return dst, fmt.Errorf("want an integer for %s, got %T", f.Type, v)
	}
	switch t.Size() {
	case 1:
		return append(dst, byte(u)), nil
	case 2:
		return binary.LittleEndian.AppendUint16(dst, uint16(u)), nil
	case 4:
		return binary.LittleEndian.AppendUint32(dst, uint32(u)), nil
	}
	return binary.LittleEndian.AppendUint64(dst, u), nil
}

func fitsSigned(i int64, t relayfmt.IntType) bool {
	bits := uint(t.Size() * 8)
	if t.Signed() {
		return bits == 64 || i >= -(1<<(bits-1)) && i < 1<<(bits-1)
	}
	return i >= 0 && (bits == 64 || i < 1<<bits)
}

func fitsUnsigned(x uint64, t relayfmt.IntType) bool {
	bits := uint(t.Size() * 8)
	if t.Signed() {
		return x <= uint64(math.MaxInt64)>>(64-bits)
	}
	return bits == 64 || x < 1<<bits
}

// ParseValue converts the text of a value, as given on a command line,
// for field f: an integer in any Go base prefix (a bool field also takes
// true or false, a char field one character), a string for char[N] and
// char[], comma-separated addresses for a stack (none for ""), and
// comma-separated integers for an array. It fails naming the field.
func ParseValue(f Field, s string) (any, error) {
	parse := func(s string) (any, error) {
		s = strings.TrimSpace(s)
		if f.Elem.Signed() {
			i, err := strconv.ParseInt(s, 0, f.Elem.Size()*8)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %q is not a %s", ErrValue, f.Name, s, f.Type)
			}
			return i, nil
		}
		u, err := strconv.ParseUint(s, 0, f.Elem.Size()*8)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %q is not a %s", ErrValue, f.Name, s, f.Type)
		}
		return u, nil
	}
	switch f.Kind {
	case Text, String:
		return s, nil
	case Int:
		switch {
		case f.Type == "bool" && (s == "true" || s == "false"):
			return s == "true", nil
		case (f.Type == "char" || f.Type == "unsigned char") && len(s) == 1 && (s[0] < '0' || s[0] > '9'):
			return s, nil
		}
		return parse(s)
	case Stack:
		if strings.TrimSpace(s) == "" {
			return []uint64{}, nil
		}
		parts := strings.Split(s, ",")
		if len(parts) > MaxStack {
			return nil, fmt.Errorf("%w: %s: %d addresses, at most %d", ErrValue, f.Name, len(parts), MaxStack)
		}
		out := make([]uint64, len(parts))
		for i, p := range parts {
			u, err := strconv.ParseUint(strings.TrimSpace(p), 0, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %q is not an address", ErrValue, f.Name, strings.TrimSpace(p))
			}
			out[i] = u
		}
		return out, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) != f.Len {
		return nil, fmt.Errorf("%w: %s: want %d comma-separated values, got %d", ErrValue, f.Name, f.Len, len(parts))
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		v, err := parse(p)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// Builder generates one event piecewise, as the kernel's
// synth_event_trace_start (Start), synth_event_add_next_val (Next) or
// synth_event_add_val (Set), and synth_event_trace_end (End): set the
// fields in order with Next, or by name with Set, never both in one
// event. End is always required, also
// after a failed set, and yields the payload only if every field was set
// and no set failed.
type Builder struct {
	e      *Event
	vals   []any
	set    []bool
	next   int
	byName bool
	byNext bool
	err    error
	ended  bool
}

// Start begins one event of e.
func (e *Event) Start() *Builder {
	return &Builder{e: e, vals: make([]any, len(e.Fields)), set: make([]bool, len(e.Fields))}
}

func (b *Builder) fail(err error) error {
	if b.err == nil {
		b.err = err
	}
	return err
}

// Next sets the next field in order (no lookup). It fails after End,
// after Set was used in this event, past the last field, or on a value of
// the wrong type; the event then fails at End.
func (b *Builder) Next(v any) error {
	switch {
	case b.ended:
		return fmt.Errorf("%w: %s: Next after End", ErrValue, b.e.Name)
	case b.byName:
		return b.fail(fmt.Errorf("%w: %s: Next mixed with Set in one event", ErrValue, b.e.Name))
	case b.next >= len(b.e.Fields):
		return b.fail(fmt.Errorf("%w: %s: Next past the last field", ErrValue, b.e.Name))
	}
	b.byNext = true
	return b.put(b.next, v)
}

// Set sets the named field (a lookup). It fails after End, after Next was
// used in this event, on an unknown field, on a field already set, or on a
// value of the wrong type; the event then fails at End.
func (b *Builder) Set(name string, v any) error {
	switch {
	case b.ended:
		return fmt.Errorf("%w: %s: Set after End", ErrValue, b.e.Name)
	case b.byNext:
		return b.fail(fmt.Errorf("%w: %s: Set mixed with Next in one event", ErrValue, b.e.Name))
	}
	b.byName = true
	i := b.e.Field(name)
	if i < 0 {
		return b.fail(fmt.Errorf("%w: %s has no field %q", ErrValue, b.e.Name, name))
	}
	if b.set[i] {
		return b.fail(fmt.Errorf("%w: %s.%s set twice", ErrValue, b.e.Name, name))
	}
	return b.put(i, v)
}

func (b *Builder) put(i int, v any) error {
	f := b.e.Fields[i]
	if _, err := appendValue(nil, f, v); err != nil {
		return b.fail(fmt.Errorf("%w: %s.%s: %w", ErrValue, b.e.Name, f.Name, err))
	}
	if s, ok := v.(string); ok {
		v = strings.Clone(s) // strings are copied at set time
	}
	b.vals[i], b.set[i] = v, true
	if i == b.next {
		b.next++
	}
	return nil
}

// End finishes the event and returns its payload appended to dst. It
// fails if a set failed, a field is unset (naming it), or End was already
// called; nothing is then to be emitted.
func (b *Builder) End(dst []byte) ([]byte, error) {
	if b.ended {
		return dst, fmt.Errorf("%w: %s: End called twice", ErrValue, b.e.Name)
	}
	b.ended = true
	if b.err != nil {
		return dst, fmt.Errorf("%s not emitted: %w", b.e.Name, b.err)
	}
	for i, ok := range b.set {
		if !ok {
			return dst, fmt.Errorf("%w: %s not emitted: field %s unset", ErrValue, b.e.Name, b.e.Fields[i].Name)
		}
	}
	return b.e.Encode(dst, b.vals...)
}
