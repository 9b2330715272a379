// Package layout turns the records the recorder writes into the CTF
// payloads of their trace classes, and tells the recorder where each
// event's dynamic fields are: the one description of an event's record
// both sides use.
package layout

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/relayfmt"
)

// Layout turns the ring record of one trace event into the CTF payload
// its relayfmt class declares: inline fields are copied as they are
// (holes between them left out), a __data_loc string becomes a
// NUL-terminated string and a __data_loc array a u32 count followed by
// the elements.
//
// A ring record is the kernel's trace record without common_flags and
// common_preempt_count, its bytes 2 and 3 (RingCut): the recorder cannot
// know them and writes the record without them, so a tracepoint without
// dynamic fields is written to the trace as the ring holds it (direct).
type Layout struct {
	Name   string
	Fields []relayfmt.Field
	Fixed  int  // bytes of the ring record before its dynamic area
	Direct bool // payload is raw[:fixed] as it is
	AsIs   bool // payload is the whole record (synthetic events)
	Ops    []Op
	Dyn    []uint16  // offsets of dynamic fields for the BPF side (kc_tp_info.dyn)
	Stack  Stack     // the call chains behind the record (AddTail)
	Ctx    []Context // the contexts behind the record, before the chains (AddTail)
	ctxLen int       // their bytes
}

// Stack says which call chains the recorder writes behind an event's
// record (KC_STACK_* of bpf/kc/stack.h): the kernel's, then the user's,
// each a u32 count and that many u64 return addresses.
type Stack uint8

// The call chains.
const (
	StackKernel Stack = 1 << iota
	StackUser
)

// MaxStack mirrors KC_STACK_MAX (bpf/kc/stack.h; TestMirrorsC): the most
// frames a call chain holds, PERF_MAX_STACK_DEPTH.
const MaxStack = 127

// The stack fields' names, LTTng's for its callstack contexts.
const (
	KernelStackField = "callstack_kernel"
	UserStackField   = "callstack_user"
)

// AddTail declares behind the fields of l the contexts ctxs (in the
// order ParseContexts gives) and the call chains of s: a sequence of u64
// addresses each, after a u32 count. The ring record carries them
// behind its dynamic area, so the payload is no longer the record as it
// is.
func (l *Layout) AddTail(ctxs []Context, s Stack) {
	if s == 0 && len(ctxs) == 0 || l.Stack != 0 || len(l.Ctx) != 0 || l.AsIs {
		return
	}
	l.Stack, l.Ctx = s, ctxs
	// The contexts are the event's context, which the trace holds
	// before its payload: a scope of their own, so a context named as a
	// field of the event (pid) does not clash with it. The call chains
	// stay in the payload, at its end: babeltrace2 2.0 fails on a
	// sequence in an event's own context.
	var ctx []relayfmt.Field
	for _, c := range ctxs {
		f := c.Field
		f.Context = true
		ctx = append(ctx, f)
		l.ctxLen += c.Size()
	}
	l.Fields = append(ctx, l.Fields...)
	for _, c := range []struct {
		bit  Stack
		name string
	}{{StackKernel, KernelStackField}, {StackUser, UserStackField}} {
		if s&c.bit == 0 {
			continue
		}
		length := "_" + c.name + "_length"
		seq := relayfmt.SequenceField(c.name, relayfmt.U64, length)
		seq.Hex = true
		l.Fields = append(l.Fields, relayfmt.ScalarField(length, relayfmt.U32), seq)
	}
	l.Ops = append(l.Ops, Op{Kind: OpTail})
	l.Direct = false
}

// Tailed reports whether l's records carry contexts or call chains
// behind them (AddTail).
func (l *Layout) Tailed() bool { return l.Stack != 0 || len(l.Ctx) > 0 }

type OpKind uint8

const (
	OpCopy OpKind = iota
	OpString
	OpSeq
	OpAdd
	OpFlags
	OpTail
)

type Op struct {
	Kind OpKind
	Off  int // copy, flags: source offset; string/seq: offset of the location u32; add: bytes back from the payload's end
	N    int // copy, flags: bytes; add: the delta
	Rel  bool
	Elem int                      // seq: element size
	Fn   func(text []byte) uint32 // flags: the value of the text
}

// Unknowable are the common fields BPF cannot see: the kernel overwrites
// them before the program runs (see bpf/kc/tracepoint.bpf.h). The recorder
// rebuilds common_type and common_pid, and leaves these two out of the
// ring record.
var Unknowable = map[string]bool{"common_flags": true, "common_preempt_count": true}

// RingCut is how many bytes the ring record lacks from offset 2 of the
// trace record on: common_flags and common_preempt_count
// (include/linux/trace_events.h, struct trace_entry). It mirrors KC_CUT
// (bpf/kc/event.h; TestMirrorsC).
const RingCut = 2

// RingOff returns where the byte at off of a trace record is in its ring
// record.
func RingOff(off int) int {
	if off >= 2+RingCut {
		return off - RingCut
	}
	return off
}

// MaxDyn mirrors KC_MAX_DYN (bpf/kc/event.h; TestMirrorsC).
const MaxDyn = 8

// DynRel mirrors KC_DYN_REL.
const DynRel = 0x8000

// New builds the layout of f, with the fields of adjust written as
// it says. It fails when the event has more dynamic fields than the BPF
// recorder tracks, or a field of adjust is absent or not of a type its
// adjustment takes (Delta: an inline 4-byte integer; Flags: an inline
// char array).
func New(f *tracefs.Format, adjust map[string]Adjust) (*Layout, error) {
	return NewAt(f, adjust, RingOff)
}

// SysRingOff is RingOff for a syscall event the raw syscall programs
// record (sysShape): they leave out the 4 bytes of padding after
// __syscall_nr as well, so the arguments follow it in the ring record.
func SysRingOff(off int) int {
	if off >= 16 {
		return RingOff(off) - 4
	}
	return RingOff(off)
}

// NewAt is New for ring records whose bytes are where at
// puts the trace record's.
func NewAt(f *tracefs.Format, adjust map[string]Adjust, at func(int) int) (*Layout, error) {
	l := &Layout{Name: f.FullName(), Fixed: at(f.FixedSize())}
	added := 0
	for _, fl := range f.All() {
		if Unknowable[fl.Name] {
			continue
		}
		if fl.Offset >= 2 && fl.Offset < 2+RingCut {
			// Only the Unknowable fields live there in every kernel's
			// struct trace_entry; anything else would be cut.
			return nil, fmt.Errorf("event %s: field %s at offset %d, where the recorder keeps no byte", l.Name, fl.Name, fl.Offset)
		}
		switch fl.Loc {
		case tracefs.Inline:
			a, ok := adjust[fl.Name]
			if ok && a.Flags != nil {
				if !fl.IsChar() || fl.ArrayLen == 0 {
					return nil, fmt.Errorf("event %s: field %s: flags need a char array, not %s", l.Name, fl.Name, fl.Type)
				}
				l.Fields = append(l.Fields, relayfmt.ScalarField(fl.Name, relayfmt.U32))
				l.Ops = append(l.Ops, Op{Kind: OpFlags, Off: at(fl.Offset), N: fl.Size, Fn: a.Flags})
				added++
				continue
			}
			l.Fields = append(l.Fields, inlineField(fl))
			l.copy(at(fl.Offset), fl.Size)
			if ok {
				if fl.Size != 4 || fl.ArrayLen > 0 {
					return nil, fmt.Errorf("event %s: field %s: a delta needs a 4-byte integer, not %s", l.Name, fl.Name, fl.Type)
				}
				// The field is the last 4 bytes written so far.
				l.Ops = append(l.Ops, Op{Kind: OpAdd, Off: 4, N: int(a.Delta)})
				added++
			}
		default:
			if len(l.Dyn) == MaxDyn {
				return nil, fmt.Errorf("event %s: more than %d dynamic fields", l.Name, MaxDyn)
			}
			// The BPF side reads the trace record: its offsets.
			d := uint16(fl.Offset)
			if fl.Loc == tracefs.RelLoc {
				d |= DynRel
			}
			l.Dyn = append(l.Dyn, d)
			o := Op{Off: at(fl.Offset), Rel: fl.Loc == tracefs.RelLoc}
			if fl.IsChar() && !f.UserBytes(fl) {
				o.Kind = OpString
				l.Fields = append(l.Fields, relayfmt.StringField(fl.Name))
			} else {
				// Elements of an unknown type are kept as bytes.
				o.Kind, o.Elem = OpSeq, 1
				elem := relayfmt.U8
				if es := fl.ElemSize(); es > 0 {
					o.Elem, elem = es, intType(es, signedName(fl.Type))
				}
				length := "_" + fl.Name + "_length"
				l.Fields = append(l.Fields, relayfmt.ScalarField(length, relayfmt.U32), relayfmt.SequenceField(fl.Name, elem, length))
			}
			l.Ops = append(l.Ops, o)
		}
	}
	if added != len(adjust) {
		return nil, fmt.Errorf("event %s: %d fields to adjust, %d found inline", l.Name, len(adjust), added)
	}
	l.Direct = len(l.Ops) == 1 && l.Ops[0].Kind == OpCopy && l.Ops[0].Off == 0 && l.Ops[0].N == l.Fixed
	return l, nil
}

// copy appends an inline run, merging it with the previous one when they
// touch.
func (l *Layout) copy(off, n int) {
	if k := len(l.Ops); k > 0 {
		if p := &l.Ops[k-1]; p.Kind == OpCopy && p.Off+p.N == off {
			p.N += n
			return
		}
	}
	l.Ops = append(l.Ops, Op{Kind: OpCopy, Off: off, N: n})
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
		f := relayfmt.ScalarField(fl.Name, t)
		// The probe events' x8 … x64 fetch types (trace_probe.c) and
		// their addresses, which ftrace prints in hex.
		f.Hex = len(fl.Type) > 1 && fl.Type[0] == 'x' && strings.Trim(fl.Type[1:], "0123456789") == "" ||
			strings.HasPrefix(fl.Name, "__probe_")
		return f
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

// Transcode appends the payload of raw (a whole ring record) to dst. It
// reports false when a dynamic location points outside the record.
func (l *Layout) Transcode(dst, raw []byte) ([]byte, bool) {
	if len(raw) < l.Fixed {
		return dst, false
	}
	var tail []byte
	if l.Tailed() {
		// The record ends at its fixed part or its last dynamic data,
		// as the recorder measures it (kc_record); its tail follows:
		// the contexts go first, the event's context, and the call
		// chains last (OpTail).
		end := l.Fixed
		for _, o := range l.Ops {
			if o.Kind == OpString || o.Kind == OpSeq {
				start, n, ok := l.loc(o, raw)
				if !ok {
					return dst, false
				}
				end = max(end, start+n)
			}
		}
		var ok bool
		if tail, ok = l.tail(raw[end:]); !ok {
			return dst, false
		}
		dst = append(dst, tail[:l.ctxLen]...)
	}
	for _, o := range l.Ops {
		switch o.Kind {
		case OpTail:
			dst = append(dst, tail[l.ctxLen:]...)
			continue
		case OpCopy:
			dst = append(dst, raw[o.Off:o.Off+o.N]...)
			continue
		case OpAdd:
			v := dst[len(dst)-o.Off:]
			binary.LittleEndian.PutUint32(v, binary.LittleEndian.Uint32(v)+uint32(o.N))
			continue
		case OpFlags:
			text := raw[o.Off : o.Off+o.N]
			if i := bytes.IndexByte(text, 0); i >= 0 {
				text = text[:i]
			}
			dst = binary.LittleEndian.AppendUint32(dst, o.Fn(text))
			continue
		}
		start, n, ok := l.loc(o, raw)
		if !ok {
			return dst, false
		}
		data := raw[start : start+n]
		if o.Kind == OpString {
			for i, c := range data {
				if c == 0 {
					data = data[:i]
					break
				}
			}
			dst = append(append(dst, data...), 0)
			continue
		}
		cnt := n / o.Elem
		dst = binary.LittleEndian.AppendUint32(dst, uint32(cnt))
		dst = append(dst, data[:cnt*o.Elem]...)
	}
	return dst, true
}

// loc returns where the data of o, a dynamic field's step, lies in raw,
// and false when its location points outside the record.
func (l *Layout) loc(o Op, raw []byte) (start, n int, ok bool) {
	loc := binary.LittleEndian.Uint32(raw[o.Off:])
	start, n = int(loc&0xffff), int(loc>>16)
	if o.Rel {
		// From the field's end: the cut moved both alike.
		start += o.Off + 4
	} else if start < 2+RingCut {
		return 0, 0, false
	} else {
		start -= RingCut
	}
	return start, n, start+n <= len(raw)
}

// tail returns the contexts and call chains at the start of tail, which
// must hold them and nothing more, and false when it does not.
func (l *Layout) tail(tail []byte) ([]byte, bool) {
	n := l.ctxLen
	if len(tail) < n {
		return nil, false
	}
	for _, bit := range []Stack{StackKernel, StackUser} {
		if l.Stack&bit == 0 {
			continue
		}
		if len(tail) < n+4 {
			return nil, false
		}
		k := int(binary.LittleEndian.Uint32(tail[n:]))
		if k > MaxStack || len(tail) < n+4+8*k {
			return nil, false
		}
		n += 4 + 8*k
	}
	return tail, n == len(tail)
}

// Adjust is how the consumer writes one field of a tracepoint otherwise
// than the kernel wrote it.
type Adjust struct {
	// Delta is added to the field, a 4-byte integer.
	Delta int32
	// Flags, when set, writes the field, an inline char array, as the
	// u32 Flags returns for its text (up to its first NUL): ftrace's
	// rwbs string as lttng-modules' integer, for one.
	Flags func(text []byte) uint32
}
