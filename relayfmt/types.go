package relayfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// IntType is the type of an integer field or of the elements of an array
// or sequence. All integers are little-endian and byte-aligned.
type IntType uint8

// Integer types. PidT and Int are s32 and UInt is u32, as in the kernel's
// synthetic_events types.
const (
	U8 IntType = iota + 1
	U16
	U32
	U64
	S8
	S16
	S32
	S64

	PidT = S32
	Int  = S32
	UInt = U32
)

// Size returns the size in bytes of t, or 0 if t is not a valid type.
func (t IntType) Size() int {
	switch t {
	case U8, S8:
		return 1
	case U16, S16:
		return 2
	case U32, S32:
		return 4
	case U64, S64:
		return 8
	}
	return 0
}

// Signed reports whether t is a signed type.
func (t IntType) Signed() bool { return t >= S8 && t <= S64 }

// String returns the type's short name (u8 … s64).
func (t IntType) String() string {
	if t.Size() == 0 {
		return fmt.Sprintf("IntType(%d)", uint8(t))
	}
	s := "u"
	if t.Signed() {
		s = "s"
	}
	return fmt.Sprintf("%s%d", s, t.Size()*8)
}

// Kind says how a field is laid out in the payload.
type Kind uint8

// Field kinds.
const (
	// Scalar is one integer of type Elem.
	Scalar Kind = iota + 1
	// Array is Len integers of type Elem. With Text set (Elem U8) it is
	// char[Len]: text padded with NUL bytes.
	Array
	// String is NUL-terminated text.
	String
	// Sequence is a count of elements of type Elem, the count taken from
	// the earlier unsigned integer field named LengthField. With Text set
	// (Elem U8) it is text of that many bytes.
	Sequence
)

// Field is one field of an event's payload.
type Field struct {
	Name        string
	Kind        Kind
	Elem        IntType // Scalar, Array and Sequence
	Len         int     // Array: number of elements
	LengthField string  // Sequence: name of the length field
	Text        bool    // Array and Sequence of U8: the bytes are text
	Hex         bool    // integers shown in base 16 (addresses)
	// Context marks a field of the event's own context (CTF's event
	// context scope, which comes before the payload): an event's
	// context fields come first, and their names may repeat the
	// payload's.
	Context bool
}

// Limits on event classes, so a reader's memory is bounded by metadata.
const (
	MaxFields   = 256
	MaxArrayLen = 1 << 20
	MaxNameLen  = 255
	// MaxEventID is the largest event id; ids are dense from 0.
	MaxEventID = 1<<16 - 1
)

// EventClass describes one kind of event: its id in the stream, its name
// and its payload fields in order.
type EventClass struct {
	ID     uint32
	Name   string
	Fields []Field
	// Context is how many of Fields, the first ones, are the event's
	// context (Field.Context).
	Context int

	// fixed is the payload size when every field has a fixed size, or -1.
	fixed int
	// lenSlot[i] is, for a Sequence, the slot holding its count; for a
	// field other sequences use as their length, the slot it fills; else -1.
	lenSlot []int
	nslots  int
	// fsize[i] is field i's size when it is fixed and fills no length
	// slot, or -1.
	fsize []int
	// offs is, for a class of fixed size, where each field begins and
	// the payload ends.
	offs []uint32
}

// maxStackSlots length fields are tracked without allocating.
const maxStackSlots = 16

// Scalar, Array and other constructors keep field lists short to write.

// ScalarField returns a field holding one integer of type t.
func ScalarField(name string, t IntType) Field { return Field{Name: name, Kind: Scalar, Elem: t} }

// ArrayField returns a field holding n integers of type t.
func ArrayField(name string, t IntType, n int) Field {
	return Field{Name: name, Kind: Array, Elem: t, Len: n}
}

// CharArrayField returns a char[n] text field.
func CharArrayField(name string, n int) Field {
	return Field{Name: name, Kind: Array, Elem: U8, Len: n, Text: true}
}

// StringField returns a NUL-terminated string field.
func StringField(name string) Field { return Field{Name: name, Kind: String} }

// SequenceField returns a field of elements of type t whose count is the
// value of the earlier field lengthField.
func SequenceField(name string, t IntType, lengthField string) Field {
	return Field{Name: name, Kind: Sequence, Elem: t, LengthField: lengthField}
}

// NewEventClass checks fields and returns an event class. It fails when a
// name is not an identifier, a field name repeats, a type or size is out of
// range, or a sequence's length field is not an earlier unsigned integer.
func NewEventClass(id uint32, name string, fields []Field) (*EventClass, error) {
	if err := checkEventName(name); err != nil {
		return nil, err
	}
	if id > MaxEventID {
		return nil, fmt.Errorf("event %q: id %d over the limit %d", name, id, MaxEventID)
	}
	if len(fields) > MaxFields {
		return nil, fmt.Errorf("event %q: %d fields, the limit is %d", name, len(fields), MaxFields)
	}
	c := &EventClass{ID: id, Name: name, Fields: append([]Field(nil), fields...), lenSlot: make([]int, len(fields))}
	for c.Context < len(fields) && fields[c.Context].Context {
		c.Context++
	}
	seen := make(map[string]int, len(fields))
	for i, f := range c.Fields {
		if i == c.Context {
			// The payload is a scope of its own.
			seen = make(map[string]int, len(fields)-i)
		}
		if f.Context && i >= c.Context {
			return nil, fmt.Errorf("event %q: context field %q after the payload's first field", name, f.Name)
		}
		if err := c.addField(i, f, seen); err != nil {
			return nil, err
		}
	}
	// A field of fixed size that no sequence takes its length from is
	// sized without a call: most fields of most events.
	c.fsize = make([]int, len(c.Fields))
	for i, f := range c.Fields {
		c.fsize[i] = -1
		switch {
		case f.Kind == Scalar && c.lenSlot[i] < 0:
			c.fsize[i] = f.Elem.Size()
		case f.Kind == Array:
			c.fsize[i] = f.Len * f.Elem.Size()
		}
	}
	if c.fixed >= 0 {
		c.offs = make([]uint32, len(c.Fields)+1)
		for i, n := range c.fsize {
			c.offs[i+1] = c.offs[i] + uint32(n)
		}
	}
	return c, nil
}

// addField checks f, the field at index i of c, against the fields before
// it (seen maps their names to their indexes) and adds it to c's layout:
// its fixed size, or the slot of the sequence length it gives or takes.
// It fails, saying why, for a name that is not an identifier or repeats,
// a bad element type, length or kind, or a sequence whose length field
// is not an earlier unsigned scalar.
func (c *EventClass) addField(i int, f Field, seen map[string]int) error {
	c.lenSlot[i] = -1
	if !IsIdent(f.Name) {
		return fmt.Errorf("event %q: field name %q is not an identifier ([A-Za-z_][A-Za-z0-9_]*, at most %d bytes)", c.Name, f.Name, MaxNameLen)
	}
	if _, dup := seen[f.Name]; dup {
		return fmt.Errorf("event %q: duplicate field name %q", c.Name, f.Name)
	}
	seen[f.Name] = i
	if f.Kind != String && f.Elem.Size() == 0 {
		return fmt.Errorf("event %q: field %q: invalid integer type %d", c.Name, f.Name, f.Elem)
	}
	if f.Text && f.Elem != U8 {
		return fmt.Errorf("event %q: field %q: text needs u8 elements, not %v", c.Name, f.Name, f.Elem)
	}
	switch f.Kind {
	case Scalar:
		if f.Text {
			return fmt.Errorf("event %q: field %q: a scalar cannot be text", c.Name, f.Name)
		}
		c.addFixed(f.Elem.Size())
	case Array:
		if f.Len < 1 || f.Len > MaxArrayLen {
			return fmt.Errorf("event %q: field %q: array length %d out of range 1..%d", c.Name, f.Name, f.Len, MaxArrayLen)
		}
		c.addFixed(f.Len * f.Elem.Size())
	case String:
		if f.Elem != 0 || f.Text {
			return fmt.Errorf("event %q: field %q: a string has no element type", c.Name, f.Name)
		}
		c.fixed = -1
	case Sequence:
		j, ok := seen[f.LengthField]
		if !ok || j == i {
			return fmt.Errorf("event %q: field %q: length field %q is not an earlier field", c.Name, f.Name, f.LengthField)
		}
		if lf := c.Fields[j]; lf.Kind != Scalar || lf.Elem.Signed() {
			return fmt.Errorf("event %q: field %q: length field %q must be an unsigned scalar", c.Name, f.Name, f.LengthField)
		}
		if c.lenSlot[j] < 0 {
			c.lenSlot[j] = c.nslots
			c.nslots++
		}
		c.lenSlot[i] = c.lenSlot[j]
		c.fixed = -1
	default:
		return fmt.Errorf("event %q: field %q: unknown kind %d", c.Name, f.Name, f.Kind)
	}
	return nil
}

func (c *EventClass) addFixed(n int) {
	if c.fixed >= 0 {
		c.fixed += n
	}
}

// FixedSize returns the payload size if every field has a fixed size, and
// false otherwise.
func (c *EventClass) FixedSize() (int, bool) { return c.fixed, c.fixed >= 0 }

var errShort = errors.New("truncated")

// PayloadSize returns how many bytes of b the payload of one event of
// class c takes. It fails if b is too short or a string is unterminated.
func (c *EventClass) PayloadSize(b []byte) (int, error) {
	_, n, err := c.layout(b, nil)
	return n, err
}

// layout returns where each field of the payload at the start of b
// begins, then where the payload ends (len(c.Fields)+1 offsets), and the
// payload's size. The offsets are the class's own for a class of fixed
// size, else written to buf, which must hold len(c.Fields)+1; with a nil
// buf only the size is found. It fails as PayloadSize does. A reader that
// lays an event out once decodes it with values, without a second walk
// over its fields.
func (c *EventClass) layout(b []byte, buf []uint32) (offs []uint32, size int, err error) {
	if c.fixed >= 0 {
		if len(c.offs) != len(c.Fields)+1 {
			return nil, 0, fmt.Errorf("event %q: class not made by NewEventClass", c.Name)
		}
		if len(b) < c.fixed {
			return nil, 0, fmt.Errorf("event %q: payload of %d bytes, need %d: %w", c.Name, len(b), c.fixed, errShort)
		}
		return c.offs, c.fixed, nil
	}
	if buf != nil {
		if len(buf) < len(c.Fields)+1 {
			return nil, 0, fmt.Errorf("event %q: room for %d offsets, %d fields", c.Name, len(buf), len(c.Fields))
		}
		offs = buf[:len(c.Fields)+1]
	}
	size, err = c.walk(b, offs)
	return offs, size, err
}

// walk goes over the fields of the payload at the start of b, noting in
// offs, unless it is nil, where each begins and where the last ends, and
// returns the payload's size.
func (c *EventClass) walk(b []byte, offs []uint32) (int, error) {
	var stack [maxStackSlots]uint64
	slots := stack[:]
	if c.nslots > maxStackSlots {
		slots = make([]uint64, c.nslots)
	}
	if len(c.fsize) != len(c.Fields) || len(c.lenSlot) != len(c.Fields) {
		return 0, fmt.Errorf("event %q: class not made by NewEventClass", c.Name)
	}
	off := 0
	for i := range c.Fields {
		n := c.fsize[i]
		if n < 0 || len(b)-off < n {
			var err error
			if n, err = c.fieldSize(i, b[off:], slots); err != nil {
				return 0, err
			}
		}
		if offs != nil {
			offs[i] = uint32(off)
		}
		off += n
	}
	if offs != nil {
		offs[len(c.Fields)] = uint32(off)
	}
	return off, nil
}

// fieldSize returns the size of field i at the start of b. A length field
// stores its value in slots for the sequences after it.
func (c *EventClass) fieldSize(i int, b []byte, slots []uint64) (int, error) {
	f := &c.Fields[i]
	var n int
	switch f.Kind {
	case Scalar:
		n = f.Elem.Size()
	case Array:
		n = f.Len * f.Elem.Size()
	case String:
		z := bytes.IndexByte(b, 0)
		if z < 0 {
			return 0, fmt.Errorf("event %q: field %q: unterminated string: %w", c.Name, f.Name, errShort)
		}
		return z + 1, nil
	case Sequence:
		cnt := slots[c.lenSlot[i]]
		if cnt > uint64(len(b)) { // every element is at least one byte
			return 0, fmt.Errorf("event %q: field %q: %d elements do not fit in %d bytes: %w", c.Name, f.Name, cnt, len(b), errShort)
		}
		n = int(cnt) * f.Elem.Size()
	}
	if len(b) < n {
		return 0, fmt.Errorf("event %q: field %q: needs %d bytes, %d left: %w", c.Name, f.Name, n, len(b), errShort)
	}
	if f.Kind == Scalar && c.lenSlot[i] >= 0 {
		slots[c.lenSlot[i]] = readUint(b, n)
	}
	return n, nil
}

// Value is one decoded field of an event. Its bytes alias the packet
// buffer and are valid until the reader moves on.
type Value struct {
	Field *Field
	raw   []byte
}

// Decode appends one Value per field of the payload to dst and returns it.
// It fails if the payload is short or malformed; it never reads past b.
func (c *EventClass) Decode(b []byte, dst []Value) ([]Value, error) {
	var stack [64]uint32
	buf := stack[:]
	if len(c.Fields)+1 > len(stack) {
		buf = make([]uint32, len(c.Fields)+1)
	}
	offs, _, err := c.layout(b, buf)
	if err != nil {
		return dst, err
	}
	return c.values(b, offs, dst), nil
}

// values appends the Values of the payload b laid out by layout in offs.
func (c *EventClass) values(b []byte, offs []uint32, dst []Value) []Value {
	fields := c.Fields
	offs = offs[:len(fields)+1]
	n := len(dst)
	dst = slices.Grow(dst, len(fields))[:n+len(fields)]
	out := dst[n:]
	for i := range fields {
		f := &fields[i]
		end := offs[i+1]
		if f.Kind == String {
			end-- // the NUL
		}
		out[i] = Value{Field: f, raw: b[offs[i]:end]}
	}
	return dst
}

// Len returns the number of elements of an array or sequence, the length
// of a string, and 1 for a scalar.
func (v Value) Len() int {
	switch v.Field.Kind {
	case Scalar:
		return 1
	case String:
		return len(v.raw)
	}
	return len(v.raw) / v.Field.Elem.Size()
}

// Uint returns element i (0 for a scalar) as an unsigned integer, or 0
// for a string field. Like a slice, it panics if i is out of range.
func (v Value) Uint(i int) uint64 {
	sz := v.Field.Elem.Size()
	if sz == 0 {
		return 0
	}
	return readUint(v.raw[i*sz:(i+1)*sz], sz)
}

// Int returns element i (0 for a scalar) sign-extended per its type, or 0
// for a string field. Like a slice, it panics if i is out of range.
func (v Value) Int(i int) int64 {
	sz := v.Field.Elem.Size()
	if sz == 0 {
		return 0
	}
	u := readUint(v.raw[i*sz:(i+1)*sz], sz)
	if !v.Field.Elem.Signed() {
		return int64(u)
	}
	shift := 64 - 8*uint(sz)
	return int64(u<<shift) >> shift
}

// Text returns a string field's bytes, or a text array's or sequence's
// bytes up to the first NUL.
func (v Value) Text() []byte {
	if i := bytes.IndexByte(v.raw, 0); i >= 0 {
		return v.raw[:i]
	}
	return v.raw
}

// Raw returns the field's bytes as stored (a string without its NUL).
func (v Value) Raw() []byte { return v.raw }

func readUint(b []byte, size int) uint64 {
	switch size {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	default:
		return binary.LittleEndian.Uint64(b)
	}
}

// IsIdent reports whether s can name a field or clock:
// [A-Za-z_][A-Za-z0-9_]*, at most MaxNameLen bytes.
func IsIdent(s string) bool {
	if s == "" || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '_', ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z':
		case ch >= '0' && ch <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// checkEventName accepts printable ASCII names without quotes or
// backslashes ("sched_switch", "syscalls:sys_enter_getpid").
func checkEventName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("event name %q: must be 1..%d bytes", name, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if ch := name[i]; ch <= ' ' || ch > '~' || ch == '"' || ch == '\\' {
			return fmt.Errorf("event name %q: byte %d (%q) not allowed: printable ASCII without space, quote or backslash", name, i, ch)
		}
	}
	return nil
}
