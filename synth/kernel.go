package synth

import (
	"fmt"
	"strings"
)

// This file reads definitions as the kernel's synthetic_events does
// (kernel/trace/trace_events_synth.c: create_or_delete_synth_event,
// check_command, __create_synth_event, parse_synth_field,
// synth_field_size; trace_parse_run_command in trace.c for lines and
// comments). parse with ext false is the kernel's language exactly, so
// the vmtest differential test can hold it against a real kernel; with
// ext true it is kconsume's: integer arrays added, and what a trace
// cannot hold refused.

// maxLine is the longest line the kernel takes in one write, newline
// excluded: trace_parse_run_command's WRITE_BUFSIZE less '\n' and NUL.
const maxLine = 4096 - 2

// scalarSizes are the kernel's integer types and sizes on a 64-bit
// kernel (synth_field_size).
var scalarSizes = map[string]int{
	"s64": 8, "u64": 8, "s32": 4, "u32": 4, "s16": 2, "u16": 2, "s8": 1, "u8": 1,
	"char": 1, "unsigned char": 1, "int": 4, "unsigned int": 4,
	"long": 8, "unsigned long": 8, "bool": 1, "pid_t": 4, "gfp_t": 4,
}

const knownTypes = "u8..u64, s8..s64, char, unsigned char, int, unsigned int, long, unsigned long, bool, pid_t, gfp_t, char[N], char[], unsigned long[]"

// parse reads one definition line; ext selects kconsume's language over
// the kernel's. Errors name the event and field and give the reason.
func parse(def string, ext bool) (*Event, error) {
	def = strings.TrimSuffix(def, "\n") // the line's end, as written
	switch {
	case strings.IndexByte(def, '\n') >= 0:
		return nil, fmt.Errorf("%q: one definition per line", def)
	case strings.IndexByte(def, 0) >= 0:
		return nil, fmt.Errorf("%q: NUL byte in the definition", def)
	case len(def) > maxLine:
		return nil, fmt.Errorf("definition of %d bytes: the kernel takes lines of at most %d", len(def), maxLine)
	}
	if i := strings.IndexByte(def, '#'); i >= 0 {
		def = def[:i]
	}
	s := skipSpaces(def)
	if s == "" {
		return nil, fmt.Errorf("empty definition (the kernel creates nothing)")
	}
	if s[0] == '!' {
		return nil, fmt.Errorf("%q: '!NAME' deletes an event, it defines none", s)
	}
	first, _, _ := strings.Cut(s, ";")
	p := strings.IndexAny(s, " \t")
	if len(splitArgs(first)) < 3 || p < 0 {
		return nil, fmt.Errorf("%q: want NAME TYPE FIELD[; TYPE FIELD]... with a field before the first ';'", strings.TrimSpace(s))
	}
	name, fields := s[:p], skipSpaces(s[p:])
	if !isGoodName(name) {
		return nil, fmt.Errorf("event name %q: illegal name (a letter or _, then letters, digits or _)", name)
	}
	if ext {
		if err := checkEventName(name); err != nil {
			return nil, err
		}
	}
	e := &Event{Name: name, byName: map[string]int{}}
	for _, seg := range strings.Split(fields, ";") {
		argv := splitArgs(seg)
		for c := 0; c < len(argv); {
			f, n, err := parseField(argv[c:], ext)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			c += n
			if len(e.Fields) == MaxFields {
				return nil, fmt.Errorf("%s: field %s: too many fields (the kernel's limit is %d)", name, f.Name, MaxFields)
			}
			if !ext {
				e.Fields = append(e.Fields, f)
				continue
			}
			if err := e.add(f); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	e.final = true
	return e, nil
}

// parseField reads the field at the start of argv, as parse_synth_field:
// "TYPE NAME" or "unsigned TYPE NAME", an array suffix of NAME moved onto
// TYPE. It returns the field and the words it took.
func parseField(argv []string, ext bool) (Field, int, error) {
	var f Field
	prefix, typ, fname, n := "", argv[0], "", 2
	if typ == "unsigned" {
		if len(argv) < 3 {
			return f, 0, fmt.Errorf("field %q: incomplete type, want unsigned TYPE NAME", strings.Join(argv, " "))
		}
		prefix, typ, fname, n = "unsigned ", argv[1], argv[2], 3
	} else if len(argv) < 2 {
		return f, 0, fmt.Errorf("type %q has no field name", typ)
	} else {
		fname = argv[1]
	}
	name, array := fname, ""
	if i := strings.IndexByte(fname, '['); i >= 0 {
		name, array = fname[:i], fname[i:]
	}
	if !isGoodName(name) {
		return f, 0, fmt.Errorf("field %q: illegal name (a letter or _, then letters, digits or _)", name)
	}
	t := prefix + typ + array
	f = Field{Name: name, Type: t, Signed: signedType(t)}
	size, err := kernelSize(t)
	if err != nil {
		return f, 0, fmt.Errorf("field %s: type %s: %w", name, t, err)
	}
	isString, isStack := strings.Contains(t, "char["), strings.Contains(t, "long[")
	switch {
	case size > 0 && isString:
		f.Kind, f.Size, f.Len, f.Elem = Text, size, size, intType(1, false)
	case size > 0:
		f.Kind, f.Size, f.Elem = Int, size, intType(size, f.Signed)
	case isString:
		// The kernel derives signedness after it prefixed the type with
		// "__data_loc ", so every dynamic field is signed in its format.
		f.Kind, f.Size, f.Signed = String, 8, true
	case isStack:
		f.Kind, f.Size, f.Elem, f.Signed = Stack, 8, intType(8, f.Signed), true
	default:
		base, _, isArray := strings.Cut(t, "[")
		if _, known := scalarSizes[base]; !known || !isArray {
			return f, 0, fmt.Errorf("field %s: unknown type %q (the kernel's types: %s)", name, t, knownTypes)
		}
		if !ext {
			return f, 0, fmt.Errorf("field %s: type %s: the kernel has no integer arrays", name, t)
		}
		if err := extArray(&f, base); err != nil {
			return f, 0, fmt.Errorf("field %s: type %s: %w", name, t, err)
		}
	}
	if ext {
		if err := checkFieldName(f); err != nil {
			return f, 0, err
		}
	}
	return f, n, nil
}

// extArray makes f, of type base[N], a fixed integer array: kconsume's
// extension. N is decimal, 1..MaxArray; the kernel's only dynamic arrays
// are char[] and long[].
func extArray(f *Field, base string) error {
	spec, ok := strings.CutSuffix(f.Type[len(base)+1:], "]")
	if !ok || strings.ContainsAny(spec, "[]") {
		return fmt.Errorf("invalid array specification, want %s[N]", base)
	}
	if spec == "" {
		return fmt.Errorf("only char[] and long[] can be dynamic; give an integer array a size, %s[N]", base)
	}
	n := 0
	for _, c := range []byte(spec) {
		if c < '0' || c > '9' || n > MaxArray {
			return fmt.Errorf("array size %q must be a decimal number 1..%d", spec, MaxArray)
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > MaxArray {
		return fmt.Errorf("array size %q must be a decimal number 1..%d", spec, MaxArray)
	}
	size := scalarSizes[base]
	f.Signed = signedType(base)
	f.Kind, f.Len, f.Size, f.Elem = Array, n, n*size, intType(size, f.Signed)
	return nil
}

// kernelSize is synth_field_size: the size of an integer type or of
// char[N], 0 for char[], char[0], a long[] stack or an unknown type, and
// an error for a char[ type with a bad size.
func kernelSize(t string) (int, error) {
	if n, ok := scalarSizes[t]; ok {
		return n, nil
	}
	if !strings.Contains(t, "char[") {
		return 0, nil
	}
	// synth_field_string_size: the size runs from the first "char[" to
	// the first ']', which must end the type.
	start := strings.Index(t, "char[") + len("char[")
	end := strings.IndexByte(t, ']')
	if end < start || end != len(t)-1 {
		return 0, fmt.Errorf("invalid array specification, want char[N] with N up to %d", MaxText)
	}
	spec := t[start:end]
	if len(spec) > 3 {
		return 0, fmt.Errorf("array size %q: the kernel reads at most 3 characters", spec)
	}
	if spec == "" {
		return 0, nil
	}
	n, ok := kstrtouint(spec)
	if !ok {
		return 0, fmt.Errorf("array size %q is not a number (C notation: 16, 020, 0x10)", spec)
	}
	if n > MaxText {
		return 0, fmt.Errorf("array size %d over the kernel's %d", n, MaxText)
	}
	return n, nil
}

// kstrtouint is the kernel's kstrtouint with base 0 on a short string: an
// optional '+', then decimal, octal after a 0, or hex after 0x.
func kstrtouint(s string) (int, bool) {
	s = strings.TrimPrefix(s, "+")
	at := func(i int) byte {
		if i < len(s) {
			return s[i]
		}
		return 0
	}
	base := 10
	if at(0) == '0' {
		base = 8
		if at(1)|0x20 == 'x' && hexVal(at(2)) >= 0 {
			base, s = 16, s[2:]
		}
	}
	n, i := 0, 0
	for ; i < len(s); i++ {
		d := hexVal(s[i])
		if d < 0 || d >= base {
			break
		}
		n = n*base + d
	}
	if i == 0 {
		return 0, false
	}
	rest := strings.TrimPrefix(s[i:], "\n")
	return n, rest == ""
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c|0x20 >= 'a' && c|0x20 <= 'f':
		return int(c|0x20-'a') + 10
	}
	return -1
}

// signedType is synth_field_signed: all but u* types and gfp_t.
func signedType(t string) bool { return !strings.HasPrefix(t, "u") && t != "gfp_t" }

// checkEventName refuses an event name the kernel refuses, or one it
// accepts that our format cannot hold.
func checkEventName(name string) error {
	if !isGoodName(name) {
		return fmt.Errorf("event name %q: illegal name (a letter or _, then letters, digits or _)", name)
	}
	if !isASCII(name) {
		return fmt.Errorf("event name %q: not ASCII; trace names are ASCII (the kernel allows Latin-1 letters)", name)
	}
	if len(name) > MaxEventName {
		return fmt.Errorf("event name of %d bytes: kconsume's trace format holds %d bytes for synthetic:NAME, so names of at most %d (the kernel allows longer)", len(name), 255, MaxEventName)
	}
	return nil
}

// checkFieldName refuses a field name the kernel accepts that our format
// cannot hold.
func checkFieldName(f Field) error {
	max := 255
	if f.Kind == Stack {
		max = 255 - len(lengthName(""))
	}
	if !isASCII(f.Name) {
		return fmt.Errorf("field %q: not ASCII; trace names are ASCII (the kernel allows Latin-1 letters)", f.Name)
	}
	if len(f.Name) > max {
		return fmt.Errorf("field name of %d bytes: kconsume's trace format holds at most %d here (the kernel allows longer)", len(f.Name), max)
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// The kernel's ctype (lib/ctype.c) is Latin-1: letters include 0xc0-0xff
// but for 0xd7 and 0xf7, and 0xa0 is a space.

func isAlpha(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0xc0 && c != 0xd7 && c != 0xf7
}

func isSpace(c byte) bool { return c == ' ' || c >= '\t' && c <= '\r' || c == 0xa0 }

// isGoodName is the kernel's is_good_name.
func isGoodName(s string) bool {
	if s == "" || !isAlpha(s[0]) && s[0] != '_' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlpha(c) && !(c >= '0' && c <= '9') && c != '_' {
			return false
		}
	}
	return true
}

// splitArgs is argv_split: the words of s between kernel spaces.
func splitArgs(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		j := i
		for j < len(s) && !isSpace(s[j]) {
			j++
		}
		if j > i {
			out = append(out, s[i:j])
		}
		i = j
	}
	return out
}

// skipSpaces is skip_spaces.
func skipSpaces(s string) string {
	for len(s) > 0 && isSpace(s[0]) {
		s = s[1:]
	}
	return s
}
