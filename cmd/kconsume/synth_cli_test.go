package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestSynthCLI defines synthetic events, records one alongside a
// tracepoint, emits it from another "shell", and checks every bad input
// is refused with a clear message and nothing half-written.
func TestSynthCLI(t *testing.T) {
	testenv.RequireRoot(t)
	bt2 := testenv.BT2(t)
	oldStore, oldRoot := synthStore, controlRoot
	synthStore.Dir, controlRoot = t.TempDir(), t.TempDir()
	t.Cleanup(func() { synthStore, controlRoot = oldStore, oldRoot })

	if code, out, stderr := runCmd("synth", "add", "phase u32 n; char what[]"); code != 0 || out != "synthetic:phase\n" {
		t.Fatalf("synth add: exit %d %q %s", code, out, stderr)
	}
	many := make([]string, 65)
	for i := range many {
		many[i] = "u8 f" + strconv.Itoa(i)
	}
	for _, c := range []struct{ def, want string }{
		{"phase u8 x", "already defined"},
		{"e float x", "unknown type"},
		{"e short x", "unknown type"},
		{"e char[300] s", "over the kernel's 256"},
		{"e u32 a[x]", "array size"},
		{"e u32 a b", `type "b" has no field name`},
		{"e unsigned long[] st; u32 _st_length", "count in the trace"},
		{"e" + strings.Repeat("x", 250) + " u32 a", "at most 245"},
		{"e u32 a; u32 a", "duplicate field"},
		{"e " + strings.Join(many, "; "), "field f64: too many fields (the kernel's limit is 64)"},
	} {
		if code, _, stderr := runCmd("synth", "add", c.def); code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("synth add %.30q: exit %d, %q; want 2 and %q", c.def, code, stderr, c.want)
		}
	}
	if code, _, stderr := runCmd("synth", "add", "klog u8 x"); code != 2 || !strings.Contains(stderr, "built into kconsume") {
		t.Errorf("synth add klog: exit %d, %q", code, stderr)
	}
	// Refused definitions left the store as it was.
	if _, out, stderr := runCmd("synth", "list"); !strings.HasPrefix(out, "synthetic:phase\tphase u32 n; char[] what\nsynthetic:klog\tklog char[] msg\t(built in)\n") {
		t.Fatalf("synth list: %q %s", out, stderr)
	}
	// The seed's definition, and every kind the kernel adds to ours.
	if code, out, stderr := runCmd("synth", "add", "kinds char[16] next_comm_field; bool ok; char c; unsigned long[] stack; char tag[4]; gfp_t gfp"); code != 0 || out != "synthetic:kinds\n" {
		t.Fatalf("synth add kinds: exit %d %q %s", code, out, stderr)
	}
	if _, out, _ := runCmd("list", "synthetic:*"); !strings.Contains(out, "synthetic:phase") {
		t.Fatalf("list synthetic:*: %q", out)
	}
	file := filepath.Join(t.TempDir(), "more.synth")
	if err := os.WriteFile(file, []byte("# markers\nnote char msg[]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "syn")
	end := recordInProcess(t, "-q", "-o", out, "--session", "syn", "--synth", file, "-e", "synthetic:*,syscalls:sys_enter_getpid", "--pid", "1")
	waitFor(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(controlRoot, "syn", "state"))
		return strings.TrimSpace(string(b)) == "running"
	})
	if code, _, stderr := runCmd("synth", "emit", "--session", "syn", "phase", "what=hello world", "n=7"); code != 0 {
		t.Fatalf("synth emit: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runCmd("synth", "emit", "--cpu", "1", "synthetic:note", "msg=second"); code != 0 {
		t.Fatalf("synth emit note (the only session): exit %d: %s", code, stderr)
	}
	// klog needs no -e: it is declared at its first use.
	if code, _, stderr := runCmd("synth", "emit", "--session", "syn", "klog", "msg=test phase 2 starts"); code != 0 {
		t.Fatalf("synth emit klog: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runCmd("synth", "emit", "--session", "syn", "kinds", "next_comm_field=kworker/u8:0-events_unbound",
		"ok=true", "c=A", "stack=0xffffffff81000010,0xffffffff81000020", "tag=toolong", "gfp=0xcc0"); code != 0 {
		t.Fatalf("synth emit kinds: exit %d: %s", code, stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"kinds", "next_comm_field=a", "ok=1", "c=1", "stack=0xffffffff81000010,oops", "tag=a", "gfp=0"}, `stack: "oops" is not an address`},
		{[]string{"kinds", "next_comm_field=a", "ok=1", "c=300", "stack=", "tag=a", "gfp=0"}, `c: "300" is not a char`},
		{[]string{"kinds", "next_comm_field=a", "ok=1", "c=1", "stack=", "tag=a", "gfp=-1"}, `gfp: "-1" is not a gfp_t`},
		{[]string{"phase", "n=1"}, "field what unset"},
		{[]string{"phase", "n=x", "what=a"}, "not a u32"},
		{[]string{"phase", "n=1", "n=2", "what=a"}, "set twice"},
		{[]string{"phase", "m=1"}, "no field"},
		{[]string{"nosuch", "x=1"}, "not recorded"},
		{[]string{"phase", "n"}, "FIELD=VALUE"},
	} {
		code, _, stderr := runCmd(append([]string{"synth", "emit", "--session", "syn"}, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("synth emit %v: exit %d, %q; want failure mentioning %q", c.args, code, stderr, c.want)
		}
	}
	if code, _, stderr := runCmd("synth", "emit", "--session", "nosuch", "phase", "n=1", "what=a"); code != 1 || !strings.Contains(stderr, "not running") {
		t.Errorf("emit into no session: exit %d, %q", code, stderr)
	}
	if c, o := end(); c != 0 {
		t.Fatalf("record exit %d\n%s", c, o)
	}
	b, err := exec.Command(bt2, out).CombinedOutput()
	if err != nil {
		t.Fatalf("babeltrace2: %v\n%s", err, b)
	}
	text := string(b)
	if strings.Count(text, "synthetic:phase:") != 1 || !strings.Contains(text, `n = 7, what = "hello world"`) ||
		strings.Count(text, "synthetic:note:") != 1 || !strings.Contains(text, `msg = "second"`) ||
		strings.Count(text, "synthetic:klog:") != 1 || !strings.Contains(text, `msg = "test phase 2 starts"`) ||
		strings.Count(text, "synthetic:kinds:") != 1 ||
		!strings.Contains(text, `next_comm_field = "kworker/u8:0-eve", ok = 1, c = 65, _stack_length = 2, stack = [ [0] = 18446744071578845200, [1] = 18446744071578845216 ], tag = "tool", gfp = 3264`) {
		t.Fatalf("babeltrace2 output:\n%s", text)
	}
	if code, _, _ := runCmd("synth", "delete", "phase"); code != 0 {
		t.Fatal("synth delete failed")
	}
	if code, _, stderr := runCmd("synth", "delete", "phase"); code != 2 || !strings.Contains(stderr, "not defined") {
		t.Errorf("second delete: exit %d %q", code, stderr)
	}
	if code, _, stderr := runCmd("record", "-q", "-o", filepath.Join(t.TempDir(), "x"), "-e", "synthetic:phase"); code != 2 || !strings.Contains(stderr, "synth list") {
		t.Errorf("record of a deleted event: exit %d %q", code, stderr)
	}
}

// recordExample builds bpf/example/NAME.bpf.c with clang, starts a
// recording of it as session, and returns once the gate is open: the
// trace's directory, and end, which ends the recording and returns its
// exit code and output (recordInProcess: no fixed duration the caller's
// steps must fit in).
func recordExample(t *testing.T, name, session string) (string, func() (int, string)) {
	t.Helper()
	clang, err := exec.LookPath("clang")
	if err != nil {
		testenv.Missing(t, "needs clang to build a BPF program")
	}
	obj := filepath.Join(t.TempDir(), name+".o")
	cc := exec.Command(clang, "-O2", "-g", "-target", "bpf", "-I", "bpf", "-I", "bpf/include", "-c", "bpf/example/"+name+".bpf.c", "-o", obj)
	cc.Dir = "../.."
	if b, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("clang: %v\n%s", err, b)
	}
	out := filepath.Join(t.TempDir(), "t")
	end := recordInProcess(t, "-q", "-o", out, "--session", session, "--bpf", obj)
	waitFor(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(controlRoot, session, "state"))
		return strings.TrimSpace(string(b)) == "running"
	})
	return out, end
}

// TestRecordBPF builds the example program of bpf/example the way its
// comment says and records it: its synthetic events and klog lines reach
// the trace.
func TestRecordBPF(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireKernel(t, 5, 13, "bpf_snprintf for klog")
	old := controlRoot
	controlRoot = t.TempDir()
	t.Cleanup(func() { controlRoot = old })
	out, end := recordExample(t, "getpid", "bpf")
	for i := 0; i < 100; i++ {
		_ = os.Getpid()
		unix.Getpid()
	}
	if c, o := end(); c != 0 {
		t.Fatalf("record exit %d\n%s", c, o)
	}
	code, rep, stderr := runCmd("report", out)
	if code != 0 {
		t.Fatalf("report: exit %d: %s", code, stderr)
	}
	comm, _ := os.ReadFile("/proc/self/comm")
	me := `msg="getpid by ` + strings.TrimSpace(string(comm)) + `[`
	for _, want := range []string{"synthetic:getpid_whole", "synthetic:getpid_piece", "synthetic:klog", me} {
		if !strings.Contains(rep, want) {
			t.Fatalf("report lacks %q:\n%.2000s", want, rep)
		}
	}
	if code, _, stderr := runCmd("record", "-q", "-o", filepath.Join(t.TempDir(), "x"), "--bpf", "/nonexistent.o"); code != 2 || !strings.Contains(stderr, "nonexistent.o") {
		t.Errorf("record of a missing object: exit %d, %q", code, stderr)
	}
}
