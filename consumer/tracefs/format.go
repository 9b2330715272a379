// Package tracefs reads the kernel's trace event descriptions from tracefs:
// which tracepoints exist and the binary layout of each one's record, as
// the kernel prints it in events/<system>/<event>/format
// (kernel/trace/trace_events.c:f_show).
package tracefs

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/kconsume/kconsume/relayfmt"
)

// Loc says how a field holds its data.
type Loc uint8

const (
	// Inline fields hold their bytes at Offset.
	Inline Loc = iota
	// DataLoc fields are a u32 at Offset: low 16 bits the offset of the data
	// from the start of the record, high 16 bits its length in bytes
	// (include/trace/stages/stage5_get_offsets.h).
	DataLoc
	// RelLoc fields are like DataLoc, but the offset counts from the end of
	// the u32 itself (__rel_loc, Linux 5.19+).
	RelLoc
)

// Field is one field of a trace event record.
type Field struct {
	Name string
	// Type is the C type as declared, without the array suffix and without
	// __data_loc/__rel_loc ("unsigned long", "char", "const char *").
	Type   string
	Offset int
	Size   int // bytes at Offset (4 for DataLoc/RelLoc)
	Signed bool
	// ArrayLen is the element count of an inline array, 0 for a scalar;
	// for DataLoc/RelLoc arrays it is -1 (the length is in the record).
	ArrayLen int
	Loc      Loc
}

// ElemSize returns the size of one array element, or Size for a scalar.
func (f Field) ElemSize() int {
	switch {
	case f.Loc != Inline:
		return typeSize(f.Type)
	case f.ArrayLen > 0:
		return f.Size / f.ArrayLen
	}
	return f.Size
}

// IsChar reports whether the field's elements are C characters, so an
// array of them is text.
func (f Field) IsChar() bool {
	t := strings.TrimPrefix(f.Type, "const ")
	t = strings.TrimPrefix(t, "unsigned ")
	t = strings.TrimPrefix(t, "signed ")
	return t == "char"
}

// Format is the layout of one trace event.
type Format struct {
	System string
	Name   string
	ID     uint32
	// Common are the fields every record starts with (common_type,
	// common_flags, common_preempt_count, common_pid on current kernels);
	// Fields are the event's own.
	Common []Field
	Fields []Field
	// Skipped names the flexible-array fields ("buf[]", size 0) left out:
	// the format gives no length for them.
	Skipped []string
	// Print is the event's print fmt: its format string and arguments,
	// as the file has them after "print fmt: ".
	Print string
}

// FullName returns "system:name".
func (f *Format) FullName() string { return f.System + ":" + f.Name }

// All returns the common fields followed by the event's own.
func (f *Format) All() []Field {
	return append(append([]Field(nil), f.Common...), f.Fields...)
}

// FixedSize returns the bytes of the record before its dynamic area: the
// end of the field that ends last.
func (f *Format) FixedSize() int {
	end := 0
	for _, fl := range f.All() {
		if e := fl.Offset + fl.Size; e > end {
			end = e
		}
	}
	return end
}

// MaxRecordSize is the largest trace record the kernel builds for BPF and
// perf (PERF_MAX_TRACE_SIZE, include/linux/trace_events.h).
const MaxRecordSize = 8192

// ParseFormat parses the text of a tracefs format file. system is the
// event's system (the file does not name it). A field whose name repeats
// an earlier one (5.10's regmap:regcache_sync has two "type") is renamed
// NAME_2, NAME_3…, since a trace's metadata needs unique names. It fails
// on a missing name or
// ID, a field line it cannot read, or a layout that overlaps or runs past
// MaxRecordSize.
func ParseFormat(system string, data []byte) (*Format, error) {
	f := &Format{System: system}
	var haveID, inFields, common = false, false, true
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		trimmed := strings.TrimSpace(text)
		switch {
		case strings.HasPrefix(text, "name:"):
			f.Name = strings.TrimSpace(strings.TrimPrefix(text, "name:"))
		case strings.HasPrefix(text, "ID:"):
			id, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(text, "ID:")), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("format line %d: bad ID: %w", line, err)
			}
			f.ID, haveID = uint32(id), true
		case strings.HasPrefix(text, "format:"):
			inFields = true
		case strings.HasPrefix(text, "print fmt:"):
			inFields = false
			f.Print = strings.TrimSpace(strings.TrimPrefix(text, "print fmt:"))
		case inFields && trimmed == "":
			// The kernel separates the common fields from the event's own
			// with an empty line.
			if len(f.Common) > 0 {
				common = false
			}
		case inFields && strings.HasPrefix(trimmed, "field:"):
			fl, err := parseField(trimmed)
			if err != nil {
				return nil, fmt.Errorf("format line %d: %w", line, err)
			}
			if fl.Size == 0 && fl.Loc == Inline {
				// A flexible array ("u32 buf[]", size 0): the format does
				// not say how long it is, so it cannot be decoded.
				f.Skipped = append(f.Skipped, fl.Name)
				continue
			}
			if common {
				f.Common = append(f.Common, fl)
			} else {
				f.Fields = append(f.Fields, fl)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("format: %w", err)
	}
	if f.Name == "" || !haveID {
		return nil, fmt.Errorf("format: missing name or ID")
	}
	f.renameDuplicates()
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("format of %s: %w", f.FullName(), err)
	}
	return f, nil
}

// parseField reads "field:TYPE NAME[N];\toffset:O;\tsize:S;\tsigned:B;".
func parseField(s string) (Field, error) {
	var fl Field
	var decl string
	var haveOff, haveSize bool
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		key, val, ok := strings.Cut(part, ":")
		if !ok {
			continue
		}
		switch key {
		case "field":
			decl = val
		case "offset", "size", "signed":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return fl, fmt.Errorf("field %q: bad %s %q", decl, key, val)
			}
			switch key {
			case "offset":
				fl.Offset, haveOff = n, true
			case "size":
				fl.Size, haveSize = n, true
			default:
				fl.Signed = n != 0
			}
		}
	}
	if decl == "" || !haveOff || !haveSize {
		return fl, fmt.Errorf("field line %q: needs field, offset and size", s)
	}
	if err := parseDecl(decl, &fl); err != nil {
		return fl, err
	}
	return fl, nil
}

// parseDecl splits a C declaration "TYPE NAME" or "TYPE NAME[N]" or
// "__data_loc TYPE[] NAME".
func parseDecl(decl string, fl *Field) error {
	d := strings.TrimSpace(decl)
	switch {
	case strings.HasPrefix(d, "__data_loc "):
		fl.Loc, d = DataLoc, strings.TrimPrefix(d, "__data_loc ")
	case strings.HasPrefix(d, "__rel_loc "):
		fl.Loc, d = RelLoc, strings.TrimPrefix(d, "__rel_loc ")
	}
	// The array suffix goes first: its size may be an expression with
	// spaces ("buf[32 + 2]", "saddr[sizeof(struct sockaddr_in6)]" on 5.10).
	arr := ""
	if strings.HasSuffix(d, "]") {
		depth := 0
		for j := len(d) - 1; j >= 0; j-- {
			switch d[j] {
			case ']':
				depth++
			case '[':
				depth--
			}
			if depth == 0 {
				d, arr = strings.TrimSpace(d[:j]), d[j:]
				break
			}
		}
		if arr == "" {
			return fmt.Errorf("field %q: unbalanced brackets", decl)
		}
	}
	i := strings.LastIndexAny(d, " *")
	if i < 0 || i == len(d)-1 {
		return fmt.Errorf("field %q: no name", decl)
	}
	typ, name := strings.TrimSpace(d[:i+1]), d[i+1:]
	if fl.Loc != Inline {
		// "__data_loc char[] name": the brackets sit on the type.
		typ = strings.TrimSpace(strings.TrimSuffix(typ, "[]"))
		if fl.Size != 4 {
			return fmt.Errorf("field %q: dynamic location of size %d, want 4", decl, fl.Size)
		}
		fl.ArrayLen = -1
	}
	if !relayfmt.IsIdent(name) {
		return fmt.Errorf("field %q: name %q is not an identifier", decl, name)
	}
	fl.Name, fl.Type = name, typ
	if arr != "" && fl.Loc == Inline {
		if !strings.HasSuffix(arr, "]") {
			return fmt.Errorf("field %q: bad array suffix %q", decl, arr)
		}
		inner := arr[1 : len(arr)-1]
		if inner == "" && fl.Size == 0 {
			return nil
		}
		n, err := strconv.Atoi(inner)
		if err != nil || n <= 0 {
			// A macro (TASK_COMM_LEN) on old kernels: derive the count
			// from the element type's size.
			es := typeSize(typ)
			if es == 0 || fl.Size%es != 0 {
				es = 1
			}
			n = fl.Size / es
		}
		if n <= 0 || fl.Size%n != 0 {
			return fmt.Errorf("field %q: size %d is not a multiple of %d elements", decl, fl.Size, n)
		}
		fl.ArrayLen = n
	}
	return nil
}

// typeSize returns the size of well-known C types on 64-bit Linux, 0 when
// unknown. Only element sizes of arrays whose length is not printed need it.
func typeSize(t string) int {
	t = strings.TrimPrefix(t, "const ")
	switch {
	case strings.HasSuffix(t, "*"):
		return 8
	}
	switch t {
	case "char", "unsigned char", "signed char", "u8", "s8", "__u8", "__s8", "uint8_t", "int8_t", "bool":
		return 1
	case "short", "unsigned short", "u16", "s16", "__u16", "__s16", "uint16_t", "int16_t":
		return 2
	case "int", "unsigned int", "unsigned", "u32", "s32", "__u32", "__s32", "uint32_t", "int32_t", "pid_t", "uid_t", "gid_t":
		return 4
	case "long", "unsigned long", "long long", "unsigned long long", "u64", "s64", "__u64", "__s64", "uint64_t", "int64_t", "size_t":
		return 8
	}
	return 0
}

// renameDuplicates gives every repeated field name a _2, _3… suffix.
func (f *Format) renameDuplicates() {
	seen := map[string]bool{}
	for _, list := range [][]Field{f.Common, f.Fields} {
		for i := range list {
			name := list[i].Name
			for n := 2; seen[name]; n++ {
				name = fmt.Sprintf("%s_%d", list[i].Name, n)
			}
			list[i].Name = name
			seen[name] = true
		}
	}
}

func (f *Format) check() error {
	seen := map[string]bool{}
	all := f.All()
	for i, fl := range all {
		if seen[fl.Name] {
			return fmt.Errorf("duplicate field %q", fl.Name)
		}
		seen[fl.Name] = true
		if fl.Size == 0 && fl.ArrayLen == 0 {
			return fmt.Errorf("field %q has size 0", fl.Name)
		}
		if fl.Offset+fl.Size > MaxRecordSize {
			return fmt.Errorf("field %q ends at %d, past the %d-byte record limit", fl.Name, fl.Offset+fl.Size, MaxRecordSize)
		}
		if i > 0 {
			prev := all[i-1]
			if fl.Offset < prev.Offset+prev.Size {
				return fmt.Errorf("field %q at %d overlaps %q", fl.Name, fl.Offset, prev.Name)
			}
		}
	}
	return nil
}
