package tracefs

import (
	"errors"
	"os"
	"strings"
	"testing"
)

const sampleSwitch = `name: sched_switch
ID: 372
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:char prev_comm[16];	offset:8;	size:16;	signed:0;
	field:pid_t prev_pid;	offset:24;	size:4;	signed:1;
	field:int prev_prio;	offset:28;	size:4;	signed:1;
	field:long prev_state;	offset:32;	size:8;	signed:1;
	field:char next_comm[TASK_COMM_LEN];	offset:40;	size:16;	signed:0;
	field:pid_t next_pid;	offset:56;	size:4;	signed:1;
	field:int next_prio;	offset:60;	size:4;	signed:1;
	field:__data_loc char[] name;	offset:64;	size:4;	signed:0;
	field:__rel_loc u64[] addrs;	offset:68;	size:4;	signed:0;
	field:u32 buf[];	offset:72;	size:0;	signed:0;

print fmt: "prev_comm=%s", REC->prev_comm
`

func TestParseFormat(t *testing.T) {
	f, err := ParseFormat("sched", []byte(sampleSwitch))
	if err != nil {
		t.Fatal(err)
	}
	if f.FullName() != "sched:sched_switch" || f.ID != 372 || len(f.Common) != 4 || len(f.Fields) != 9 {
		t.Fatalf("got %s id %d, %d common, %d fields", f.FullName(), f.ID, len(f.Common), len(f.Fields))
	}
	want := []struct {
		name, typ         string
		off, size, arrLen int
		signed            bool
		loc               Loc
	}{
		{"prev_comm", "char", 8, 16, 16, false, Inline},
		{"prev_pid", "pid_t", 24, 4, 0, true, Inline},
		{"prev_state", "long", 32, 8, 0, true, Inline},
		{"next_comm", "char", 40, 16, 16, false, Inline},
		{"name", "char", 64, 4, -1, false, DataLoc},
		{"addrs", "u64", 68, 4, -1, false, RelLoc},
	}
	byName := map[string]Field{}
	for _, fl := range f.All() {
		byName[fl.Name] = fl
	}
	for _, w := range want {
		fl, ok := byName[w.name]
		if !ok {
			t.Errorf("field %s missing", w.name)
			continue
		}
		if fl.Type != w.typ || fl.Offset != w.off || fl.Size != w.size || fl.ArrayLen != w.arrLen || fl.Signed != w.signed || fl.Loc != w.loc {
			t.Errorf("field %s = %+v, want %+v", w.name, fl, w)
		}
	}
	if !byName["next_comm"].IsChar() || byName["prev_pid"].IsChar() {
		t.Error("IsChar wrong")
	}
	if es := byName["addrs"].ElemSize(); es != 8 {
		t.Errorf("addrs elem size %d, want 8", es)
	}
	if f.FixedSize() != 72 {
		t.Errorf("FixedSize %d, want 72", f.FixedSize())
	}
	if len(f.Skipped) != 1 || f.Skipped[0] != "buf" {
		t.Errorf("Skipped %v, want [buf]", f.Skipped)
	}
}

// TestParseFormat510 reads 5.10's quirks: array sizes written as
// expressions, and regmap:regcache_sync's two fields named "type".
func TestParseFormat510(t *testing.T) {
	text := `name: quirks
ID: 7
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;

	field:__data_loc char[] type;	offset:8;	size:4;	signed:1;
	field:int type;	offset:12;	size:4;	signed:1;
	field:__u8 buf[32 + 2];	offset:16;	size:34;	signed:0;
	field:__u8 saddr[sizeof(struct sockaddr_in6)];	offset:50;	size:28;	signed:0;

print fmt: "x"
`
	f, err := ParseFormat("s", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name string
		n    int
	}{{"type", -1}, {"type_2", 0}, {"buf", 34}, {"saddr", 28}}
	if len(f.Fields) != len(want) {
		t.Fatalf("fields %+v", f.Fields)
	}
	for i, w := range want {
		if f.Fields[i].Name != w.name || f.Fields[i].ArrayLen != w.n {
			t.Errorf("field %d = %s[%d], want %s[%d]", i, f.Fields[i].Name, f.Fields[i].ArrayLen, w.name, w.n)
		}
	}
}

func TestParseFormatErrors(t *testing.T) {
	base := "name: e\nID: 1\nformat:\n"
	cases := map[string]string{
		"no ID":      "name: e\nformat:\n\tfield:int a;\toffset:0;\tsize:4;\tsigned:1;\n",
		"bad offset": base + "\tfield:int a;\toffset:x;\tsize:4;\tsigned:1;\n",
		"no size":    base + "\tfield:int a;\toffset:0;\n",
		"no name":    base + "\tfield:int;\toffset:0;\tsize:4;\tsigned:1;\n",
		"overlap":    base + "\tfield:int a;\toffset:0;\tsize:4;\tsigned:1;\n\tfield:int b;\toffset:2;\tsize:4;\tsigned:1;\n",
		"unbalanced": base + "\tfield:char a]];\toffset:0;\tsize:4;\tsigned:1;\n",
		"too large":  base + "\tfield:char a[9000];\toffset:0;\tsize:9000;\tsigned:0;\n",
		"bad array":  base + "\tfield:int a[3];\toffset:0;\tsize:10;\tsigned:1;\n",
		"loc size":   base + "\tfield:__data_loc char[] a;\toffset:0;\tsize:8;\tsigned:0;\n",
		"not ident":  base + "\tfield:int a-b;\toffset:0;\tsize:4;\tsigned:1;\n",
		"bad ID":     "name: e\nID: -3\nformat:\n",
	}
	for name, text := range cases {
		if _, err := ParseFormat("s", []byte(text)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestParseHostFormats parses every format file of the running kernel: the
// parser must read what the kernel prints, all of it.
func TestParseHostFormats(t *testing.T) {
	fs, err := Find()
	if err != nil {
		if os.Getenv("KCONSUME_STRICT") != "" && os.Geteuid() == 0 {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	evs, err := fs.Events("*:*")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 100 {
		t.Fatalf("only %d events in %s", len(evs), fs.Root)
	}
	parsed := 0
	for _, e := range evs {
		f, err := fs.Format(e)
		if err != nil {
			// Tests of other packages, running at the same time,
			// delete the probe events they defined.
			if os.IsPermission(err) || errors.Is(err, os.ErrNotExist) {
				continue
			}
			t.Errorf("%v", err)
			continue
		}
		if f.Name != e.Name || f.System != e.System {
			t.Errorf("%s parsed as %s", e, f.FullName())
		}
		parsed++
	}
	t.Logf("%d formats parsed", parsed)
}

func TestEvents(t *testing.T) {
	fs, err := Find()
	if err != nil {
		t.Skip(err)
	}
	sw, err := fs.Events("sched:sched_switch")
	if err != nil || len(sw) != 1 || sw[0].String() != "sched:sched_switch" {
		t.Fatalf("sched:sched_switch → %v, %v", sw, err)
	}
	all, err := fs.Events("sched:*")
	if err != nil || len(all) < 5 {
		t.Fatalf("sched:* → %d events, %v", len(all), err)
	}
	bare, err := fs.Events("sched_switch")
	if err != nil || len(bare) != 1 {
		t.Fatalf("sched_switch → %v, %v", bare, err)
	}
	none, err := fs.Events("nosuch:*")
	if err != nil || len(none) != 0 {
		t.Fatalf("nosuch:* → %v, %v", none, err)
	}
	for _, bad := range []string{"sched:[", "a/b:c", ":x", "x:"} {
		if _, err := fs.Events(bad); err == nil || !strings.Contains(err.Error(), "event") {
			t.Errorf("%q: error %v", bad, err)
		}
	}
}
