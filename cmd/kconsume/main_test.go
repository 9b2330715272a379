package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/testenv"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestParseSize(t *testing.T) {
	good := map[string]int{"4K": 4096, "256k": 256 << 10, "1M": 1 << 20, "2G": 2 << 30, "8192": 8192, "1MiB": 1 << 20, "64KB": 64 << 10}
	for in, want := range good {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "-4K", "1.5M", "4X", "0", "99999999999G"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q): no error", in)
		}
	}
}

// TestRecordUsageErrors: bad input exits 2 with a message that names the
// problem, and leaves no trace behind.
func TestRecordUsageErrors(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "t")
	full := filepath.Join(dir, "full")
	if err := os.MkdirAll(full, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(full, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(full, link); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"record", "-e", "sched:sched_switch"}, "-o DIR is required"},
		{[]string{"record", "-o", out}, "-e EVENT or --bpf FILE is required"},
		{[]string{"record", "-o", out, "-e", "nosuch:event"}, "kconsume list"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--subbuf-size", "5000"}, "multiple of"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--subbuf-size", "12Q"}, "size"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--n-subbufs", "1"}, "2.."},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--ring-size", "12K"}, "power of two"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--subbuf-size", "256M", "--n-subbufs", "4096"}, "free memory"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--mode", "fast"}, "discard or overwrite"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--transport", "x"}, "ringbuf"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--syscalls", "fast"}, "want auto, raw, tracepoint or fentry"},
		{[]string{"record", "-o", out, "-e", "syscalls:sys_enter_getpid", "--syscalls", "raw", "--transport", "perf"}, "needs the ringbuf transport"},
		{[]string{"record", "-o", out, "-e", "syscalls:sys_enter_getpid", "--syscalls", "fentry", "--transport", "perf"}, "needs the ringbuf transport"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--clock", "x"}, "mono"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--pid", "abc"}, "not a process id"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--pid", "2147483647"}, "no such process"},
		{[]string{"record", "-o", full, "-e", "sched:sched_switch"}, "not empty"},
		{[]string{"record", "-o", full, "-e", "sched:sched_switch", "--force"}, "not part of a trace"},
		{[]string{"record", "-o", link, "-e", "sched:sched_switch"}, "symlink"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--bogus"}, "flag provided but not defined"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--relayd", "tcp://collector"}, "net://HOST"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--relayd", "net://collector:0"}, "control port"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--relayd-hostname", "h"}, "needs --relayd"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--live-timer", "1ms"}, "10ms to 1h"},
		{[]string{"record", "-e", "sched:sched_switch", "--relayd", "net://collector", "--relayd-timeout", "-1s"}, "positive"},
		{[]string{"list", "nosuch:*"}, "no tracepoint or synthetic event matches"},
		{[]string{"record", "-o", out, "-f", "prev_pid > 0", "-e", "sched:sched_switch"}, "give -e EVENT first"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "-f", "prev_pid >"}, `position 10: Invalid value (did you forget quotes)?`},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "-f", "nosuch == 1"}, "Field not found"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "-f", `prev_comm < "a"`}, "Illegal operation for field type"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "-f", `prev_pid ~ "a*"`}, "Expecting numeric field"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--filter", "prev_pid"}, "want EVENT:EXPR"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--filter", "sched:sched_wakeup:pid > 0"}, "no recorded event matches"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "-f", "common_flags == 1"}, "common fields overwritten"},
		{[]string{"record", "-o", out, "-e", "sched:sched_process_exec", "-f", `filename ~ "` + strings.Repeat("?", 63) + `"`}, "a glob of 63 elements: not evaluated in the recorder yet"},
	}
	for _, c := range cases {
		code, _, stderr := runCmd(c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", c.args, code, stderr, c.want)
		}
		if _, err := os.Stat(filepath.Join(out, "metadata")); err == nil {
			t.Fatalf("%v left a trace in %s", c.args, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(full, "notes.txt")); err != nil || string(b) != "x" {
		t.Fatal("--force touched a file that is not part of a trace")
	}
}

// TestRecordCommand records while a command runs, exits with its status,
// and the trace reads back with report and stats.
func TestRecordCommand(t *testing.T) {
	testenv.RequireRoot(t)
	out := filepath.Join(t.TempDir(), "t")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_process_exec", "--", "sh", "-c", "/bin/true; exit 7")
	if code != 7 {
		t.Fatalf("exit %d, want 7 (the command's)\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "events recorded") {
		t.Fatalf("no summary: %q", stdout)
	}
	code, rep, stderr := runCmd("report", out)
	if code != 0 || !strings.Contains(rep, `filename="/bin/true"`) {
		t.Fatalf("report: exit %d, %s\n%s", code, rep, stderr)
	}
	code, st, _ := runCmd("stats", out)
	if code != 0 || !strings.Contains(st, "sched:sched_process_exec") {
		t.Fatalf("stats: exit %d\n%s", code, st)
	}
	// A second record into the same directory is refused, then --force
	// replaces the trace.
	if code, _, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_switch", "--duration", "10ms"); code != 2 || !strings.Contains(stderr, "not empty") {
		t.Fatalf("second record: exit %d, %s", code, stderr)
	}
	// A sleeping command switches out at least once: an idle guest with
	// a quiet recorder may switch no task in a fixed 200 ms.
	if code, _, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_switch", "--force", "--", "sleep", "0.1"); code != 0 {
		t.Fatalf("--force: exit %d, %s", code, stderr)
	}
	if code, st, _ := runCmd("stats", out); code != 0 || !strings.Contains(st, "sched:sched_switch") || strings.Contains(st, "sched_process_exec") {
		t.Fatalf("after --force: %s", st)
	}
}

func TestList(t *testing.T) {
	testenv.RequireRoot(t)
	code, out, _ := runCmd("list", "sched:sched_sw*")
	if code != 0 || !strings.Contains(out, "sched:sched_switch\n") {
		t.Fatalf("list: exit %d, %q", code, out)
	}
	// -v lists the fields a filter names, each of the kernel's format.
	code, out, _ = runCmd("list", "-v", "sched:sched_switch")
	if code != 0 {
		t.Fatalf("list -v: exit %d, %q", code, out)
	}
	for _, want := range []string{"\tcommon_pid ", "\tprev_comm ", "char[16]", "\tnext_pid ", "\tCOMM ", "\tCPU "} {
		if !strings.Contains(out, want) {
			t.Errorf("list -v sched:sched_switch lacks %q:\n%s", want, out)
		}
	}
}

// TestRecordDiskFull records into a 256 KiB tmpfs until it fills: record
// stops with a message that says so, and the trace reads back whole, by
// our reader and by babeltrace2.
func TestRecordDiskFull(t *testing.T) {
	testenv.RequireRoot(t)
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=256k"); err != nil {
		testenv.Missing(t, "cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	old := controlRoot
	controlRoot = t.TempDir()
	t.Cleanup(func() { controlRoot = old })
	out := filepath.Join(mnt, "t")
	// The command forks /bin/true until the recording ends, which
	// removes its control directory: a fixed number of forks in a fixed
	// --duration filled the disk only within a range of speeds (too few
	// on a fast machine, too slow in a TCG guest). The --duration is a
	// guard: a recording that never fills the disk ends after it, and
	// fails the test with exit 0.
	ctl := filepath.Join(controlRoot, "full")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "--session", "full", "-e", "sched:sched_process_exec,sched:sched_process_fork,sched:sched_switch", "--subbuf-size", "16K", "--duration", "2m",
		"--", "sh", "-c", "while [ -d "+ctl+" ]; do /bin/true; done")
	if code != 1 || !strings.Contains(stderr, "disk full") || !strings.Contains(stderr, "whole") {
		t.Fatalf("exit %d, stderr %q; want 1 and a disk-full message\n%s", code, stderr, stdout)
	}
	if code, st, stderr := runCmd("stats", out); code != 0 {
		t.Fatalf("stats after disk full: exit %d\n%s%s", code, st, stderr)
	}
	testenv.RunBT2(t, out)
}

// recordInProcess starts kconsume record with args in this process and
// returns end, which stops it as Ctrl-C does and returns its exit code
// and output. args give no --duration: a fixed one is a time the test's
// steps must fit in while it records, which a slow machine (a TCG guest,
// 10-40x slower) overruns, leaving the steps no session. end sends a
// SIGINT to this process, which record catches while it records, and
// sends it again every 100 ms until record returns (one sent before
// record caught it is lost), failing t after a minute. While record runs
// this process holds SIGINT too, so that one arriving outside record's
// handler is dropped, not fatal. Cleanup calls end, so that a test that
// fails leaves no recording behind.
func recordInProcess(t *testing.T, args ...string) (end func() (code int, output string)) {
	t.Helper()
	held := make(chan os.Signal, 1)
	signal.Notify(held, os.Interrupt)
	type result struct {
		code   int
		output string
	}
	done := make(chan result, 1)
	go func() {
		code, o, e := runCmd(append([]string{"record"}, args...)...)
		done <- result{code, o + e}
	}()
	var once sync.Once
	var res result
	end = func() (int, string) {
		once.Do(func() {
			deadline := time.Now().Add(time.Minute)
			for {
				_ = unix.Kill(os.Getpid(), unix.SIGINT)
				select {
				case res = <-done:
					signal.Stop(held)
					return
				case <-time.After(100 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					// SIGINT stays held: record may yet catch one.
					res = result{-1, "record still running a minute after SIGINT"}
					return
				}
			}
		})
		return res.code, res.output
	}
	t.Cleanup(func() { end() })
	return end
}

// waitFor polls cond every 10 ms until it holds, and fails t after a
// minute: loading the recorder in a TCG guest of make vmtest can take
// several seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 6000; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("timed out waiting")
}

// TestReportFilters runs report's filters on the golden trace and checks
// each printed line against them; --json lines must be valid JSON with
// the same events.
func TestReportFilters(t *testing.T) {
	golden := filepath.Join("..", "..", "relayfmt", "testdata", "golden", "basic")
	code, all, stderr := runCmd("report", golden)
	if code != 0 {
		t.Fatalf("report: %d %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(all), "\n")
	count := func(args ...string) []string {
		t.Helper()
		code, out, stderr := runCmd(append([]string{"report", golden}, args...)...)
		if code != 0 {
			t.Fatalf("report %v: exit %d: %s", args, code, stderr)
		}
		out = strings.TrimSpace(out)
		if out == "" {
			return nil
		}
		return strings.Split(out, "\n")
	}
	want := func(pred func(l string) bool) int {
		n := 0
		for _, l := range lines {
			if pred(l) {
				n++
			}
		}
		return n
	}
	if got, w := len(count("-e", "sys1:*")), want(func(l string) bool { return strings.Contains(l, " sys1:") }); got != w || w == 0 {
		t.Errorf("-e sys1:*: %d lines, want %d", got, w)
	}
	if got, w := len(count("-e", "event_5,event_6")), want(func(l string) bool {
		return strings.Contains(l, ":event_5:") || strings.Contains(l, ":event_6:")
	}); got != w || w == 0 {
		t.Errorf("-e event_5,event_6: %d lines, want %d", got, w)
	}
	if got, w := len(count("--cpu", "1")), want(func(l string) bool { return strings.Contains(l, " cpu1 ") }); got != w || w == 0 {
		t.Errorf("--cpu 1: %d lines, want %d", got, w)
	}
	window := count("--since", "+100ms", "--until", "0.5", "--trace-seconds")
	if len(window) == 0 || len(window) >= len(lines) {
		t.Fatalf("--since/--until: %d of %d lines", len(window), len(lines))
	}
	for _, l := range window {
		ts, _ := strconv.ParseFloat(strings.Fields(l)[0], 64)
		if ts < 0.101001531-1e-9 || ts > 0.5 {
			t.Fatalf("line outside the window: %s", l)
		}
	}
	js := count("--json")
	if len(js) != len(lines) {
		t.Fatalf("--json: %d lines, text %d", len(js), len(lines))
	}
	lost := 0
	for _, l := range js {
		var obj map[string]any
		if err := json.Unmarshal([]byte(l), &obj); err != nil {
			t.Fatalf("not JSON: %s: %v", l, err)
		}
		if _, ok := obj["lost"]; ok {
			lost++
		} else if _, ok := obj["fields"].(map[string]any); !ok {
			t.Fatalf("event without fields: %s", l)
		}
	}
	if lost != want(func(l string) bool { return strings.Contains(l, " LOST ") }) {
		t.Errorf("--json has %d losses", lost)
	}
	for _, bad := range [][]string{{"--since", "yesterday"}, {"--since", "+1s", "--until", "+1ms"}, {"-e", "["}, {"--bogus"}} {
		if code, _, _ := runCmd(append([]string{"report", golden}, bad...)...); code != 2 {
			t.Errorf("report %v: exit %d, want 2", bad, code)
		}
	}
}

// TestRecordSyscallsFallback: with --syscalls auto, a session whose
// syscall events cannot take the raw path (the perf transport) says so on
// stderr; with --syscalls tracepoint, which asked for it, nothing is said.
func TestRecordSyscallsFallback(t *testing.T) {
	testenv.RequireRoot(t)
	old := controlRoot
	controlRoot = t.TempDir()
	t.Cleanup(func() { controlRoot = old })
	for _, c := range []struct {
		flags  []string
		notice bool
	}{
		{[]string{"--transport", "perf"}, true},
		{[]string{"--syscalls", "tracepoint"}, false},
	} {
		args := append([]string{"record", "-q", "-o", filepath.Join(t.TempDir(), "t"), "-e", "syscalls:sys_enter_getpid", "--duration", "100ms"}, c.flags...)
		code, _, stderr := runCmd(args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.flags, code, stderr)
		}
		if got := strings.Contains(stderr, "syscall events through their tracepoints"); got != c.notice {
			t.Fatalf("%v: notice %v, want %v; stderr %q", c.flags, got, c.notice, stderr)
		}
	}
}

// TestSummaryLate: the summary explains a ring loss that came with a late
// consumer, and says nothing of lateness without a loss.
func TestSummaryLate(t *testing.T) {
	stats := []consumer.CPUStats{{CPU: 0, Emitted: 900, KernelLost: 100}}
	stats[0].Channel.Records = 900
	late := consumer.DrainerStats{Waits: 50, Late: 2, LongestOverrun: 9700 * time.Microsecond}
	for _, tc := range []struct {
		stats []consumer.CPUStats
		d     consumer.DrainerStats
		want  string // "" for no note
	}{
		{stats, late, "note: 2 times the consumer ran more than --latency after it asked to, once 9.7ms late"},
		{stats, consumer.DrainerStats{Waits: 50}, ""},
		{[]consumer.CPUStats{{CPU: 0, Emitted: 900}}, late, ""},
	} {
		var out bytes.Buffer
		r := &recordRun{stdout: &out, start: time.Now()}
		r.summary(tc.stats, tc.d)
		got := out.String()
		if tc.want == "" && strings.Contains(got, "consumer ran") || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("drainer %+v, kernel lost %d: summary\n%s\nwant the note %q", tc.d, tc.stats[0].KernelLost, got, tc.want)
		}
	}
}
