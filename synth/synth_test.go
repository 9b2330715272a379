package synth

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

func TestParse(t *testing.T) {
	e, err := Parse("wakeup_latency  u64 lat; pid_t pid; char comm[16]; char[] why ; s16 v[3]; unsigned int flags; unsigned long[] stack; bool ok;")
	if err != nil {
		t.Fatal(err)
	}
	want := "wakeup_latency u64 lat; pid_t pid; char[16] comm; char[] why; s16[3] v; unsigned int flags; unsigned long[] stack; bool ok"
	if e.String() != want {
		t.Fatalf("String() = %q, want %q", e.String(), want)
	}
	if l := e.Listing(); l != strings.Replace(want, " ", "\t", 1) {
		t.Fatalf("Listing() = %q", l)
	}
	if again, err := Parse(e.String()); err != nil || again.String() != want {
		t.Fatalf("round trip: %v %v", again, err)
	}
	if e.Field("v") != 4 || e.Field("nope") != -1 || e.Field("_stack_length") != -1 {
		t.Fatal("Field lookup")
	}
}

// TestKernelTypes holds each type's size and signedness to the kernel's
// synth_field_size and synth_field_signed (64-bit).
func TestKernelTypes(t *testing.T) {
	cases := []struct {
		decl, typ string
		kind      Kind
		size      int
		signed    bool
		elem      relayfmt.IntType
	}{
		{"u8 f", "u8", Int, 1, false, relayfmt.U8}, {"s8 f", "s8", Int, 1, true, relayfmt.S8},
		{"u16 f", "u16", Int, 2, false, relayfmt.U16}, {"s16 f", "s16", Int, 2, true, relayfmt.S16},
		{"u32 f", "u32", Int, 4, false, relayfmt.U32}, {"s32 f", "s32", Int, 4, true, relayfmt.S32},
		{"u64 f", "u64", Int, 8, false, relayfmt.U64}, {"s64 f", "s64", Int, 8, true, relayfmt.S64},
		{"char f", "char", Int, 1, true, relayfmt.S8}, {"unsigned char f", "unsigned char", Int, 1, false, relayfmt.U8},
		{"int f", "int", Int, 4, true, relayfmt.S32}, {"unsigned int f", "unsigned int", Int, 4, false, relayfmt.U32},
		{"long f", "long", Int, 8, true, relayfmt.S64}, {"unsigned long f", "unsigned long", Int, 8, false, relayfmt.U64},
		{"bool f", "bool", Int, 1, true, relayfmt.S8}, {"pid_t f", "pid_t", Int, 4, true, relayfmt.S32},
		{"gfp_t f", "gfp_t", Int, 4, false, relayfmt.U32},
		{"char f[16]", "char[16]", Text, 16, true, relayfmt.U8}, {"unsigned char[8] f", "unsigned char[8]", Text, 8, false, relayfmt.U8},
		{"char f[010]", "char[010]", Text, 8, true, relayfmt.U8}, {"char f[0]", "char[0]", String, 8, true, 0},
		{"char[] f", "char[]", String, 8, true, 0}, {"unsigned long f[]", "unsigned long[]", Stack, 8, true, relayfmt.U64},
		{"long[4] f", "long[4]", Stack, 8, true, relayfmt.S64}, {"u16 f[4]", "u16[4]", Array, 8, false, relayfmt.U16},
		{"gfp_t[2] f", "gfp_t[2]", Array, 8, false, relayfmt.U32},
	}
	for _, c := range cases {
		e, err := Parse("e " + c.decl)
		if err != nil {
			t.Errorf("%s: %v", c.decl, err)
			continue
		}
		f := e.Fields[0]
		if f.Type != c.typ || f.Kind != c.kind || f.Size != c.size || f.Signed != c.signed || f.Elem != c.elem || f.Name != "f" {
			t.Errorf("%s: %+v, want type %q kind %d size %d signed %v elem %v", c.decl, f, c.typ, c.kind, c.size, c.signed, c.elem)
		}
	}
}

// TestDefinitionTable holds the parser to the kernel's verdicts on the
// table of definitions (table_test.go), and kconsume's own verdict to the
// kernel's but for the listed extensions and refusals.
func TestDefinitionTable(t *testing.T) {
	for _, c := range defTable() {
		k, kerr := parse(c.def, false)
		if (kerr == nil) != c.kernel {
			t.Errorf("%q: kernel language: %v, the kernel's verdict is accept=%v", short(c.def), kerr, c.kernel)
		}
		wantKC := c.kernel
		switch c.kc {
		case "ext":
			wantKC = true
		case "refuse":
			wantKC = false
		}
		e, err := Parse(c.def)
		if (err == nil) != wantKC {
			t.Errorf("%q: Parse: %v, want accept=%v", short(c.def), err, wantKC)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrDefinition) || !strings.Contains(err.Error(), c.why) {
				t.Errorf("%q: %v, want ErrDefinition saying %q", short(c.def), err, c.why)
			}
			continue
		}
		if k != nil && k.String() != e.String() {
			t.Errorf("%q: kernel language reads %q, kconsume %q", short(c.def), k, e)
		}
		again, err := Parse(e.String())
		if err != nil || again.String() != e.String() {
			t.Errorf("%q: reads as %q, which reads back as %v, %v", short(c.def), e, again, err)
		}
		if _, err := relayfmt.NewEventClass(1, "synthetic:"+e.Name, e.RelayFields()); err != nil {
			t.Errorf("%q: relayfmt refuses it: %v", short(c.def), err)
		}
	}
}

func short(s string) string {
	if len(s) > 80 {
		return s[:60] + "…" + s[len(s)-16:]
	}
	return s
}

func TestDefinitionErrors(t *testing.T) {
	cases := map[string]struct{ def, says string }{
		"unknown type":   {"e float x", `field x: unknown type "float"`},
		"bad size":       {"e u32 a[0]", "field a: type u32[0]: array size"},
		"huge size":      {"e u32 a[100000]", "1..4096"},
		"big char":       {"e char s[257]", "field s: type char[257]: array size 257 over the kernel's 256"},
		"not a number":   {"e u32 a[N]", "array size"},
		"unclosed":       {"e char s[3", "field s: type char[3: invalid array specification"},
		"int string":     {"e u32 a[]", "only char[] and long[] can be dynamic"},
		"duplicate":      {"e u32 a; u64 a", "field a: duplicate field name"},
		"bad event name": {"9e u32 a", `event name "9e": illegal name`},
		"bad field name": {"e u32 a-b", `field "a-b": illegal name`},
		"no fields":      {"e", "want NAME TYPE FIELD"},
		"no name":        {"e u32 a; u32", `type "u32" has no field name`},
		"unsigned":       {"e u32 a unsigned int", "incomplete type"},
		"empty":          {"  ", "empty definition"},
	}
	for name, c := range cases {
		_, err := Parse(c.def)
		if !errors.Is(err, ErrDefinition) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %q: %v, want ErrDefinition saying %q", name, c.def, err, c.says)
		}
	}
	many := make([]string, MaxFields+1)
	for i := range many {
		many[i] = fmt.Sprintf("u8 f%d", i)
	}
	if _, err := Parse("e " + strings.Join(many, "; ")); err == nil || !strings.Contains(err.Error(), "field f64: too many fields (the kernel's limit is 64)") {
		t.Errorf("65 fields: %v", err)
	}
}

// TestCreateFields is the seed's one-call creation from {type, name}
// pairs (synth_event_create), and its errors.
func TestCreateFields(t *testing.T) {
	e, err := CreateFields("seed", []FieldDesc{{"pid_t", "next_pid_field"}, {"char[16]", "next_comm_field"},
		{"u64", "ts_ns"}, {"u64", "ts_ms"}, {"unsigned int", "cpu"}, {"char[64]", "my_string_field"}, {"int", "my_int_field"},
		{"unsigned long[]", "stack"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "seed pid_t next_pid_field; char[16] next_comm_field; u64 ts_ns; u64 ts_ms; unsigned int cpu; char[64] my_string_field; int my_int_field; unsigned long[] stack"
	if e.String() != want || !e.Final() {
		t.Fatalf("%q, want %q", e, want)
	}
	for _, bad := range [][]FieldDesc{{{"u32", "a"}, {"u32", "a"}}, {{"", "a"}}, {{"u32", ""}}, {{"u32", "a; u32 b"}},
		{{"u32", "a b"}}, {{"short", "a"}}, {{"char[300]", "s"}}, {}} {
		if _, err := CreateFields("seed", bad); !errors.Is(err, ErrDefinition) {
			t.Errorf("%v: %v, want ErrDefinition", bad, err)
		}
	}
	p, _ := New("piece")
	if err := p.AddFieldDesc(FieldDesc{"char[16]", "comm"}); err != nil {
		t.Fatal(err)
	}
	if err := p.AddFieldDesc(FieldDesc{"u32", "comm"}); err == nil || len(p.Fields) != 1 {
		t.Fatalf("duplicate by AddFieldDesc: %v", err)
	}
}

func TestPiecewiseDefinition(t *testing.T) {
	e, err := New("mark")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.AddField("u32 a"); err != nil {
		t.Fatal(err)
	}
	if err := e.AddFields("u64 b", "bogus c"); err == nil || len(e.Fields) != 1 {
		t.Fatalf("AddFields with a bad field: %v, %d fields (want none added)", err, len(e.Fields))
	}
	if err := e.AddFields("u64 b", "char[] s"); err != nil {
		t.Fatal(err)
	}
	if e.Final() {
		t.Fatal("final before Finalize")
	}
	if _, err := e.Encode(nil, 1, 2, "x"); err == nil {
		t.Fatal("Encode before Finalize")
	}
	if err := e.Finalize(); err != nil {
		t.Fatal(err)
	}
	if err := e.AddField("u8 late"); err == nil {
		t.Fatal("AddField after Finalize")
	}
	empty, _ := New("empty")
	if err := empty.Finalize(); err == nil {
		t.Fatal("Finalize without fields")
	}
}

func TestGenerateErrors(t *testing.T) {
	e, err := Create("m", "u8 a", "s16 b", "char c[4]", "u32 d[2]", "char s[]")
	if err != nil {
		t.Fatal(err)
	}
	good := []any{uint8(1), -2, "abc", []int{1, 2}, "str"}
	if _, err := e.Encode(nil, good...); err != nil {
		t.Fatal(err)
	}
	bad := map[string][]any{
		"count":      good[:4],
		"range":      {256, -2, "abc", []int{1, 2}, "s"},
		"negative":   {-1, -2, "abc", []int{1, 2}, "s"},
		"type":       {1, "x", "abc", []int{1, 2}, "s"},
		"array len":  {1, 2, "abc", []int{1}, "s"},
		"char type":  {1, 2, 3, []int{1, 2}, "s"},
		"s16 range":  {1, 40000, "abc", []int{1, 2}, "s"},
		"array elem": {1, 2, "abc", []any{1, "x"}, "s"},
	}
	for name, vals := range bad {
		if _, err := e.Encode(nil, vals...); !errors.Is(err, ErrValue) {
			t.Errorf("%s: %v, want ErrValue", name, err)
		}
	}

	// Piecewise: mixing, twice, unset, a failed set, End twice.
	b := e.Start()
	b.Next(1)
	if err := b.Set("b", 2); err == nil {
		t.Error("Set after Next accepted")
	}
	if _, err := b.End(nil); err == nil {
		t.Error("End after a mixed event succeeded")
	}
	if _, err := b.End(nil); err == nil {
		t.Error("End twice accepted")
	}
	b = e.Start()
	b.Set("a", 1)
	if err := b.Set("a", 2); err == nil {
		t.Error("a field set twice")
	}
	b.End(nil)
	b = e.Start()
	for _, v := range good[:4] {
		if err := b.Next(v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.End(nil); err == nil || !strings.Contains(err.Error(), "field s unset") {
		t.Errorf("unset field: %v", err)
	}
	b = e.Start()
	if err := b.Next("not a number"); err == nil {
		t.Error("bad Next accepted")
	}
	for _, v := range good[1:] {
		b.Next(v)
	}
	if _, err := b.End(nil); err == nil {
		t.Error("End after a failed set succeeded")
	}
	b = e.Start()
	if err := b.Set("nosuch", 1); err == nil {
		t.Error("unknown field accepted")
	}
}

// TestPayloadDecodes writes events built every way into a relayfmt
// channel and reads them back with our reader and babeltrace2.
func TestPayloadDecodes(t *testing.T) {
	e, err := Parse("wakeup_latency pid_t pid; char comm[16]; s32 prio; u64 latency_ns; u32 cpu; char why[]; u16 hist[3]")
	if err != nil {
		t.Fatal(err)
	}
	dir, ch, cls := eventChannel(t, e)
	p1, err := e.Encode(nil, 42, "kworker/0:1-a-very-long-name", -5, uint64(123456789), 0, "woken", []uint16{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	b := e.Start()
	for _, kv := range [][2]any{{"why", "by name"}, {"hist", []int{4, 5, 6}}, {"cpu", 1}, {"latency_ns", 7}, {"prio", 120}, {"comm", "sh"}, {"pid", -1}} {
		if err := b.Set(kv[0].(string), kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	p2, err := b.End(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range [][]byte{p1, p2} {
		if err := ch.Write(0, uint64(1000+i), cls.ID, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	tr, err := relayfmt.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tr.Merge()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var got []string
	var vals []relayfmt.Value
	for m.Next() {
		if vals, err = m.Item().Fields(vals); err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Join([]string{
			itoa(vals[0].Int(0)), string(vals[1].Text()), itoa(vals[2].Int(0)), utoa(vals[3].Uint(0)),
			utoa(vals[4].Uint(0)), string(vals[5].Text()), utoa(vals[6].Uint(2))}, " "))
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{"42 kworker/0:1-a-ve -5 123456789 0 woken 3", "-1 sh 120 7 1 by name 6"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("read back %q, want %q", got, want)
	}
	out, err := exec.Command(testenv.BT2(t), dir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `why = "by name"`) || !strings.Contains(string(out), "latency_ns = 123456789") {
		t.Fatalf("babeltrace2: %v\n%s", err, out)
	}
}

func itoa(i int64) string  { return strconv.FormatInt(i, 10) }
func utoa(u uint64) string { return strconv.FormatUint(u, 10) }

// FuzzParse holds the parser on any input: no panic; what it accepts
// reads back alike and relayfmt takes; and it parts from the kernel's
// language only where docs/synthetic-events.md says: integer arrays accepted, and
// duplicate, too long, non-ASCII or stack-count names refused.
func FuzzParse(f *testing.F) {
	f.Add("wakeup_latency u64 lat; pid_t pid; char comm[16]")
	f.Add("e char[] s; u8 a[3]")
	f.Add("e unsigned long[] stack; char[010] s # c")
	f.Add("seed char[16] next_comm_field; unsigned int cpu")
	for _, c := range defTable() {
		if len(c.def) < 300 {
			f.Add(c.def)
		}
	}
	f.Fuzz(func(t *testing.T, def string) {
		k, kerr := parse(def, false)
		e, err := Parse(def)
		if err != nil {
			if kerr == nil && !refusedOnPurpose(err) {
				t.Fatalf("%q: the kernel's language takes it as %q, kconsume refuses it: %v", def, k, err)
			}
			return
		}
		if kerr != nil && !slices.ContainsFunc(e.Fields, func(f Field) bool { return f.Kind == Array }) {
			t.Fatalf("%q: kconsume takes it as %q without an extension; the kernel's language refuses it: %v", def, e, kerr)
		}
		again, err := Parse(e.String())
		if err != nil || again.String() != e.String() {
			t.Fatalf("%q parsed as %q, which reparses as %v, %v", def, e.String(), again, err)
		}
		if _, err := relayfmt.NewEventClass(1, "synthetic:"+e.Name, e.RelayFields()); err != nil {
			t.Fatalf("%q: relayfmt refuses the fields: %v", def, err)
		}
	})
}

func refusedOnPurpose(err error) bool {
	for _, why := range []string{"duplicate field name", "not ASCII", "the kernel allows longer", "count in the trace", "which is taken"} {
		if strings.Contains(err.Error(), why) {
			return true
		}
	}
	return false
}

// TestKernelTypesDecode writes an event of every kind of field the
// kernel knows, a stack included, and holds babeltrace2's reading of it:
// numbers as the kernel prints them (bool 0/1, char as a number), the
// stack as a sequence of addresses after its count, char[N] cut at N.
func TestKernelTypesDecode(t *testing.T) {
	e, err := CreateFields("kinds", []FieldDesc{{"bool", "ok"}, {"char", "c"}, {"unsigned char", "uc"}, {"long", "l"},
		{"unsigned long", "ul"}, {"gfp_t", "gfp"}, {"unsigned long[]", "stack"}, {"char[4]", "tag"}, {"long[]", "empty"},
		{"u16[2]", "pair"}})
	if err != nil {
		t.Fatal(err)
	}
	stack := []uint64{0xffffffff81000010, 0xffffffff81abcdef, 0x7f0000001000}
	p, err := e.Trace(true, -1, "A", int64(-5), uint64(1<<63), 0xcc0, stack, "truncated", []int{}, []int{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	b := e.Start()
	for _, v := range []any{false, "z", 255, 7, 8, 0, []uintptr{0xffffffff81000020}, "ab", []int64{-1}, []uint16{3, 4}} {
		if err := b.Next(v); err != nil {
			t.Fatal(err)
		}
	}
	p2, err := b.End(nil)
	if err != nil {
		t.Fatal(err)
	}
	dir, ch, cls := eventChannel(t, e)
	for i, pl := range [][]byte{p, p2} {
		if len(pl) > e.MaxPayload() {
			t.Fatalf("payload %d bytes over MaxPayload %d", len(pl), e.MaxPayload())
		}
		if err := ch.Write(0, uint64(100+i), cls.ID, pl); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	lines, _ := testenv.RunBT2(t, dir)
	want := []string{
		`{ ok = 1, c = -1, uc = 65, l = -5, ul = 9223372036854775808, gfp = 3264, _stack_length = 3, stack = [ [0] = 18446744071578845200, [1] = 18446744071590104559, [2] = 139637976731648 ], tag = "trun", _empty_length = 0, empty = [ ], pair = [ [0] = 1, [1] = 2 ] }`,
		`{ ok = 0, c = 122, uc = 255, l = 7, ul = 8, gfp = 0, _stack_length = 1, stack = [ [0] = 18446744071578845216 ], tag = "ab", _empty_length = 1, empty = [ [0] = -1 ], pair = [ [0] = 3, [1] = 4 ] }`,
	}
	if len(lines) != 2 {
		t.Fatalf("babeltrace2: %q", lines)
	}
	for i, l := range lines {
		if !strings.HasSuffix(l, want[i]) {
			t.Errorf("babeltrace2 line %d:\n%s\nwant it to end in\n%s", i, l, want[i])
		}
	}
}

// TestEmitValues is synth emit's reading of values for every kind.
func TestEmitValues(t *testing.T) {
	e, err := Parse("v bool b; char c; unsigned long[] st; char[4] s; u8[2] a; gfp_t g")
	if err != nil {
		t.Fatal(err)
	}
	good := []string{"true", "x", "0xffffffff81000010, 0x10", "abcdef", "1,2", "0xcc0"}
	vals := make([]any, len(good))
	for i, s := range good {
		if vals[i], err = ParseValue(e.Fields[i], s); err != nil {
			t.Fatalf("%s=%q: %v", e.Fields[i].Name, s, err)
		}
	}
	if _, err := e.Encode(nil, vals...); err != nil {
		t.Fatal(err)
	}
	if v, err := ParseValue(e.Fields[2], ""); err != nil || len(v.([]uint64)) != 0 {
		t.Errorf("empty stack: %v %v", v, err)
	}
	bad := map[int]string{0: "maybe", 1: "300", 2: "0xffffffff81000010,kernel", 4: "1", 5: "-1"}
	for i, s := range bad {
		if _, err := ParseValue(e.Fields[i], s); !errors.Is(err, ErrValue) || !strings.Contains(err.Error(), e.Fields[i].Name) {
			t.Errorf("%s=%q: %v, want ErrValue naming the field", e.Fields[i].Name, s, err)
		}
	}
	if _, err := ParseValue(e.Fields[2], strings.Repeat("1,", MaxStack)+"1"); !errors.Is(err, ErrValue) {
		t.Errorf("%d addresses: %v", MaxStack+1, err)
	}
}

// TestSeedGeneration is the kernel's synth_event_gen_test done with our
// API: values in field order (synth_event_trace, _array), by next value
// and by name, and the seed's errors.
func TestSeedGeneration(t *testing.T) {
	e, err := CreateFields("gen_synth_test", []FieldDesc{{"pid_t", "next_pid_field"}, {"char[16]", "next_comm_field"},
		{"u64", "ts_ns"}, {"u64", "ts_ms"}, {"unsigned int", "cpu"}, {"char[64]", "my_string_field"}, {"int", "my_int_field"}})
	if err != nil {
		t.Fatal(err)
	}
	vals := []any{777, "hula hoops, a very long comm", 1000000, 1000, 1, "thneed", 598}
	p1, err := e.Trace(vals...)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := e.TraceArray(vals)
	if err != nil || !bytes.Equal(p1, p2) {
		t.Fatalf("TraceArray: %v, or a different payload", err)
	}
	// char[16] keeps 16 bytes of the longer value.
	if got := string(p1[4 : 4+16]); got != "hula hoops, a ve" {
		t.Fatalf("char[16] holds %q", got)
	}
	next := e.Start()
	for _, v := range vals {
		if err := next.Next(v); err != nil {
			t.Fatal(err)
		}
	}
	p3, err := next.End(nil)
	if err != nil || !bytes.Equal(p1, p3) {
		t.Fatalf("by next value: %v, or a different payload", err)
	}
	byName := e.Start()
	for i := len(vals) - 1; i >= 0; i-- {
		if err := byName.Set(e.Fields[i].Name, vals[i]); err != nil {
			t.Fatal(err)
		}
	}
	if p4, err := byName.End(nil); err != nil || !bytes.Equal(p1, p4) {
		t.Fatalf("by name: %v, or a different payload", err)
	}
	for name, err := range map[string]error{
		"too few":  func() error { _, err := e.Trace(vals[:6]...); return err }(),
		"too many": func() error { _, err := e.TraceArray(append(vals[:7:7], 1)); return err }(),
		"mixed": func() error {
			b := e.Start()
			b.Set("cpu", 1)
			return b.Next(777)
		}(),
		"unknown": func() error { return e.Start().Set("nosuch", 1) }(),
		"past the last": func() error {
			b := e.Start()
			for _, v := range vals {
				b.Next(v)
			}
			return b.Next(1)
		}(),
	} {
		if !errors.Is(err, ErrValue) {
			t.Errorf("%s: %v, want ErrValue", name, err)
		}
	}
}

// eventChannel returns a one-CPU channel writing into a new directory,
// with e declared as synthetic:NAME.
func eventChannel(t *testing.T, e *Event) (string, *relayfmt.Channel, *relayfmt.EventClass) {
	t.Helper()
	dir := t.TempDir()
	sink, err := relayfmt.NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1}, sink)
	if err != nil {
		t.Fatal(err)
	}
	cls, err := ch.AddEventClass("synthetic:"+e.Name, e.RelayFields())
	if err != nil {
		t.Fatal(err)
	}
	return dir, ch, cls
}
