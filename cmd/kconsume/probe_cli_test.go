package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/testenv"
)

// TestRecordUprobe records a C program's function from the command
// line with fetch arguments and a filter on one of them: babeltrace2
// reads the kept calls with their values, named as given, and a
// malformed probe is a usage error that says what is wrong.
func TestRecordUprobe(t *testing.T) {
	testenv.RequireRoot(t)
	if major, minor, _ := testenv.KernelRelease(); major < 5 || major == 5 && minor < 15 {
		t.Skipf("Linux %d.%d: kconsume's probes need BPF attach cookies (Linux 5.15)", major, minor)
	}
	bin := testenv.BuildC(t, "../../consumer/testdata/kcprobe.c", "-O1")
	out := filepath.Join(t.TempDir(), "t")
	code, stdout, stderr := runCmd("record", "-q", "-o", out,
		"-e", "uprobe:"+bin+":kcprobe_target a=%di:s64 s=+0(%si):string", "-f", "a < -5000",
		"--", bin, "9")
	if code != 0 {
		t.Fatalf("record: exit %d\n%s%s", code, stdout, stderr)
	}
	lines, discards := testenv.RunBT2(t, out)
	if len(discards) > 0 {
		t.Fatalf("events discarded: %v", discards)
	}
	var got []string
	for _, l := range lines {
		if i := strings.Index(l, "a = "); i >= 0 && strings.Contains(l, "uprobes:kcprobe_target") {
			got = append(got, l[i:])
		}
	}
	want := []string{`a = -5993, s = "call-6-with-a-longer-tail" }`, `a = -6993, s = "call-7" }`, `a = -7993, s = "call-8" }`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("babeltrace2 read:\n%s\nwant the payloads\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	for _, bad := range []struct{ spec, says string }{
		{"uprobe:" + bin + ":kcprobe_target x=%nope", `register "%nope": unknown`},
		{"uprobe:relative:kcprobe_target", "is not absolute"},
		{"uprobe:" + bin + ":no_such_function", "no_such_function"},
		{"uprobe:" + bin + ":kcprobe_target s=%di:string", "a string needs a memory address"},
	} {
		code, stdout, stderr := runCmd("record", "-q", "-o", filepath.Join(t.TempDir(), "t"), "-e", bad.spec, "--", "true")
		if code == 0 || !strings.Contains(stderr, bad.says) {
			t.Errorf("record -e %q: exit %d, want an error saying %q\n%s%s", bad.spec, code, bad.says, stdout, stderr)
		}
	}
}

// TestListUprobe lists the functions of an ELF file, and its USDT
// probes, as bpftrace -l lists them, with and without a glob.
func TestListUprobe(t *testing.T) {
	bt, err := exec.LookPath("bpftrace")
	if err != nil {
		testenv.Missing(t, "bpftrace is the judge of the listing (apt-get install bpftrace): %v", err)
	}
	testenv.RequireRoot(t)
	bin := testenv.BuildC(t, "../../consumer/testdata/kcprobe.c", "-O1")
	testenv.RequireSDT(t)
	sdt := testenv.BuildC(t, "../../consumer/testdata/kcusdt.c", "-O2")
	for _, pattern := range []string{"uprobe:" + bin, "uprobe:" + bin + ":*", "uprobe:" + bin + ":*tm_clones", "usdt:" + sdt, "usdt:" + sdt + ":kcusdt:g*"} {
		code, stdout, stderr := runCmd("list", pattern)
		want := pattern
		if strings.Count(want, ":") == 1 {
			want += ":*"
		}
		theirs, err := exec.Command(bt, "-l", want).Output()
		if err != nil {
			t.Fatalf("bpftrace -l %s: %v", want, err)
		}
		if code != 0 || stdout != string(theirs) || stdout == "" {
			t.Errorf("list %s: exit %d\n%s%s\nbpftrace -l:\n%s", pattern, code, stdout, stderr, theirs)
		}
	}
	if code, _, stderr := runCmd("list", "uprobe:"+bin+":nothing_like_this*"); code == 0 || !strings.Contains(stderr, "no function") {
		t.Errorf("list of no function: exit %d: %s", code, stderr)
	}
}

// TestListFentry lists the kernel functions of a glob that fentry can
// name, and with -v the arguments it records by default: the names and
// types the kernel's BTF gives the parameters.
func TestListFentry(t *testing.T) {
	code, stdout, stderr := runCmd("list", "-v", "fexit:do_sys_openat*")
	if code != 0 {
		t.Fatalf("list: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"fexit:do_sys_openat2\n", "\tdfd ", "\tfilename ", "\tretval "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("list -v fexit:do_sys_openat*: no %q in\n%s", want, stdout)
		}
	}
	if code, _, stderr := runCmd("list", "fentry:no_function_is_called_this*"); code == 0 || !strings.Contains(stderr, "no kernel function") {
		t.Errorf("list of no function: exit %d: %s", code, stderr)
	}
}

// TestRecordProbeBadInput: a kernel probe on a function that does not
// exist or cannot be probed, or with an argument the function does not
// have, is refused before anything is traced with an error naming it.
func TestRecordProbeBadInput(t *testing.T) {
	testenv.RequireRoot(t)
	if major, minor, _ := testenv.KernelRelease(); major < 5 || major == 5 && minor < 17 {
		t.Skipf("Linux %d.%d: kconsume's fentry probes need bpf_get_func_arg (Linux 5.17)", major, minor)
	}
	cases := []struct{ spec, says string }{
		{"fentry:no_such_fn_kc", "no function no_such_fn_kc in the kernel's BTF"},
		{"fentry:do_sys_openat2 nosucharg", "no parameter nosucharg (the function has dfd, filename, how)"},
		{"fexit:fput $retval", "fput returns nothing"},
		{"kprobe:do_sys_openat2 nosucharg", "no parameter nosucharg"},
	}
	if _, err := os.Stat("/sys/bus/event_source/devices/kprobe"); err == nil {
		// This VM's kernel has no kprobes and hides its traceable
		// functions from root; the guests' have both.
		cases = append(cases, struct{ spec, says string }{"kprobe:no_such_fn_kc", "no function no_such_fn_kc in the kernel's symbols"},
			struct{ spec, says string }{"kprobe:nosuch_kc_*", "no function matches"})
		black, notrace := refusedFunctions(t)
		cases = append(cases, struct{ spec, says string }{"kprobe:" + black, black + " cannot be probed: it is on the kernel's kprobe blacklist"},
			struct{ spec, says string }{"kprobe:" + notrace, notrace + " cannot be probed: it is not in the kernel's available_filter_functions"},
			struct{ spec, says string }{"fentry:" + notrace, notrace + " cannot be probed: it is not in the kernel's available_filter_functions"})
	} else if testenv.InGuest() {
		t.Fatalf("a guest's kernel without the kprobe PMU: %v", err)
	}
	for _, c := range cases {
		out := filepath.Join(t.TempDir(), "t")
		code, stdout, stderr := runCmd("record", "-q", "-o", out, "-e", c.spec, "--duration", "10ms")
		t.Logf("record -e %q: exit %d: %s", c.spec, code, strings.TrimSpace(stderr))
		if code == 0 || !strings.Contains(stderr, c.says) {
			t.Errorf("record -e %q: exit %d, want an error saying %q\n%s%s", c.spec, code, c.says, stdout, stderr)
		}
		if _, err := os.Stat(filepath.Join(out, "metadata")); err == nil {
			t.Errorf("record -e %q: a trace was written", c.spec)
		}
	}
}

// refusedFunctions returns a kernel function on the kprobe blacklist and
// a C function (in the kernel's BTF) that is neither there nor in
// available_filter_functions (notrace), each with one symbol of its
// name in /proc/kallsyms. It fails the
// test when either cannot be found: a kernel with kprobes has both.
func refusedFunctions(t *testing.T) (black, notrace string) {
	t.Helper()
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	traceable, err := probe.TraceableFunctions(fs.Root)
	if err != nil {
		t.Fatal(err)
	}
	blacklisted, err := probe.ReadBlacklist(probe.KprobeBlacklist)
	if err != nil {
		t.Fatalf("a kernel with kprobes: %v", err)
	}
	ks, err := os.ReadFile("/proc/kallsyms")
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var text []string
	for _, l := range strings.Split(string(ks), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 || f[1] != "t" && f[1] != "T" {
			continue // a module's, or not text
		}
		if count[f[2]]++; count[f[2]] == 1 {
			text = append(text, f[2])
		}
	}
	skip := func(name string) bool {
		return count[name] != 1 || strings.ContainsAny(name, ".$") || strings.HasPrefix(name, "__pfx_") || strings.HasPrefix(name, "__cfi_")
	}
	for _, name := range text {
		if blacklisted[name] && !skip(name) {
			black = name
			break
		}
	}
	isTraceable := map[string]bool{}
	for _, fn := range traceable {
		isTraceable[fn] = true
	}
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range text {
		if skip(name) || blacklisted[name] || isTraceable[name] {
			continue
		}
		// A C function (BTF knows it), not an assembly label.
		var fn *btf.Func
		if spec.TypeByName(name, &fn) == nil {
			notrace = name
			break
		}
	}
	if black == "" || notrace == "" {
		t.Fatalf("no blacklisted function (%q) or no notrace one (%q) in this kernel's symbols", black, notrace)
	}
	return black, notrace
}

// TestRecordProbeStack: a probe takes a filter, contexts and call chains
// as a tracepoint does. Each uprobe hit the filter keeps carries its
// thread's procname, pid and tid (the probe's own program writes them,
// not the tracepoints' shared record) and a user call chain that report
// names from the probed function into main, the program deleted by
// then.
func TestRecordProbeStack(t *testing.T) {
	testenv.RequireRoot(t)
	if major, minor, _ := testenv.KernelRelease(); major < 5 || major == 5 && minor < 15 {
		t.Skipf("Linux %d.%d: kconsume's probes need BPF attach cookies (Linux 5.15)", major, minor)
	}
	bin := testenv.BuildC(t, "../../consumer/testdata/kcprobe.c", "-O1", "-fno-omit-frame-pointer")
	out := filepath.Join(t.TempDir(), "t")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "-e", "uprobe:"+bin+":kcprobe_target a=%di:s64", "-f", "a < -5000",
		"--stack", "user", "--context", "procname,pid,tid", "--", bin, "9")
	if code != 0 {
		t.Fatalf("record: exit %d\n%s%s", code, stdout, stderr)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(bin)
	if len(name) > 15 {
		name = name[:15] // the kernel's comm
	}
	hit := regexp.MustCompile(`uprobes:kcprobe_target: procname="([^"]*)" pid=(\d+) tid=(\d+) common_type=\d+ common_pid=(\d+) .*a=(-?\d+) .*callstack_user=\[([^\]]*)\]`)
	frame := regexp.MustCompile(`(\w+)\+0x[0-9a-f]+ \(` + regexp.QuoteMeta(bin) + `\)`)
	var as []string
	for _, l := range reportLines(t, out) {
		m := hit.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("a hit without its contexts or call chain: %s", l)
		}
		if m[1] != name || m[2] != m[4] || m[3] != m[4] {
			t.Errorf("contexts procname %q pid %s tid %s, want %q and the hit's pid %s: %s", m[1], m[2], m[3], name, m[4], l)
		}
		var names []string
		for _, f := range frame.FindAllStringSubmatch(m[6], -1) {
			names = append(names, f[1])
		}
		if want := []string{"kcprobe_target", "main"}; !slices.Equal(names, want) {
			t.Errorf("frames of the program named %v, want %v: %s", names, want, l)
		}
		as = append(as, m[5])
	}
	if want := []string{"-5993", "-6993", "-7993"}; !slices.Equal(as, want) {
		t.Errorf("hits with a = %v, want %v (the filter's)", as, want)
	}
}
