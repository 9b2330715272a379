package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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
		{[]string{"record", "-o", out}, "-e EVENT is required"},
		{[]string{"record", "-o", out, "-e", "nosuch:event"}, "kconsume list"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--subbuf-size", "5000"}, "multiple of"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--subbuf-size", "12Q"}, "size"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--n-subbufs", "1"}, "2.."},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--ring-size", "12K"}, "power of two"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--subbuf-size", "256M", "--n-subbufs", "4096"}, "free memory"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--mode", "fast"}, "discard or overwrite"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--transport", "x"}, "ringbuf"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--clock", "x"}, "mono"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--pid", "abc"}, "not a process id"},
		{[]string{"record", "-o", full, "-e", "sched:sched_switch"}, "not empty"},
		{[]string{"record", "-o", full, "-e", "sched:sched_switch", "--force"}, "not part of a trace"},
		{[]string{"record", "-o", link, "-e", "sched:sched_switch"}, "symlink"},
		{[]string{"record", "-o", out, "-e", "sched:sched_switch", "--bogus"}, "flag provided but not defined"},
		{[]string{"list", "nosuch:*"}, "no tracepoint matches"},
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
	if code, _, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_switch", "--duration", "200ms", "--force"); code != 0 {
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
	out := filepath.Join(mnt, "t")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "-e", "sched:sched_process_exec,sched:sched_process_fork,sched:sched_switch", "--subbuf-size", "16K", "--duration", "30s",
		"--", "sh", "-c", "for i in $(seq 5000); do /bin/true; done")
	if code != 1 || !strings.Contains(stderr, "disk full") || !strings.Contains(stderr, "whole") {
		t.Fatalf("exit %d, stderr %q; want 1 and a disk-full message\n%s", code, stderr, stdout)
	}
	if code, st, stderr := runCmd("stats", out); code != 0 {
		t.Fatalf("stats after disk full: exit %d\n%s%s", code, st, stderr)
	}
	testenv.RunBT2(t, out)
}
