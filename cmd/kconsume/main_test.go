package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
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

// TestCtl drives a running record through kconsume ctl and the control
// files, checks a second record with the same name is refused, and that
// a stale control directory is replaced.
func TestCtl(t *testing.T) {
	testenv.RequireRoot(t)
	old := controlRoot
	controlRoot = t.TempDir()
	t.Cleanup(func() { controlRoot = old })
	// A killed session's leftovers: replaced, not refused.
	stale := filepath.Join(controlRoot, "web")
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{".lock", "state", "junk"} {
		if err := os.WriteFile(filepath.Join(stale, f), []byte("99999\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "t")
	end := recordInProcess(t, "-q", "-o", out, "--session", "web", "-e", "sched:sched_switch")
	dir := filepath.Join(controlRoot, "web")
	waitFor(t, func() bool { _, err := os.Stat(filepath.Join(dir, "ctl.sock")); return err == nil })
	if _, err := os.Stat(filepath.Join(dir, "junk")); err == nil {
		t.Fatal("stale control directory not replaced")
	}
	readFile := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimSpace(string(b))
	}
	waitFor(t, func() bool { return readFile("state") == "running" })
	if readFile("nr_sub") != "8" || readFile("sub_size") != "262144" || readFile("dropped") != "0" {
		t.Fatalf("control files: nr_sub %q sub_size %q dropped %q", readFile("nr_sub"), readFile("sub_size"), readFile("dropped"))
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("control directory mode %v, want root-only", fi.Mode().Perm())
	}
	code, st, stderr := runCmd("ctl", "status")
	if code != 0 || !strings.Contains(st, "state running") || !strings.Contains(st, "nr_sub 8") {
		t.Fatalf("ctl status: exit %d\n%s%s", code, st, stderr)
	}
	// echo stop > state
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte("stop\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return readFile("state") == "stopped" })
	if _, st, _ := runCmd("ctl", "--session", "web", "status"); !strings.Contains(st, "state stopped") {
		t.Fatalf("after echo stop > state: %s", st)
	}
	for _, c := range [][]string{{"start"}, {"--cpu", "0", "stop"}, {"--cpu", "0", "start"}, {"flush"}, {"--cpu", "0", "reset"}} {
		if code, _, stderr := runCmd(append([]string{"ctl"}, c...)...); code != 0 {
			t.Fatalf("ctl %v: exit %d: %s", c, code, stderr)
		}
	}
	if _, st, _ := runCmd("ctl", "status"); !strings.Contains(st, "state running") {
		t.Fatalf("after ctl start: %s", st)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ctl", "snapshot"}, 1, "overwrite"},
		{[]string{"ctl", "rewind"}, 1, "overwrite"},
		{[]string{"ctl", "--cpu", "99", "stop"}, 1, "no such CPU"},
		{[]string{"ctl", "jump"}, 2, "unknown command"},
		{[]string{"ctl", "--session", "nosuch", "status"}, 1, "not running"},
		// Its --duration only ends a recording that was not refused.
		{[]string{"record", "-q", "-o", out + "2", "--session", "web", "-e", "sched:sched_switch", "--duration", "1s"}, 2, "is running"},
	} {
		code, _, stderr := runCmd(c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, %q; want %d mentioning %q", c.args, code, stderr, c.code, c.want)
		}
	}
	if code, recOut := end(); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, recOut)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("control directory left after record ended: %v", err)
	}
	if code, _, stderr := runCmd("ctl", "status"); code != 1 || !strings.Contains(stderr, "no session") {
		t.Fatalf("ctl with no session: exit %d %q", code, stderr)
	}
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

// TestMetrics scrapes --metrics while a record runs.
func TestMetrics(t *testing.T) {
	testenv.RequireRoot(t)
	old := controlRoot
	controlRoot = t.TempDir()
	t.Cleanup(func() { controlRoot = old })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// No --duration: the scrape below must see the session running, and
	// in a TCG guest polling over HTTP can take longer than a fixed one.
	end := recordInProcess(t, "-q", "-o", filepath.Join(t.TempDir(), "t"), "-e", "sched:sched_switch", "--metrics", addr)
	var body string
	waitFor(t, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		// The server is up before the session starts (slow guests show
		// the gap): wait for the running one.
		return resp.StatusCode == 200 && strings.Contains(body, "kconsume_running 1")
	})
	for _, want := range []string{"# TYPE kconsume_lost_total counter", `layer="kernel"`, `kconsume_events_total{cpu="0"}`, "kconsume_emitted_total", "\nkconsume_drainer_late_total ", "# TYPE kconsume_drainer_overrun_max_seconds gauge"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if !regexp.MustCompile(`\nkconsume_drainer_overrun_max_seconds [0-9.e+-]+\n`).MatchString(body) {
		t.Errorf("metrics lack the drainer's overrun as a number:\n%s", body)
	}
	if code, o := end(); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, o)
	}
}

// TestCtlRewind: in overwrite mode, ctl rewind and a write to the rewind
// control file each write what the flight recorder holds, from the
// oldest, as a trace of its own beside the output; babeltrace2 reads it,
// with the names of the session's profile.
func TestCtlRewind(t *testing.T) {
	testenv.RequireRoot(t)
	for _, prof := range []string{"ftrace", "lttng"} {
		t.Run(prof, func(t *testing.T) { testCtlRewind(t, prof) })
	}
}

func testCtlRewind(t *testing.T, prof string) {
	bt2 := testenv.BT2(t)
	old := controlRoot
	controlRoot = t.TempDir()
	t.Cleanup(func() { controlRoot = old })
	out := filepath.Join(t.TempDir(), "fr")
	end := recordInProcess(t, "-q", "-o", out, "--session", "fr", "--profile", prof, "--mode", "overwrite", "--subbuf-size", "4K", "--n-subbufs", "4", "-e", "sched:sched_switch")
	dir := filepath.Join(controlRoot, "fr")
	waitFor(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "state"))
		return strings.TrimSpace(string(b)) == "running"
	})
	// Switches for the flight recorder to hold: a sleeping command
	// switches out at least once, where a fixed 300 ms of a quiet
	// machine may hold no switch at all.
	for range 3 {
		if err := exec.Command("sleep", "0.01").Run(); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, stderr := runCmd("ctl", "--session", "fr", "snapshot"); code != 0 {
		t.Fatalf("ctl snapshot: exit %d: %s", code, stderr)
	}
	code, st, stderr := runCmd("ctl", "--session", "fr", "rewind")
	if code != 0 || !strings.Contains(st, out+".rewind-1") {
		t.Fatalf("ctl rewind: exit %d: %s%s", code, st, stderr)
	}
	if err := os.WriteFile(filepath.Join(dir, "rewind"), []byte("1\n"), 0); err != nil {
		t.Fatal(err)
	}
	// Under the lttng profile each rewind is a session: its trace in kernel/.
	waitFor(t, func() bool {
		_, err := os.Stat(filepath.Join(relayfmt.TraceDir(out+".rewind-2"), "metadata"))
		return err == nil
	})
	if c, o := end(); c != 0 {
		t.Fatalf("record exit %d\n%s", c, o)
	}
	want, not := "sched:sched_switch: ", "prev_tid = "
	if prof == "lttng" {
		want, not = " sched_switch: ", "sched:sched_switch"
	}
	for _, r := range []string{out + ".rewind-1", out + ".rewind-2"} {
		b, err := exec.Command(bt2, r).CombinedOutput()
		if err != nil || !strings.Contains(string(b), want) || strings.Contains(string(b), not) {
			t.Fatalf("babeltrace2 %s: %v: want %q and no %q\n%.500s", r, err, want, not, b)
		}
	}
}

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
