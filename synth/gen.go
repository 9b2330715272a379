package synth

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
)

// ErrValue is wrapped by every error about the values of an event being
// generated.
var ErrValue = errors.New("bad synthetic event value")

// Encode appends to dst the payload of one event with values in field
// order (the kernel's synth_event_trace) and returns it. Integers take
// any Go integer; char[N] and char[] take a string (copied; char[N]
// truncates to N-1 bytes plus NUL, char[] to MaxString); arrays take a
// slice of integers of exactly N elements. It fails on a wrong number of
// values, a wrong type, or a value out of range; dst is then returned
// unchanged.
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

// appendValue appends the encoding of v for field f to dst, or returns
// dst and an error when v does not fit f.
func appendValue(dst []byte, f Field, v any) ([]byte, error) {
	if f.Type.Name == "char" {
		s, ok := v.(string)
		if !ok {
			return dst, fmt.Errorf("want a string, got %T", v)
		}
		if f.IsString() {
			if len(s) > MaxString {
				s = s[:MaxString]
			}
			if i := strings.IndexByte(s, 0); i >= 0 {
				s = s[:i]
			}
			return append(append(dst, s...), 0), nil
		}
		b := make([]byte, f.Len)
		copy(b[:f.Len-1], s)
		return append(dst, b...), nil
	}
	if f.Len > 0 {
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array {
			return dst, fmt.Errorf("want %d integers, got %T", f.Len, v)
		}
		if rv.Len() != f.Len {
			return dst, fmt.Errorf("want %d integers, got %d", f.Len, rv.Len())
		}
		out := dst
		for i := 0; i < f.Len; i++ {
			var err error
			if out, err = appendInt(out, f.Type, rv.Index(i).Interface()); err != nil {
				return dst, fmt.Errorf("element %d: %w", i, err)
			}
		}
		return out, nil
	}
	return appendInt(dst, f.Type, v)
}

func appendInt(dst []byte, t Type, v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	var u uint64
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		i := rv.Int()
		if !fitsSigned(i, t) {
			return dst, fmt.Errorf("%d does not fit %s", i, t.Name)
		}
		u = uint64(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		x := rv.Uint()
		if !fitsUnsigned(x, t) {
			return dst, fmt.Errorf("%d does not fit %s", x, t.Name)
		}
		u = x
	default:
		return dst, fmt.Errorf("want an integer for %s, got %T", t.Name, v)
	}
	switch t.Size {
	case 1:
		return append(dst, byte(u)), nil
	case 2:
		return binary.LittleEndian.AppendUint16(dst, uint16(u)), nil
	case 4:
		return binary.LittleEndian.AppendUint32(dst, uint32(u)), nil
	}
	return binary.LittleEndian.AppendUint64(dst, u), nil
}

func fitsSigned(i int64, t Type) bool {
	bits := uint(t.Size * 8)
	if t.Signed {
		return bits == 64 || i >= -(1<<(bits-1)) && i < 1<<(bits-1)
	}
	return i >= 0 && (bits == 64 || i < 1<<bits)
}

func fitsUnsigned(x uint64, t Type) bool {
	bits := uint(t.Size * 8)
	if t.Signed {
		return x <= uint64(math.MaxInt64)>>(64-bits)
	}
	return bits == 64 || x < 1<<bits
}

// ParseValue converts the text of a value, as given on a command line,
// for field f: an integer in any Go base prefix, a string for char
// fields, or comma-separated integers for an array.
func ParseValue(f Field, s string) (any, error) {
	if f.Type.Name == "char" {
		return s, nil
	}
	parse := func(s string) (any, error) {
		s = strings.TrimSpace(s)
		if f.Type.Signed {
			i, err := strconv.ParseInt(s, 0, f.Type.Size*8)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %q is not a %s", ErrValue, f.Name, s, f.Type.Name)
			}
			return i, nil
		}
		u, err := strconv.ParseUint(s, 0, f.Type.Size*8)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %q is not a %s", ErrValue, f.Name, s, f.Type.Name)
		}
		return u, nil
	}
	if f.Len == 0 {
		return parse(s)
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
// synth_event_trace_start, synth_event_add_next_val or synth_event_add_val,
// and synth_event_trace_end: set the fields in order with Next, or by
// name with Set, never both in one event. End is always required, also
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
