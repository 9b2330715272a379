package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/testenv"
)

// TestParseTrigger reads --trigger's syntax: the event, the condition
// after a space (colons in its strings kept), the action after the last
// " : " outside quotes and the rate limit.
func TestParseTrigger(t *testing.T) {
	cases := []struct {
		in   string
		want consumer.Trigger
	}{
		{"syscalls:sys_exit_openat ret == -2 : snapshot", consumer.Trigger{Event: "syscalls:sys_exit_openat", Expr: "ret == -2", Action: consumer.TriggerSnapshot}},
		{"sched:sched_switch : stop", consumer.Trigger{Event: "sched:sched_switch", Action: consumer.TriggerStop}},
		{"syscalls:sys_exit_openat ret == -2 : rotate, every 1m", consumer.Trigger{Event: "syscalls:sys_exit_openat", Expr: "ret == -2", Action: consumer.TriggerRotate, Interval: time.Minute}},
		{"sys_exit_openat  ret < 0 && comm == \"a : b\" :start, every 10s", consumer.Trigger{Event: "sys_exit_openat", Expr: "ret < 0 && comm == \"a : b\"", Action: consumer.TriggerStart, Interval: 10 * time.Second}},
		{"task:task_rename newcomm ~ 'x : *' : snapshot ,every 250ms", consumer.Trigger{Event: "task:task_rename", Expr: "newcomm ~ 'x : *'", Action: consumer.TriggerSnapshot, Interval: 250 * time.Millisecond}},
	}
	for _, c := range cases {
		got, err := parseTrigger(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseTrigger(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	bad := map[string]string{
		"syscalls:sys_exit_openat ret == -2":            "no action",
		"syscalls:sys_exit_openat : explode":            `unknown action "explode"`,
		" : stop":                                       "no event",
		"syscalls:sys_exit_openat : ":                   "no action",
		"syscalls:sys_exit_openat : stop, every 0s":     "want a positive duration",
		"syscalls:sys_exit_openat : stop, every -5s":    "want a positive duration",
		"syscalls:sys_exit_openat : stop, every soon":   "rate limit",
		"syscalls:sys_exit_openat : stop, 10s":          "want ', every DURATION'",
		"syscalls:sys_exit_openat:ret==-2 : stop":       "put a space between",
		"syscalls:sys_exit_openat comm == \"a : stop\"": "no action",
	}
	for in, want := range bad {
		if _, err := parseTrigger(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseTrigger(%q) = %v; want an error with %q", in, err, want)
		}
	}
}

// TestRecordTriggerBadInput: a bad trigger stops record before anything
// is traced, with a clear error, and leaves no trace behind.
func TestRecordTriggerBadInput(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireKernel(t, 5, 12, "triggers (BPF compare-and-swap)")
	cases := []struct {
		trigger string
		more    []string
		want    string
	}{
		{"syscalls:sys_exit_openat ret == -2 : explode", nil, `unknown action "explode"`},
		{"syscalls:sys_exit_openat ret == -2 snapshot", nil, "no action"},
		{"syscalls:sys_exit_openat : rotate", []string{"--mode", "overwrite"}, "rotation (--rotate-size, --rotate-interval, a rotate trigger) needs --mode discard"},
		{"syscalls:sys_exit_openat : stop", []string{"--max-chunks", "3"}, "need --rotate-size, --rotate-interval or a rotate trigger"},
		{"syscalls:sys_exit_openat : stop, every 0s", nil, "want a positive duration"},
		{"syscalls:sys_exit_openat : stop, every -1s", nil, "want a positive duration"},
		{"syscalls:sys_exit_openat ret = -2 : stop", nil, "position 5: Invalid operator"},
		{"syscalls:sys_exit_openat nosuch == 1 : stop", nil, "Field not found"},
		{"syscalls:sys_exit_openat ret == -2 : snapshot", nil, "needs --mode overwrite"},
		{"syscalls:sys_exit_close : stop", nil, "syscalls:sys_exit_close: no recorded event matches it"},
		{"syscalls:sys_exit_openat : stop", []string{"--trigger", "syscalls:sys_exit_* ret == 1 : start"}, "has a trigger already"},
		{"syscalls:sys_exit_openat : stop", []string{"--transport", "perf"}, "triggers need BPF ring buffers"},
	}
	for _, c := range cases {
		out := filepath.Join(t.TempDir(), "t")
		args := append([]string{"record", "-q", "-o", out, "-e", "syscalls:sys_exit_openat", "--duration", "10ms", "--trigger", c.trigger}, c.more...)
		code, stdout, stderr := runCmd(args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("--trigger %q %q: exit %d, want an error with %q\n%s%s", c.trigger, c.more, code, c.want, stdout, stderr)
		}
		if _, err := os.Stat(filepath.Join(out, "metadata")); err == nil {
			t.Errorf("--trigger %q: a trace was written", c.trigger)
		}
	}
}

// TestRecordTrigger runs record with a snapshot trigger in overwrite
// mode on a command whose one failed openat fires it: the summary
// counts one action and one snapshot, and babeltrace2 finds the event
// in the trace.
func TestRecordTrigger(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireKernel(t, 5, 12, "triggers (BPF compare-and-swap)")
	out := filepath.Join(t.TempDir(), "t")
	missing := filepath.Join(t.TempDir(), "kc-cli-nonexistent")
	code, stdout, stderr := runCmd("record", "-q", "-o", out, "--mode", "overwrite", "-e", "syscalls:sys_exit_openat",
		"--trigger", `syscalls:sys_exit_openat ret == -2 && comm == "kc-cli-trig" : snapshot, every 10s`,
		"--", "sh", "-c", `printf kc-cli-trig > /proc/self/comm; for i in 1 2 3; do true < `+missing+`; done 2>/dev/null; true`)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{"condition held 3 times, snapshot 1 times", "triggers wrote 1 snapshots"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the summary lacks %q:\n%s", want, stdout)
		}
	}
	lines, _ := testenv.RunBT2(t, out)
	n := 0
	for _, l := range lines {
		if strings.Contains(l, "syscalls:sys_exit_openat") && strings.Contains(l, "ret = -2") {
			n++
		}
	}
	// The snapshot wrote the first; the other two, and the snapshot's
	// later events, the end's write.
	if n != 3 {
		t.Errorf("babeltrace2 shows %d failed openats, want 3", n)
	}
}
