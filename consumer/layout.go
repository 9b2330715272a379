package consumer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/relayfmt"
)

// layout turns the ring record of one trace event into the CTF payload
// its relayfmt class declares: inline fields are copied as they are
// (holes between them left out), a __data_loc string becomes a
// NUL-terminated string and a __data_loc array a u32 count followed by
// the elements.
//
// A ring record is the kernel's trace record without common_flags and
// common_preempt_count, its bytes 2 and 3 (ringCut): the recorder cannot
// know them and writes the record without them, so a tracepoint without
// dynamic fields is written to the trace as the ring holds it (direct).
type layout struct {
	name   string
	fields []relayfmt.Field
	fixed  int  // bytes of the ring record before its dynamic area
	direct bool // payload is raw[:fixed] as it is
	asIs   bool // payload is the whole record (synthetic events)
	ops    []op
	dyn    []uint16 // offsets of dynamic fields for the BPF side (kc_tp_info.dyn)
}

type opKind uint8

const (
	opCopy opKind = iota
	opString
	opSeq
	opAdd
	opFlags
)

type op struct {
	kind opKind
	off  int // copy, flags: source offset; string/seq: offset of the location u32; add: bytes back from the payload's end
	n    int // copy, flags: bytes; add: the delta
	rel  bool
	elem int                      // seq: element size
	fn   func(text []byte) uint32 // flags: the value of the text
}

// unknowable are the common fields BPF cannot see: the kernel overwrites
// them before the program runs (see bpf/kc/tracepoint.bpf.h). The recorder
// rebuilds common_type and common_pid, and leaves these two out of the
// ring record.
var unknowable = map[string]bool{"common_flags": true, "common_preempt_count": true}

// ringCut is how many bytes the ring record lacks from offset 2 of the
// trace record on: common_flags and common_preempt_count
// (include/linux/trace_events.h, struct trace_entry). It mirrors KC_CUT
// (bpf/kc/event.h; TestMirrorsC).
const ringCut = 2

// ringOff returns where the byte at off of a trace record is in its ring
// record.
func ringOff(off int) int {
	if off >= 2+ringCut {
		return off - ringCut
	}
	return off
}

// maxDyn mirrors KC_MAX_DYN (bpf/kc/event.h; TestMirrorsC).
const maxDyn = 8

// dynRel mirrors KC_DYN_REL.
const dynRel = 0x8000

// newLayout builds the layout of f, with the fields of adjust written as
// it says. It fails when the event has more dynamic fields than the BPF
// recorder tracks, or a field of adjust is absent or not of a type its
// adjustment takes (Delta: an inline 4-byte integer; Flags: an inline
// char array).
func newLayout(f *tracefs.Format, adjust map[string]Adjust) (*layout, error) {
	return newLayoutAt(f, adjust, ringOff)
}

// sysRingOff is ringOff for a syscall event the raw syscall programs
// record (sysShape): they leave out the 4 bytes of padding after
// __syscall_nr as well, so the arguments follow it in the ring record.
func sysRingOff(off int) int {
	if off >= 16 {
		return ringOff(off) - 4
	}
	return ringOff(off)
}

// newLayoutAt is newLayout for ring records whose bytes are where at
// puts the trace record's.
func newLayoutAt(f *tracefs.Format, adjust map[string]Adjust, at func(int) int) (*layout, error) {
	l := &layout{name: f.FullName(), fixed: at(f.FixedSize())}
	added := 0
	for _, fl := range f.All() {
		if unknowable[fl.Name] {
			continue
		}
		if fl.Offset >= 2 && fl.Offset < 2+ringCut {
			// Only the unknowable fields live there in every kernel's
			// struct trace_entry; anything else would be cut.
			return nil, fmt.Errorf("event %s: field %s at offset %d, where the recorder keeps no byte", l.name, fl.Name, fl.Offset)
		}
		switch fl.Loc {
		case tracefs.Inline:
			a, ok := adjust[fl.Name]
			if ok && a.Flags != nil {
				if !fl.IsChar() || fl.ArrayLen == 0 {
					return nil, fmt.Errorf("event %s: field %s: flags need a char array, not %s", l.name, fl.Name, fl.Type)
				}
				l.fields = append(l.fields, relayfmt.ScalarField(fl.Name, relayfmt.U32))
				l.ops = append(l.ops, op{kind: opFlags, off: at(fl.Offset), n: fl.Size, fn: a.Flags})
				added++
				continue
			}
			l.fields = append(l.fields, inlineField(fl))
			l.copy(at(fl.Offset), fl.Size)
			if ok {
				if fl.Size != 4 || fl.ArrayLen > 0 {
					return nil, fmt.Errorf("event %s: field %s: a delta needs a 4-byte integer, not %s", l.name, fl.Name, fl.Type)
				}
				// The field is the last 4 bytes written so far.
				l.ops = append(l.ops, op{kind: opAdd, off: 4, n: int(a.Delta)})
				added++
			}
		default:
			if len(l.dyn) == maxDyn {
				return nil, fmt.Errorf("event %s: more than %d dynamic fields", l.name, maxDyn)
			}
			// The BPF side reads the trace record: its offsets.
			d := uint16(fl.Offset)
			if fl.Loc == tracefs.RelLoc {
				d |= dynRel
			}
			l.dyn = append(l.dyn, d)
			o := op{off: at(fl.Offset), rel: fl.Loc == tracefs.RelLoc}
			if fl.IsChar() && !sysUserBytes(f, fl) {
				o.kind = opString
				l.fields = append(l.fields, relayfmt.StringField(fl.Name))
			} else {
				// Elements of an unknown type are kept as bytes.
				o.kind, o.elem = opSeq, 1
				elem := relayfmt.U8
				if es := fl.ElemSize(); es > 0 {
					o.elem, elem = es, intType(es, signedName(fl.Type))
				}
				length := "_" + fl.Name + "_length"
				l.fields = append(l.fields, relayfmt.ScalarField(length, relayfmt.U32), relayfmt.SequenceField(fl.Name, elem, length))
			}
			l.ops = append(l.ops, o)
		}
	}
	if added != len(adjust) {
		return nil, fmt.Errorf("event %s: %d fields to adjust, %d found inline", l.name, len(adjust), added)
	}
	l.direct = len(l.ops) == 1 && l.ops[0].kind == opCopy && l.ops[0].off == 0 && l.ops[0].n == l.fixed
	return l, nil
}

// copy appends an inline run, merging it with the previous one when they
// touch.
func (l *layout) copy(off, n int) {
	if k := len(l.ops); k > 0 {
		if p := &l.ops[k-1]; p.kind == opCopy && p.off+p.n == off {
			p.n += n
			return
		}
	}
	l.ops = append(l.ops, op{kind: opCopy, off: off, n: n})
}

func inlineField(fl tracefs.Field) relayfmt.Field {
	if fl.ArrayLen > 0 {
		es := fl.Size / fl.ArrayLen
		if fl.IsChar() && es == 1 {
			return relayfmt.CharArrayField(fl.Name, fl.ArrayLen)
		}
		if t := intType(es, fl.Signed); t != 0 {
			return relayfmt.ArrayField(fl.Name, t, fl.ArrayLen)
		}
		return relayfmt.ArrayField(fl.Name, relayfmt.U8, fl.Size)
	}
	if t := intType(fl.Size, fl.Signed); t != 0 {
		return relayfmt.ScalarField(fl.Name, t)
	}
	// Structs and odd sizes: their bytes.
	return relayfmt.ArrayField(fl.Name, relayfmt.U8, fl.Size)
}

func intType(size int, signed bool) relayfmt.IntType {
	var t relayfmt.IntType
	switch size {
	case 1:
		t = relayfmt.U8
	case 2:
		t = relayfmt.U16
	case 4:
		t = relayfmt.U32
	case 8:
		t = relayfmt.U64
	default:
		return 0
	}
	if signed {
		t += relayfmt.S8 - relayfmt.U8
	}
	return t
}

// signedName guesses the signedness of a dynamic array's element type,
// which the format file does not give (it prints the location's).
func signedName(t string) bool {
	t = strings.TrimPrefix(t, "const ")
	switch t {
	case "int", "long", "short", "long long", "s8", "s16", "s32", "s64", "__s8", "__s16", "__s32", "__s64",
		"int8_t", "int16_t", "int32_t", "int64_t", "pid_t", "signed char":
		return true
	}
	return false
}

// transcode appends the payload of raw (a whole ring record) to dst. It
// reports false when a dynamic location points outside the record.
func (l *layout) transcode(dst, raw []byte) ([]byte, bool) {
	if len(raw) < l.fixed {
		return dst, false
	}
	for _, o := range l.ops {
		switch o.kind {
		case opCopy:
			dst = append(dst, raw[o.off:o.off+o.n]...)
			continue
		case opAdd:
			v := dst[len(dst)-o.off:]
			binary.LittleEndian.PutUint32(v, binary.LittleEndian.Uint32(v)+uint32(o.n))
			continue
		case opFlags:
			text := raw[o.off : o.off+o.n]
			if i := bytes.IndexByte(text, 0); i >= 0 {
				text = text[:i]
			}
			dst = binary.LittleEndian.AppendUint32(dst, o.fn(text))
			continue
		}
		loc := binary.LittleEndian.Uint32(raw[o.off:])
		start, n := int(loc&0xffff), int(loc>>16)
		if o.rel {
			// From the field's end: the cut moved both alike.
			start += o.off + 4
		} else if start < 2+ringCut {
			return dst, false
		} else {
			start -= ringCut
		}
		if start+n > len(raw) {
			return dst, false
		}
		data := raw[start : start+n]
		if o.kind == opString {
			for i, c := range data {
				if c == 0 {
					data = data[:i]
					break
				}
			}
			dst = append(append(dst, data...), 0)
			continue
		}
		cnt := n / o.elem
		dst = binary.LittleEndian.AppendUint32(dst, uint32(cnt))
		dst = append(dst, data[:cnt*o.elem]...)
	}
	return dst, true
}
