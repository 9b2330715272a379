package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

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
	for _, want := range []string{"# TYPE kconsume_lost_total counter", `layer="kernel"`, `kconsume_events_total{cpu="0"}`, "kconsume_emitted_total", `kconsume_missed_total{cpu="0"}`, `kconsume_callchains_lost_total{state="empty"} 0`, "kconsume_perf_contexts_unread_total 0", "\nkconsume_drainer_late_total ", "# TYPE kconsume_drainer_overrun_max_seconds gauge"} {
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

// TestCtlFilter changes a running recording's field filter with ctl
// filter: the renames before the change pass the first filter, those
// after it the second, and 0 removes the filter.
func TestCtlFilter(t *testing.T) {
	testenv.RequireRoot(t)
	old := controlRoot
	controlRoot = t.TempDir()
	t.Cleanup(func() { controlRoot = old })
	out := filepath.Join(t.TempDir(), "t")
	end := recordInProcess(t, "-q", "-o", out, "--session", "flt", "-e", "task:task_rename", "-f", `newcomm ~ "kc-ctl-a*"`)
	dir := filepath.Join(controlRoot, "flt")
	waitFor(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "state"))
		return strings.TrimSpace(string(b)) == "running"
	})
	rename := func(names ...string) {
		t.Helper()
		done := make(chan error)
		go func() {
			// Never unlocked: the renamed thread ends with the
			// goroutine, but for the process's first thread, which Go
			// keeps: its name is given back (/proc/self/comm is its).
			runtime.LockOSThread()
			orig, _ := os.ReadFile("/proc/thread-self/comm")
			names := append(names, strings.TrimSpace(string(orig)))
			for _, n := range names {
				p, err := unix.BytePtrFromString(n)
				if err == nil {
					err = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(p)), 0, 0, 0)
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	rename("kc-ctl-a1", "kc-ctl-b1")
	if code, _, stderr := runCmd("ctl", "filter", `task:task_rename:newcomm ~ "kc-ctl-b*"`); code != 0 {
		t.Fatalf("ctl filter: exit %d: %s", code, stderr)
	}
	rename("kc-ctl-a2", "kc-ctl-b2")
	if code, _, stderr := runCmd("ctl", "filter", "task_rename:0"); code != 0 {
		t.Fatalf("ctl filter task_rename:0: exit %d: %s", code, stderr)
	}
	rename("kc-ctl-a3", "kc-ctl-b3")
	for _, bad := range [][]string{{"ctl", "filter", `task:task_rename:newcomm < 1`}, {"ctl", "filter", "nocolon"}, {"ctl", "filter"}, {"ctl", "filter", "sched:sched_switch:prev_pid > 0"}} {
		if code, _, _ := runCmd(bad...); code == 0 {
			t.Errorf("%v: exit 0, want an error", bad)
		}
	}
	if code, output := end(); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, output)
	}
	code, stdout, stderr := runCmd("report", out)
	if code != 0 {
		t.Fatalf("report: exit %d: %s", code, stderr)
	}
	var got []string
	for _, line := range strings.Split(stdout, "\n") {
		if i := strings.Index(line, `newcomm="kc-ctl-`); i >= 0 {
			got = append(got, strings.Fields(line[i:])[0])
		}
	}
	want := []string{`newcomm="kc-ctl-a1"`, `newcomm="kc-ctl-b2"`, `newcomm="kc-ctl-a3"`, `newcomm="kc-ctl-b3"`}
	if !slices.Equal(got, want) {
		t.Fatalf("renames in the trace %q, want %q", got, want)
	}
}
