package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
)

// TestRecordFilter records renames under -f and --filter: only the
// events whose fields pass are in the trace, as report shows it, and the
// events of an -e without a filter are all there.
func TestRecordFilter(t *testing.T) {
	testenv.RequireRoot(t)
	out := filepath.Join(t.TempDir(), "t")
	script := "for n in kc-cli-no kc-cli-yes kc-cli-yes2 kc-cli-no2; do printf $n > /proc/self/comm; done"
	code, stdout, stderr := runCmd("record", "-q", "-o", out,
		"-e", "task:task_rename", "-f", `newcomm == "kc-cli-yes" || newcomm ~ "kc-cli-no2*"`,
		"-e", "sched:sched_process_exec", "--filter", `sched:sched_process_exec:common_pid >= 0 && !(common_pid < 0)`,
		"--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{"the filter on task:task_rename kept 2 events", "the filter on sched:sched_process_exec kept "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the summary lacks %q:\n%s", want, stdout)
		}
	}
	// A filter that keeps nothing says so.
	code, stdout, stderr = runCmd("record", "-o", filepath.Join(t.TempDir(), "none"), "-e", "task:task_rename", "-f", `newcomm == "kc-cli-never"`, "--", "sh", "-c", script)
	if code != 0 || !strings.Contains(stdout, "note: the filter on task:task_rename kept none of its events") {
		t.Errorf("a filter that keeps nothing: exit %d, summary:\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = runCmd("report", out)
	if code != 0 {
		t.Fatalf("report: exit %d\n%s%s", code, stdout, stderr)
	}
	var renames []string
	execs := 0
	for _, line := range strings.Split(stdout, "\n") {
		switch {
		case strings.Contains(line, "task_rename"):
			if i := strings.Index(line, "newcomm"); i >= 0 {
				renames = append(renames, strings.Fields(line[i:])[0])
			}
		case strings.Contains(line, "sched_process_exec"):
			execs++
		}
	}
	want := []string{`newcomm="kc-cli-yes"`, `newcomm="kc-cli-no2"`}
	if !slices.Equal(renames, want) {
		t.Errorf("renames in the trace: %q, want %q\n%s", renames, want, stdout)
	}
	if execs == 0 {
		t.Errorf("no sched_process_exec in the trace, which a filter every event passes kept\n%s", stdout)
	}
}

// TestReportFilter filters recorded traces with report --filter, in both
// profiles: by an event's fields, for the events a pattern names or for
// all, by the CPU, and refuses an expression the kernel would refuse.
func TestReportFilter(t *testing.T) {
	testenv.RequireRoot(t)
	script := "for n in kc-rf-a kc-rf-bb kc-rf-ccc; do printf $n > /proc/self/comm; done; /bin/true"
	for _, prof := range []string{"ftrace", "lttng"} {
		t.Run(prof, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "t")
			code, stdout, stderr := runCmd("record", "-q", "--profile", prof, "-o", out, "-e", "task:task_rename,sched:sched_process_exec", "--", "sh", "-c", script)
			if code != 0 {
				t.Fatalf("record: exit %d\n%s%s", code, stdout, stderr)
			}
			exec := "sched:sched_process_exec"
			if prof == "lttng" {
				out = filepath.Join(out, "kernel")
				exec = "sched_process_exec"
			}
			cases := []struct {
				filter string
				want   []string // each line has one, in order
			}{
				{`task_rename:newcomm ~ "kc-rf-b*" || newcomm == "kc-rf-ccc"`, []string{`newcomm="kc-rf-bb"`, `newcomm="kc-rf-ccc"`}},
				{`task:task_rename:oldcomm == "kc-rf-a"`, []string{`newcomm="kc-rf-bb"`}},
				{exec + `:filename ~ "*/true"`, []string{`filename="/bin/true"`}},
				{`sched:sched_process_exec:filename ~ "*/true"`, []string{`filename="/bin/true"`}},
				// For every event: those without the field fail it.
				{`filename ~ "*/true"`, []string{`filename="/bin/true"`}},
				{`filename ~ "*/true" || newcomm == "kc-rf-a"`, nil},
				{`newcomm == "kc-rf-a" && CPU >= 0 && CPU < 4096`, []string{`newcomm="kc-rf-a"`}},
				{`newcomm == "kc-rf-a" && CPU < 0`, nil},
			}
			for _, c := range cases {
				code, stdout, stderr := runCmd("report", out, "--filter", c.filter)
				if code != 0 {
					t.Fatalf("--filter %s: exit %d\n%s", c.filter, code, stderr)
				}
				lines := strings.Split(strings.TrimSpace(stdout), "\n")
				if stdout == "" {
					lines = nil
				}
				if len(lines) != len(c.want) {
					t.Fatalf("--filter %s: %d lines, want %d:\n%s", c.filter, len(lines), len(c.want), stdout)
				}
				for i, w := range c.want {
					if !strings.Contains(lines[i], w) {
						t.Errorf("--filter %s: line %d is %q, want %s", c.filter, i, lines[i], w)
					}
				}
			}
			code, _, stderr = runCmd("report", out, "--filter", "task:task_rename:newcomm < 1")
			if code != 2 || !strings.Contains(stderr, "Expecting string field") {
				t.Errorf("a filter the kernel refuses: exit %d, %q", code, stderr)
			}
		})
	}
}
