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
