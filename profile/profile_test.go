package profile

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

func TestLookup(t *testing.T) {
	for _, n := range []string{"", "ftrace", "lttng"} {
		p, err := Lookup(n)
		if err != nil || p == nil {
			t.Fatalf("Lookup(%q): %v", n, err)
		}
	}
	if p, _ := Lookup(""); p != Ftrace {
		t.Errorf("default profile %s, want ftrace", p.Name)
	}
	_, err := Lookup("ctf")
	if err == nil || !strings.Contains(err.Error(), `"ctf"`) || !strings.Contains(err.Error(), "ftrace, lttng") {
		t.Fatalf("Lookup(ctf): %v, want an error naming it and listing ftrace, lttng", err)
	}
}

// TestNamesRoundTrip: every LTTng name the profile gives leads back to
// the ftrace name it came from, and no two ftrace events share one.
func TestNamesRoundTrip(t *testing.T) {
	names := []string{"syscalls:sys_enter_read", "syscalls:sys_exit_openat", "synthetic:lttng_statedump_process_state"}
	for _, m := range Mappings() {
		names = append(names, m.Ftrace)
	}
	seen := map[string]string{}
	for _, n := range names {
		l, _, ok := LTTng.EventName(n)
		if !ok {
			t.Fatalf("%s is not renamed", n)
		}
		if prev, dup := seen[l]; dup {
			t.Fatalf("%s and %s both become %s", prev, n, l)
		}
		seen[l] = n
		if back, ok := LTTng.Original(l); !ok || back != n {
			t.Errorf("Original(%s) = %s, %v; want %s", l, back, ok, n)
		}
		if strings.Contains(l, ":") || !relayfmt.IsIdent(l) {
			t.Errorf("%s: LTTng name %q is not an identifier", n, l)
		}
	}
	for _, n := range []string{"sched:sched_process_fork", "block:block_io_start", "synthetic:klog", "syscalls:sys_enter_"} {
		if l, _, ok := LTTng.EventName(n); ok {
			t.Errorf("%s renamed to %s; it has no LTTng counterpart here", n, l)
		}
	}
	if _, _, ok := Ftrace.EventName("sched:sched_switch"); ok {
		t.Error("ftrace renames")
	}
}

// switchFields is sched_switch as the consumer lays it out from tracefs.
var switchFields = []relayfmt.Field{
	relayfmt.ScalarField("common_type", relayfmt.U16),
	relayfmt.ScalarField("common_pid", relayfmt.S32),
	relayfmt.CharArrayField("prev_comm", 16),
	relayfmt.ScalarField("prev_pid", relayfmt.S32),
	relayfmt.ScalarField("prev_prio", relayfmt.S32),
	relayfmt.ScalarField("prev_state", relayfmt.S64),
	relayfmt.CharArrayField("next_comm", 16),
	relayfmt.ScalarField("next_pid", relayfmt.S32),
	relayfmt.ScalarField("next_prio", relayfmt.S32),
}

// writeTrace writes a two-event trace through p's sink into dir and
// returns the sched_switch payload it wrote.
func writeTrace(t *testing.T, p *Profile, dir string) []byte {
	t.Helper()
	ds, err := relayfmt.NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	env, err := LTTngEnv("unit", time.Unix(1700000000, 0).UTC())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1, Clock: relayfmt.Clock{Name: "monotonic"}}, p.Sink(ds, env))
	if err != nil {
		t.Fatal(err)
	}
	sw, err := ch.AddEventClass("sched:sched_switch", switchFields)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := ch.AddEventClass("syscalls:sys_exit_read", []relayfmt.Field{relayfmt.ScalarField("__syscall_nr", relayfmt.S32), relayfmt.ScalarField("ret", relayfmt.S64)})
	if err != nil {
		t.Fatal(err)
	}
	fork, err := ch.AddEventClass("sched:sched_process_fork", []relayfmt.Field{relayfmt.ScalarField("parent_pid", relayfmt.S32), relayfmt.ScalarField("child_pid", relayfmt.S32)})
	if err != nil {
		t.Fatal(err)
	}
	pl := make([]byte, 0, 64)
	pl = binary.LittleEndian.AppendUint16(pl, 300)
	pl = binary.LittleEndian.AppendUint32(pl, 7)
	pl = append(pl, "prev\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"...)
	pl = binary.LittleEndian.AppendUint32(pl, 7)
	pl = binary.LittleEndian.AppendUint32(pl, 120)
	pl = binary.LittleEndian.AppendUint64(pl, 1)
	pl = append(pl, "next\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"...)
	pl = binary.LittleEndian.AppendUint32(pl, 9)
	pl = binary.LittleEndian.AppendUint32(pl, 120)
	if err := ch.Write(0, 1000, sw.ID, pl); err != nil {
		t.Fatal(err)
	}
	if err := ch.Write(0, 2000, rd.ID, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(nil, 0), uint64(^uint64(3)))); err != nil {
		t.Fatal(err)
	}
	if err := ch.Write(0, 3000, fork.ID, binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 7), 11)); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	return pl
}

// TestSinkRenames writes a trace through the lttng sink and reads it
// back with our reader and babeltrace2: names and env are LTTng's, the
// payload is the same bytes, the unmapped event keeps its name.
func TestSinkRenames(t *testing.T) {
	dir := t.TempDir()
	writeTrace(t, LTTng, dir)
	tr, err := relayfmt.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := tr.Meta
	if Detect(m) != LTTng || m.EnvInt["tracer_major"] != LTTngMajor || m.Env["trace_name"] != "unit" || m.Env["trace_creation_datetime"] != "20231114T221320+0000" {
		t.Fatalf("env: tracer %q %v %v", m.Tracer, m.Env, m.EnvInt)
	}
	for _, k := range []string{"hostname", "sysname", "kernel_release", "kernel_version"} {
		if m.Env[k] == "" {
			t.Errorf("env %s missing", k)
		}
	}
	sw := m.ClassByName("sched_switch")
	if sw == nil || m.ClassByName("syscall_exit_read") == nil || m.ClassByName("sched:sched_process_fork") == nil {
		t.Fatalf("classes: %v", names(m))
	}
	var fields []string
	for _, f := range sw.Fields {
		fields = append(fields, f.Name)
	}
	if got := strings.Join(fields, ","); got != "common_type,common_pid,prev_comm,prev_tid,prev_prio,prev_state,next_comm,next_tid,next_prio" {
		t.Errorf("sched_switch fields %s", got)
	}
	if Detect(Unrename(m)).Name != "lttng" || Unrename(m).ClassByName("sched:sched_switch") == nil {
		t.Errorf("Unrename: %v", names(Unrename(m)))
	}

	bt := testenv.BT2(t)
	out, err := exec.Command(bt, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("babeltrace2: %v\n%s", err, out)
	}
	for _, want := range []string{"sched_switch: { cpu_id = 0 }, { common_type = 300, common_pid = 7, prev_comm = \"prev\", prev_tid = 7, prev_prio = 120, prev_state = 1, next_comm = \"next\", next_tid = 9, next_prio = 120 }", "syscall_exit_read:", "ret = -4", "sched:sched_process_fork:"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("babeltrace2 output lacks %q:\n%s", want, out)
		}
	}
	meta, err := os.ReadFile(filepath.Join(dir, "metadata"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tracer_name = \"lttng-modules\";", "tracer_major = 2;", "domain = \"kernel\";"} {
		if !strings.Contains(string(meta), want) {
			t.Errorf("metadata lacks %q", want)
		}
	}
}

// TestFtraceSinkKeepsNames: the default profile's sink changes nothing
// but the env it is given.
func TestFtraceSinkKeepsNames(t *testing.T) {
	dir := t.TempDir()
	writeTrace(t, Ftrace, dir)
	tr, err := relayfmt.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if Detect(tr.Meta) != Ftrace || tr.Meta.ClassByName("sched:sched_switch") == nil || tr.Meta.ClassByName("sched:sched_switch").Fields[3].Name != "prev_pid" {
		t.Fatalf("ftrace profile renamed: %v", names(tr.Meta))
	}
}

func names(m *relayfmt.Metadata) []string {
	var out []string
	for _, c := range m.Classes {
		if c != nil {
			out = append(out, c.Name)
		}
	}
	return out
}

// FuzzApply: any metadata our parser takes is renamed without a panic
// into metadata it takes again.
func FuzzApply(f *testing.F) {
	dir := f.TempDir()
	ds, _ := relayfmt.NewDirSink(dir)
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1, Clock: relayfmt.Clock{Name: "monotonic"}}, ds)
	if err != nil {
		f.Fatal(err)
	}
	_, _ = ch.AddEventClass("sched:sched_switch", switchFields)
	_, _ = ch.AddEventClass("sched_switch", switchFields[:2])
	_, _ = ch.AddEventClass("syscalls:sys_enter_read", []relayfmt.Field{relayfmt.ScalarField("pid", relayfmt.U32), relayfmt.ScalarField("_n", relayfmt.U32), relayfmt.SequenceField("pid_s", relayfmt.U8, "pid")})
	_ = ch.Close()
	seed, err := os.ReadFile(filepath.Join(dir, "metadata"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, text []byte) {
		m, err := relayfmt.ParseMetadata(text)
		if err != nil {
			return
		}
		if err := LTTng.Apply(m); err != nil {
			return
		}
		if _, err := relayfmt.ParseMetadata(m.TSDL()); err != nil {
			t.Fatalf("renamed metadata does not parse: %v\n%s", err, m.TSDL())
		}
		_ = Unrename(m)
	})
}

// TestREADMEListsMappings: the README's table of renamed events is the
// profile's.
func TestREADMEListsMappings(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range Mappings() {
		if row := "| `" + m.Ftrace + "` | `" + m.LTTng + "` |"; !strings.Contains(string(b), row) {
			t.Errorf("README lacks the row %s", row)
		}
		for from, to := range m.Fields {
			if !strings.Contains(string(b), from+" → "+to) {
				t.Errorf("README lacks %s's field %s → %s", m.Ftrace, from, to)
			}
		}
	}
}

// captureSink keeps the last metadata text.
type captureSink struct {
	relayfmt.DiscardSink
	text []byte
}

func (c *captureSink) WriteMetadata(text []byte) error { c.text = text; return nil }

// TestSinkTextAndStructAgree: metadata given as text (parsed) and as the
// channel's structure (no parse) come out the same, and the channel's own
// metadata is left as it was.
func TestSinkTextAndStructAgree(t *testing.T) {
	env, err := LTTngEnv("unit", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	byStruct, byText := &captureSink{}, &captureSink{}
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1, Clock: relayfmt.Clock{Name: "monotonic"}, Env: map[string]string{"hostname": "x"}}, LTTng.Sink(byStruct, env))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, n := range []string{"sched:sched_switch", "sched:sched_process_fork", "syscalls:sys_enter_read"} {
		if _, err := ch.AddEventClass(n, switchFields); err != nil {
			t.Fatal(err)
		}
	}
	m := ch.Metadata()
	if err := LTTng.Sink(byText, env).WriteMetadata(m.TSDL()); err != nil {
		t.Fatal(err)
	}
	if string(byText.text) != string(byStruct.text) {
		t.Fatalf("text path:\n%s\nstructure path:\n%s", byText.text, byStruct.text)
	}
	if m.Tracer != "" || m.ClassByName("sched:sched_switch") == nil || m.Env["hostname"] != "x" || m.Env["sysname"] != "" {
		t.Fatalf("the channel's metadata changed: %q %v %v", m.Tracer, names(&m), m.Env)
	}
}

// TestRWBS: ftrace's rwbs texts (blk_fill_rwbs) become lttng-modules'
// bits, the write bit set for writes alone.
func TestRWBS(t *testing.T) {
	for _, tc := range []struct {
		text string
		want uint32
	}{
		{"R", rwbsRead},
		{"RA", rwbsRead | rwbsRahead},
		{"RM", rwbsRead | rwbsMeta},
		{"W", rwbsWrite},
		{"WS", rwbsWrite | rwbsSync},
		{"WFS", rwbsWrite | rwbsFUA | rwbsSync},
		{"FWFS", rwbsPreflush | rwbsWrite | rwbsFUA | rwbsSync},
		{"FF", rwbsPreflush | rwbsFlush},
		{"F", rwbsFlush},
		{"FS", rwbsFlush | rwbsSync},
		{"D", rwbsDiscard},
		{"DE", rwbsDiscard | rwbsSecure},
		{"N", 0},
		{"WU", rwbsWrite},
		{"", 0},
	} {
		if got := RWBS([]byte(tc.text)); got != tc.want {
			t.Errorf("RWBS(%q) = %#x, want %#x", tc.text, got, tc.want)
		}
		if isWrite := RWBS([]byte(tc.text))%2 == 1; isWrite != (strings.TrimPrefix(tc.text, "F") != "" && strings.TrimPrefix(tc.text, "F")[0] == 'W') {
			t.Errorf("RWBS(%q) %% 2 == 1 is %v", tc.text, isWrite)
		}
	}
}

// TestSinkLocalAsInner checks that a profile's sink is local exactly when
// the sink it wraps is: the channel then writes packets from its writer.
func TestSinkLocalAsInner(t *testing.T) {
	ds, err := relayfmt.NewDirSink(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	for _, tc := range []struct {
		inner relayfmt.Sink
		want  bool
	}{
		{ds, true},
		{struct{ relayfmt.Sink }{ds}, false}, // says nothing: not local
	} {
		l, ok := LTTng.Sink(tc.inner, Env{}).(relayfmt.LocalSink)
		if !ok {
			t.Fatal("a profile's sink has no Local method")
		}
		if got := l.Local(); got != tc.want {
			t.Errorf("Local() over %T = %v, want %v", tc.inner, got, tc.want)
		}
	}
}
