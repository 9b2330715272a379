package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/kallsyms"
	"github.com/kconsume/kconsume/internal/testenv"
)

// TestRecordStack records kernel call chains with --stack, per event
// and for all: report names each frame as the kernel's symbol table
// does (func+0xoff), from the symbols the trace saved, and prints the
// same frames as addresses with --raw-addresses or once the symbols are
// gone; a corrupt symbol file is an error that names the way out. Bad
// --stack and --stack-depth values are usage errors.
func TestRecordStack(t *testing.T) {
	testenv.RequireRoot(t)
	syms, err := kallsyms.Read()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "t")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_process_exec",
		"-e", "sched:sched_process_exit", "--stack", "kernel", "--stack-depth", "3", "--", "sleep", "0.01")
	if code != 0 {
		t.Fatalf("record: exit %d\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "call chains were deeper than --stack-depth 3") {
		t.Errorf("the summary does not count the cut chains:\n%s", stdout)
	}
	named := reportLines(t, out)
	raw := reportLines(t, out, "--raw-addresses")
	chain := regexp.MustCompile(`callstack_kernel=\[([^\]]*)\]`)
	exits := 0
	for i, line := range raw {
		if strings.Contains(line, "sched_process_exec") {
			if strings.Contains(line, "callstack_kernel") {
				t.Errorf("a call chain on an event --stack did not name: %s", line)
			}
			continue
		}
		exits++
		addrs, names := chain.FindStringSubmatch(line), chain.FindStringSubmatch(named[i])
		if addrs == nil || names == nil {
			t.Fatalf("no call chain:\n%s\n%s", line, named[i])
		}
		a, n := strings.Split(addrs[1], ", "), strings.Split(names[1], ", ")
		if len(a) != 3 || len(n) != 3 {
			t.Fatalf("chains of %d and %d frames, want 3:\n%s\n%s", len(a), len(n), line, named[i])
		}
		for k := range a {
			v, err := strconv.ParseUint(strings.TrimPrefix(a[k], "0x"), 16, 64)
			name, off, ok := syms.Name(v)
			if err != nil || !ok || n[k] != name+"+0x"+strconv.FormatUint(off, 16) {
				t.Errorf("frame %d: %s named %s; the kernel names it %s+0x%x", k, a[k], n[k], name, off)
			}
		}
	}
	if exits == 0 {
		t.Fatalf("no sched_process_exit event in the trace:\n%s", strings.Join(raw, "\n"))
	}
	path := filepath.Join(out, consumer.KernelSymbols)
	if err := os.WriteFile(path, []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := runCmd("report", out); code == 0 || !strings.Contains(stderr, "--raw-addresses") {
		t.Errorf("report of a corrupt symbol file: exit %d, stderr %q", code, stderr)
		_ = stdout
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got := reportLines(t, out); strings.Join(got, "\n") != strings.Join(raw, "\n") {
		t.Errorf("without symbols, report differs from --raw-addresses:\n%s\n%s", strings.Join(got, "\n"), strings.Join(raw, "\n"))
	}
	for _, args := range [][]string{{"--stack", "kernels"}, {"--stack-depth", "128", "--stack", "kernel"}, {"--stack-depth", "-1"}} {
		code, _, stderr := runCmd(append([]string{"record", "-o", filepath.Join(t.TempDir(), "bad"), "-e", "sched:sched_switch"}, args...)...)
		if code != 2 || !strings.Contains(stderr, strings.TrimLeft(args[0], "-")) {
			t.Errorf("record %v: exit %d, stderr %q; want a usage error naming the flag", args, code, stderr)
		}
	}
}

// TestRecordContextCallstack: LTTng's callstack contexts, as LTTng users
// name them (--context callstack-kernel,callstack-user), record the call
// chains --stack both records, beside the other contexts.
func TestRecordContextCallstack(t *testing.T) {
	testenv.RequireRoot(t)
	out := filepath.Join(t.TempDir(), "t")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_process_exit",
		"--context", "procname,callstack-kernel", "--context", "callstack-user", "--", "sleep", "0.01")
	if code != 0 {
		t.Fatalf("record: exit %d\n%s%s", code, stdout, stderr)
	}
	lines := reportLines(t, out)
	sleeps := 0
	for _, l := range lines {
		if !strings.Contains(l, `procname="sleep"`) {
			continue
		}
		sleeps++
		for _, want := range []string{"callstack_kernel=[", "callstack_user=["} {
			if !strings.Contains(l, want) {
				t.Errorf("no %s…] in %s", want, l)
			}
		}
	}
	if sleeps != 1 {
		t.Errorf("%d exits of sleep, want 1:\n%s", sleeps, strings.Join(lines, "\n"))
	}
}

// reportLines runs kconsume report on dir with args, and returns its lines.
func reportLines(t *testing.T, dir string, args ...string) []string {
	t.Helper()
	code, stdout, stderr := runCmd(append([]string{"report", dir}, args...)...)
	if code != 0 {
		t.Fatalf("report %v: exit %d\n%s", args, code, stderr)
	}
	return strings.Split(strings.TrimSpace(stdout), "\n")
}

// TestRecordUserStack records the user call chains of a C program's
// getpid calls (main, kcstack_a, kcstack_b, kcstack_c, built with frame
// pointers), deletes the program, and reads the trace: report names
// every frame of the program func+0xoff (/path), from the symbols the
// trace saved.
func TestRecordUserStack(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	bin := buildKCStack(t, dir)
	out := filepath.Join(dir, "t")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "--comm", kcstackComm, "-e", "syscalls:sys_enter_getpid", "--stack", "user",
		"--", "sh", "-c", "printf abc | "+bin)
	if code != 0 {
		t.Fatalf("record: exit %d\n%s%s", code, stdout, stderr)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	checkUserFrames(t, out, bin, 3)
}

// buildKCStack builds the kcstack program with frame pointers into dir,
// under a name of this test process's own (kcstackComm), and returns its
// path; it skips the test without a C compiler.
func buildKCStack(t *testing.T, dir string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	bin := filepath.Join(dir, kcstackComm)
	if out, err := exec.Command(cc, "-O0", "-fno-omit-frame-pointer", "-o", bin, "../../consumer/testdata/kcstack.c").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v: %s", err, out)
	}
	return bin
}

// kcstackComm names the kcstack program these tests build: its command
// name, which --comm picks, is this process's own, so that the kcstack
// runs of other packages' tests, which go test may run at the same time,
// stay out of these recordings.
var kcstackComm = "kcstk" + strconv.Itoa(os.Getpid())

// checkUserFrames checks that report reads n events in the trace in dir,
// each with a user call chain whose frames in bin, the kcstack program,
// are named kcstack_c, kcstack_b, kcstack_a, main.
func checkUserFrames(t *testing.T, dir, bin string, n int) {
	t.Helper()
	frame := regexp.MustCompile(`(\w+)\+0x[0-9a-f]+ \(` + regexp.QuoteMeta(bin) + `\)`)
	chain := regexp.MustCompile(`callstack_user=\[([^\]]*)\]`)
	lines := reportLines(t, dir)
	for _, line := range lines {
		c := chain.FindStringSubmatch(line)
		if c == nil {
			t.Fatalf("no user call chain: %s", line)
		}
		var names []string
		for _, m := range frame.FindAllStringSubmatch(c[1], -1) {
			names = append(names, m[1])
		}
		if want := []string{"kcstack_c", "kcstack_b", "kcstack_a", "main"}; !slices.Equal(names, want) {
			t.Errorf("frames of the program named %v, want %v: %s", names, want, line)
		}
	}
	if len(lines) != n {
		t.Errorf("%d getpid events, want %d:\n%s", len(lines), n, strings.Join(lines, "\n"))
	}
}

// TestKillKeepsUserSymbols: a recording of user call chains killed
// (SIGKILL) a while after its process ran keeps that process's symbols,
// saved while it ran (consumer/usersave.go): once kconsume recover has
// written what the rings held, report names the program's frames,
// though the program was deleted before the kill.
func TestKillKeepsUserSymbols(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	bin := buildKCStack(t, dir)
	out := filepath.Join(dir, "t")
	rec := startRecording(t, "ksyms"+uniq, "-o", out, "--comm", kcstackComm, "-e", "syscalls:sys_enter_getpid", "--stack", "user", "--duration", "10m")
	run := exec.Command(bin)
	run.Stdin = strings.NewReader("abcd")
	if b, err := run.CombinedOutput(); err != nil {
		t.Fatalf("kcstack: %v: %s", err, b)
	}
	syms := filepath.Join(out, consumer.UserSymbols)
	waitFor(t, func() bool {
		_, err := os.Stat(syms)
		return err == nil
	})
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	// The events into the trace's files: what a killed recording's
	// rings hold, recover counts lost, not written.
	if code, _, stderr := runCmd("ctl", "--session", rec.name, "flush"); code != 0 {
		t.Fatalf("ctl flush: exit %d: %s", code, stderr)
	}
	_ = rec.cmd.Process.Kill()
	rec.wait(t)
	if code, stdout, stderr := runCmd("recover", out); code != 0 {
		t.Fatalf("recover: exit %d\n%s%s", code, stdout, stderr)
	}
	checkUserFrames(t, out, bin, 4)
}

// TestRecordContextsLTTng: under --profile lttng the contexts are in the
// stream's event context, as LTTng writes them: every event carries
// them (the statedump's zeros), contexts named like an event's fields
// (tid, pid and sched_process_exec's) do not clash with them, and the
// payload still takes LTTng's names (tid, old_tid), as babeltrace2 reads
// the trace.
func TestRecordContextsLTTng(t *testing.T) {
	testenv.RequireRoot(t)
	out := filepath.Join(t.TempDir(), "t")
	code, stdout, stderr := runCmd("record", "-q", "--profile", "lttng", "-o", out, "-e", "sched:sched_process_exec", "--context", "tid,pid", "--", "true")
	if code != 0 {
		t.Fatalf("record: exit %d\n%s%s", code, stdout, stderr)
	}
	lines, _ := testenv.RunBT2(t, out)
	event := regexp.MustCompile(`sched_process_exec: \{ cpu_id = \d+ \}, \{ pid = (\d+), tid = (\d+) \}, \{ .*filename = "[^"]*true", tid = (\d+), old_tid = (\d+) \}`)
	found := 0
	for _, l := range lines {
		if m := event.FindStringSubmatch(l); m != nil {
			found++
			if m[1] != m[2] || m[2] != m[3] || m[3] != m[4] {
				t.Errorf("context and payload disagree: %s", l)
			}
		}
	}
	if found != 1 {
		t.Errorf("%d execs of true with their context, want 1:\n%s", found, strings.Join(lines, "\n"))
	}
	meta, err := os.ReadFile(filepath.Join(out, "kernel", "metadata"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`stream \{[^}]*event\.context := struct \{\s*int32_t _pid;\s*int32_t _tid;\s*\}`).Match(meta) {
		t.Errorf("no stream event context of pid and tid in the metadata:\n%s", meta)
	}
	dumped := 0
	for _, l := range lines {
		if strings.Contains(l, "lttng_statedump_process_state: ") {
			if !strings.Contains(l, "}, { pid = 0, tid = 0 }, {") {
				t.Errorf("a statedump event without zero contexts: %s", l)
			}
			dumped++
		}
	}
	if dumped == 0 {
		t.Error("no statedump event in the trace")
	}
}

// TestRecordContextBadInput: an unknown context or perf counter is a
// usage error that lists the known ones, and a hardware counter the
// machine lacks (a VM without a PMU, the TCG guests) is refused naming
// it; neither writes a trace. Where the machine has the counter, the
// trace carries it.
func TestRecordContextBadInput(t *testing.T) {
	testenv.RequireRoot(t)
	for _, c := range []struct{ ctx, says string }{
		{"procname,nosuch", `unknown context "nosuch": want one of procname, pid, tid`},
		{"perf:cpu:nosuch", `unknown perf counter "perf:cpu:nosuch": want perf:cpu: and one of `},
		{"perf:cpu:cycles,perf:cpu:instructions,perf:cpu:cache-misses,perf:cpu:cpu-clock,perf:cpu:branch-misses", "perf counters: the recorder reads at most"},
	} {
		out := filepath.Join(t.TempDir(), "t")
		code, stdout, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_switch", "--context", c.ctx, "--duration", "10ms")
		if code != 2 || !strings.Contains(stderr, c.says) {
			t.Errorf("record --context %s: exit %d, want 2 and an error saying %q\n%s%s", c.ctx, code, c.says, stdout, stderr)
		}
		if _, err := os.Stat(filepath.Join(out, "metadata")); err == nil {
			t.Errorf("record --context %s: a trace was written", c.ctx)
		}
	}
	out := filepath.Join(t.TempDir(), "t")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_switch", "--context", "perf:cpu:cycles", "--duration", "10ms")
	switch {
	case code == 0:
		meta, err := os.ReadFile(filepath.Join(out, "metadata"))
		if err != nil || !strings.Contains(string(meta), "perf_cpu_cycles") {
			t.Errorf("record --context perf:cpu:cycles: no perf_cpu_cycles field in the metadata (%v)", err)
		}
	case !strings.Contains(stderr, "context perf:cpu:cycles: this machine has no such counter"):
		t.Errorf("record --context perf:cpu:cycles: exit %d, neither a trace nor a refusal naming the counter\n%s%s", code, stdout, stderr)
	default:
		if _, err := os.Stat(filepath.Join(out, "metadata")); err == nil {
			t.Error("record --context perf:cpu:cycles refused, yet a trace was written")
		}
	}
}
