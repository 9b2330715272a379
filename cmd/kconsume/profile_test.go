package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/profile"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestRecordUnknownProfile: an unknown profile is a usage error that
// lists the known ones, before anything is written.
func TestRecordUnknownProfile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "t")
	code, _, stderr := runCmd("record", "--profile", "babeltrace", "-o", dir, "-e", "sched:sched_switch")
	if code != 2 || !strings.Contains(stderr, `unknown profile "babeltrace": known profiles are ftrace, lttng`) {
		t.Fatalf("code %d, stderr %s", code, stderr)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("output directory created: %v", err)
	}
}

// TestReportStatsLTTngTrace: report and stats read a trace written under
// the lttng profile; report -e takes the ftrace name and the LTTng one,
// and --pid matches the tid lttng-modules' block events carry.
func TestReportStatsLTTngTrace(t *testing.T) {
	dir := t.TempDir()
	ds, err := relayfmt.NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	env, err := profile.LTTngEnv("unit", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 2, Clock: relayfmt.Clock{Name: "monotonic"}}, profile.LTTng.Sink(ds, env))
	if err != nil {
		t.Fatal(err)
	}
	sw, err := ch.AddEventClass("sched:sched_switch", []relayfmt.Field{relayfmt.ScalarField("common_pid", relayfmt.S32), relayfmt.ScalarField("prev_pid", relayfmt.S32), relayfmt.ScalarField("next_pid", relayfmt.S32)})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := ch.AddEventClass("syscalls:sys_enter_read", []relayfmt.Field{relayfmt.ScalarField("common_pid", relayfmt.S32), relayfmt.ScalarField("fd", relayfmt.U32)})
	if err != nil {
		t.Fatal(err)
	}
	// lttng-modules' block_plug has tid where ftrace's has common_pid.
	plug, err := ch.AddEventClass("block:block_plug", []relayfmt.Field{relayfmt.ScalarField("common_pid", relayfmt.S32)})
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if err := ch.Write(0, 1500, plug.ID, le.AppendUint32(nil, 7)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := ch.Write(i%2, uint64(1000+i), sw.ID, le.AppendUint32(le.AppendUint32(le.AppendUint32(nil, 5), 5), 6)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Write(1, 2000, rd.ID, le.AppendUint32(le.AppendUint32(nil, 6), 3)); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{"sched:sched_switch", "sched_switch", "sched:*"} {
		code, out, stderr := runCmd("report", dir, "-e", e)
		if code != 0 || strings.Count(out, "sched_switch: common_pid=5 prev_tid=5 next_tid=6") != 3 || strings.Contains(out, "read") {
			t.Errorf("report -e %s: %d\n%s%s", e, code, out, stderr)
		}
	}
	code, out, stderr := runCmd("report", dir, "-e", "syscalls:sys_enter_read", "--pid", "6")
	if code != 0 || !strings.Contains(out, "syscall_entry_read: common_pid=6 fd=3") || strings.Count(out, "\n") != 1 {
		t.Errorf("report syscalls: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCmd("report", dir, "-e", "block:*", "--pid", "7")
	if code != 0 || !strings.Contains(out, "block_plug: tid=7") || strings.Count(out, "\n") != 1 {
		t.Errorf("report block --pid 7: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCmd("stats", dir)
	if code != 0 || !strings.Contains(out, "3  sched_switch") || !strings.Contains(out, "1  syscall_entry_read") {
		t.Errorf("stats: %d\n%s%s", code, out, stderr)
	}
}
