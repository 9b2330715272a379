package layout

import (
	"encoding/binary"
	"testing"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/relayfmt"
)

const dynFormat = `name: dyn
ID: 7
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:__data_loc char[] name;	offset:8;	size:4;	signed:0;
	field:u32 x;	offset:12;	size:4;	signed:0;
	field:__rel_loc u16[] vals;	offset:16;	size:4;	signed:0;
	field:u64 y;	offset:24;	size:8;	signed:0;

print fmt: ""
`

// TestLayoutTranscode builds a raw record with a __data_loc string and a
// __rel_loc array and checks the payload decodes to the same values in
// the class the layout declares.
func TestLayoutTranscode(t *testing.T) {
	f, err := tracefs.ParseFormat("t", []byte(dynFormat))
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Direct || len(l.Dyn) != 2 || l.Dyn[1] != 16|DynRel {
		t.Fatalf("layout %+v", l)
	}
	raw := make([]byte, 32, 64)
	binary.LittleEndian.PutUint16(raw[0:], 7)
	binary.LittleEndian.PutUint32(raw[4:], 1234)
	binary.LittleEndian.PutUint32(raw[12:], 0xabcdef)
	binary.LittleEndian.PutUint64(raw[24:], 1<<40)
	raw = append(raw, "hello\x00"...)                                // at 32, 6 bytes
	binary.LittleEndian.PutUint32(raw[8:], 32|6<<16)                 // data_loc: absolute
	raw = append(raw, 1, 0, 2, 0, 3, 0)                              // at 38, 3 x u16
	binary.LittleEndian.PutUint32(raw[16:], uint32(38-(16+4))|6<<16) // rel_loc: from the field's end
	got, vals := transcodeByName(t, l, raw)
	if _, ok := got["common_flags"]; ok {
		t.Error("common_flags is declared, but BPF cannot know it")
	}
	if got["common_type"].Uint(0) != 7 || got["common_pid"].Int(0) != 1234 || got["x"].Uint(0) != 0xabcdef || got["y"].Uint(0) != 1<<40 {
		t.Errorf("scalars wrong: %v", vals)
	}
	if string(got["name"].Text()) != "hello" {
		t.Errorf("name %q", got["name"].Text())
	}
	if v := got["vals"]; v.Len() != 3 || v.Uint(0) != 1 || v.Uint(2) != 3 {
		t.Errorf("vals %v", v)
	}
	// A location past the record's end is refused.
	bad := append([]byte(nil), raw...)
	binary.LittleEndian.PutUint32(bad[8:], 60|10<<16)
	if _, ok := l.Transcode(nil, ringRecord(bad)); ok {
		t.Error("transcode took a location outside the record")
	}
	if _, ok := l.Transcode(nil, ringRecord(raw[:20])); ok {
		t.Error("transcode took a short record")
	}
}

// TestLayoutStack: call chains behind a record's dynamic data (past the
// end of its last one, as kc_record measures it) become the class's
// callstack_kernel and callstack_user sequences; a tail that is not
// exactly the chains is refused.
func TestLayoutStack(t *testing.T) {
	f, err := tracefs.ParseFormat("t", []byte(dynFormat))
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.AddTail(nil, StackKernel|StackUser)
	raw := make([]byte, 32, 128)
	raw = append(raw, "hi\x00"...)
	binary.LittleEndian.PutUint32(raw[8:], 32|3<<16)
	binary.LittleEndian.PutUint32(raw[16:], 0)
	raw = binary.LittleEndian.AppendUint32(raw, 2)
	raw = binary.LittleEndian.AppendUint64(raw, 0xffffffff81000001)
	raw = binary.LittleEndian.AppendUint64(raw, 0xffffffff81000002)
	raw = binary.LittleEndian.AppendUint32(raw, 1)
	raw = binary.LittleEndian.AppendUint64(raw, 0x401000)
	got, _ := transcodeByName(t, l, raw)
	k, u := got[KernelStackField], got[UserStackField]
	if k.Len() != 2 || k.Uint(1) != 0xffffffff81000002 || u.Len() != 1 || u.Uint(0) != 0x401000 || !k.Field.Hex {
		t.Errorf("chains %v %v", k, u)
	}
	if string(got["name"].Text()) != "hi" {
		t.Errorf("name %q", got["name"].Text())
	}
	for _, bad := range [][]byte{raw[:len(raw)-1], append(append([]byte(nil), raw...), 0), raw[:35]} {
		if _, ok := l.Transcode(nil, ringRecord(bad)); ok {
			t.Errorf("transcode took a tail of %d bytes", len(bad)-35)
		}
	}
}

// FuzzTranscode: any raw record is transcoded into a payload its class
// decodes, or refused; never a panic; with call chains behind it too.
func FuzzTranscode(f *testing.F) {
	fm, err := tracefs.ParseFormat("t", []byte(dynFormat))
	if err != nil {
		f.Fatal(err)
	}
	var layouts []*Layout
	var classes []*relayfmt.EventClass
	for _, st := range []Stack{0, StackKernel, StackKernel | StackUser} {
		l, err := New(fm, nil)
		if err != nil {
			f.Fatal(err)
		}
		l.AddTail(nil, st)
		cls, err := relayfmt.NewEventClass(0, l.Name, l.Fields)
		if err != nil {
			f.Fatal(err)
		}
		layouts, classes = append(layouts, l), append(classes, cls)
	}
	f.Add(make([]byte, 32))
	f.Add(append(make([]byte, 32), "abc\x00"...))
	f.Add(append(make([]byte, 30), 1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8))
	f.Fuzz(func(t *testing.T, raw []byte) {
		for i, l := range layouts {
			p, ok := l.Transcode(nil, raw)
			if !ok {
				continue
			}
			if _, err := classes[i].Decode(p, nil); err != nil {
				t.Fatalf("transcoded payload does not decode: %v", err)
			}
		}
	})
}

// TestLayoutAdjust: a delta is added to its field wherever it lies (here
// after a string), the layout is no longer copied as it is, and a delta
// on a field that is not an inline 4-byte integer, or absent, is refused.
func TestLayoutAdjust(t *testing.T) {
	f, err := tracefs.ParseFormat("t", []byte(dynFormat))
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(f, map[string]Adjust{"x": {Delta: -100}, "common_pid": {Delta: 1}})
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 32, 64)
	binary.LittleEndian.PutUint32(raw[4:], 1234)
	binary.LittleEndian.PutUint32(raw[12:], 120)
	raw = append(raw, "hi\x00"...)
	binary.LittleEndian.PutUint32(raw[8:], 32|3<<16)
	got, _ := transcodeByName(t, l, raw)
	if got["x"].Uint(0) != 20 || got["common_pid"].Int(0) != 1235 || string(got["name"].Text()) != "hi" {
		t.Errorf("x %d (want 20), common_pid %d (want 1235), name %q", got["x"].Uint(0), got["common_pid"].Int(0), got["name"].Text())
	}
	for _, bad := range []map[string]Adjust{{"y": {Delta: 1}}, {"name": {Delta: 1}}, {"nope": {Delta: 1}}, {"x": {Flags: flagsLen}}} {
		if _, err := New(f, bad); err == nil {
			t.Errorf("adjust %v accepted", bad)
		}
	}
}

func flagsLen(text []byte) uint32 { return uint32(len(text)) + 100 }

const flagsFormat = `name: flags
ID: 8
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;
	field:unsigned int bytes;	offset:8;	size:4;	signed:0;
	field:char rwbs[10];	offset:12;	size:10;	signed:0;
	field:char comm[16];	offset:22;	size:16;	signed:0;

print fmt: ""
`

// TestLayoutFlags: a char array with Flags is written as the u32 the
// function returns for its text up to the NUL, declared as a u32, and the
// fields after it keep their values.
func TestLayoutFlags(t *testing.T) {
	f, err := tracefs.ParseFormat("t", []byte(flagsFormat))
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(f, map[string]Adjust{"rwbs": {Flags: flagsLen}})
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 38)
	binary.LittleEndian.PutUint32(raw[4:], 77)
	binary.LittleEndian.PutUint32(raw[8:], 4096)
	copy(raw[12:], "WS\x00junk")
	copy(raw[22:], "kcwork")
	got, vals := transcodeByName(t, l, raw)
	if rwbs := got["rwbs"]; rwbs.Field.Kind != relayfmt.Scalar || rwbs.Field.Elem != relayfmt.U32 || rwbs.Uint(0) != 102 {
		t.Errorf("rwbs %+v = %d, want a u32 of 102", rwbs.Field, rwbs.Uint(0))
	}
	if got["bytes"].Uint(0) != 4096 || string(got["comm"].Text()) != "kcwork" || got["common_pid"].Int(0) != 77 {
		t.Errorf("other fields wrong: %v", vals)
	}
}

// ringRecord returns the ring record the recorder writes for raw, a trace
// record as the kernel lays it out: raw without its bytes 2 and 3
// (RingCut).
func ringRecord(raw []byte) []byte {
	return append(append([]byte(nil), raw[:2]...), raw[2+RingCut:]...)
}

// transcodeByName transcodes the ring record of raw, a trace record,
// through l and decodes the payload by the class l declares: it returns
// the values by field name and in order, and fails the test when
// transcode refuses the record or its payload does not decode.
func transcodeByName(t *testing.T, l *Layout, raw []byte) (map[string]relayfmt.Value, []relayfmt.Value) {
	t.Helper()
	payload, ok := l.Transcode(nil, ringRecord(raw))
	if !ok {
		t.Fatal("transcode refused a good record")
	}
	cls, err := relayfmt.NewEventClass(0, l.Name, l.Fields)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := cls.Decode(payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]relayfmt.Value{}
	for _, v := range vals {
		got[v.Field.Name] = v
	}
	return got, vals
}
