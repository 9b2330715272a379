package synth

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

func TestParse(t *testing.T) {
	e, err := Parse("wakeup_latency  u64 lat; pid_t pid; char comm[16]; char[] why ; s16 v[3]; unsigned int flags;")
	if err != nil {
		t.Fatal(err)
	}
	want := "wakeup_latency u64 lat; pid_t pid; char comm[16]; char why[]; s16 v[3]; unsigned int flags"
	if e.String() != want {
		t.Fatalf("String() = %q, want %q", e.String(), want)
	}
	if again, err := Parse(e.String()); err != nil || again.String() != want {
		t.Fatalf("round trip: %v %v", again, err)
	}
	if e.Field("v") != 4 || e.Field("nope") != -1 {
		t.Fatal("Field lookup")
	}
}

func TestDefinitionErrors(t *testing.T) {
	many := make([]string, MaxFields+1)
	for i := range many {
		many[i] = "u8 f" + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)
	}
	cases := map[string]string{
		"unknown type":   "e float x",
		"missing size":   "e char comm",
		"bad size":       "e u32 a[0]",
		"huge size":      "e u32 a[100000]",
		"not a number":   "e u32 a[N]",
		"unclosed":       "e u32 a[3",
		"int string":     "e u32 a[]",
		"duplicate":      "e u32 a; u64 a",
		"bad event name": "9e u32 a",
		"bad field name": "e u32 a-b",
		"no fields":      "e",
		"no name":        "e u32",
		"too many":       "e " + strings.Join(many, "; "),
	}
	for name, def := range cases {
		_, err := Parse(def)
		if !errors.Is(err, ErrDefinition) {
			t.Errorf("%s: %q: %v, want ErrDefinition", name, def, err)
		}
		if name == "too many" && (err == nil || !strings.Contains(err.Error(), "64")) {
			t.Errorf("too many: %v does not say the limit", err)
		}
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
	want := []string{"42 kworker/0:1-a-v -5 123456789 0 woken 3", "-1 sh 120 7 1 by name 6"}
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

func FuzzParse(f *testing.F) {
	f.Add("wakeup_latency u64 lat; pid_t pid; char comm[16]")
	f.Add("e char[] s; u8 a[3]")
	f.Fuzz(func(t *testing.T, def string) {
		e, err := Parse(def)
		if err != nil {
			return
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
