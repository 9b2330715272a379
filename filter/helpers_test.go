package filter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// formats are the events of testdata, by "system:name": format files
// copied from a 6.18 kernel's tracefs, and rel_test, made up to hold the
// field types no stock event combines.
var formatFiles = map[string]string{
	"sched:sched_switch":        "sched_sched_switch.format",
	"sched:sched_wakeup":        "sched_sched_wakeup.format",
	"sched:sched_process_exec":  "sched_sched_process_exec.format",
	"syscalls:sys_enter_openat": "syscalls_sys_enter_openat.format",
	"syscalls:sys_enter_lseek":  "syscalls_sys_enter_lseek.format",
	"task:task_rename":          "task_task_rename.format",
	"ftrace:print":              "ftrace_print.format",
	"ipi:ipi_send_cpumask":      "ipi_ipi_send_cpumask.format",
	"test:rel_test":             "rel_loc.format",
}

// testFormat returns the testdata format of event "system:name".
func testFormat(t testing.TB, event string) *tracefs.Format {
	t.Helper()
	file, ok := formatFiles[event]
	if !ok {
		t.Fatalf("no testdata format for %s", event)
	}
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	sys, _, _ := strings.Cut(event, ":")
	f, err := tracefs.ParseFormat(sys, b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
