package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
)

// niceOf returns the nice value in a /proc/PID/stat or task stat line
// (field 19, counted after the parenthesised command name).
func niceOf(t *testing.T, stat string) int {
	t.Helper()
	i := strings.LastIndexByte(stat, ')')
	f := strings.Fields(stat[i+1:])
	if len(f) < 17 {
		t.Fatalf("stat line %q", stat)
	}
	n, err := strconv.Atoi(f[16])
	if err != nil {
		t.Fatalf("stat line %q: %v", stat, err)
	}
	return n
}

// TestRecordNice: while record runs, every thread of kconsume runs at
// --nice (default -10), the command at kconsume's value before, and
// after it every thread is back.
func TestRecordNice(t *testing.T) {
	testenv.RequireRoot(t)
	before, err := currentNice()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want int
	}{{nil, defaultNice}, {[]string{"--nice", "-3"}, -3}, {[]string{"--nice", "4"}, 4}} {
		dir := t.TempDir()
		self, parent := filepath.Join(dir, "self"), filepath.Join(dir, "parent")
		args := append([]string{"record", "-q", "-o", filepath.Join(dir, "t"), "-e", "sched:sched_process_exec"}, c.args...)
		args = append(args, "--", "sh", "-c", "cat /proc/self/stat > "+self+"; cat /proc/$PPID/task/*/stat > "+parent)
		if code, stdout, stderr := runCmd(args...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", c.args, code, stdout, stderr)
		}
		b, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		if n := niceOf(t, string(b)); n != before {
			t.Errorf("%v: the command ran at nice %d, want kconsume's own %d", c.args, n, before)
		}
		b, err = os.ReadFile(parent)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if n := niceOf(t, l); n != c.want {
				t.Errorf("%v: a kconsume thread ran at nice %d, want %d: %s", c.args, n, c.want, l)
			}
		}
		tasks, _ := filepath.Glob("/proc/self/task/*/stat")
		for _, p := range tasks {
			if b, err := os.ReadFile(p); err == nil {
				if n := niceOf(t, string(b)); n != before {
					t.Errorf("%v: after record a thread is at nice %d, want %d", c.args, n, before)
				}
			}
		}
	}
	if code, _, stderr := runCmd("record", "-o", filepath.Join(t.TempDir(), "t"), "-e", "sched:sched_switch", "--nice", "-21"); code != 2 || !strings.Contains(stderr, "-20..19") {
		t.Errorf("--nice -21: exit %d, %s", code, stderr)
	}
}
