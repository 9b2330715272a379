package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/testenv"
)

// TestKillRecoverCounts: a recording killed (SIGKILL) with events still
// in its rings and buffers, in each of the recorder's modes; kconsume
// recover writes what the pinned packet rings held and counts the rest
// as discarded, so babeltrace2's events and discarded events add up to
// the events made before the kill, exactly. recover then removes the
// recording's note and pins. The sub-buffers are large and the rings
// are drained only at the watermark, so the kill finds most events in
// memory.
func TestKillRecoverCounts(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	// The modes as this kernel has them: where it lacks the recorder's
	// own rings (before 5.18, say), every mode writes BPF ring buffers
	// and the note says "records".
	modes := []struct {
		name string
		args []string
	}{
		{"packets", nil},
		{"record rings", []string{"--latency", "50ms"}},
		{"one ring", []string{"--latency", "50ms", "--global"}},
		{"overwrite", []string{"--mode", "overwrite"}},
		{"perf buffers", []string{"--transport", "perf"}},
	}
	for i, m := range modes {
		t.Run(strings.ReplaceAll(m.name, " ", "-"), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "t")
			args := append([]string{"-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--duration", "10m"}, m.args...)
			rec := startRecording(t, fmt.Sprintf("kill%d%s", i, uniq), args...)
			note, err := os.ReadFile(filepath.Join(dir, consumer.CrashNote))
			if err != nil || !noteCounts.Match(note) {
				t.Fatalf("the recording's note: %q %v, want the kind of its counts", note, err)
			}
			t.Logf("note: %s", bytes.TrimSpace(note))
			const made = 40000
			getpids(t, made/2)
			getpids(t, made/2)
			_ = rec.cmd.Process.Kill()
			rec.wait(t)
			pins, _ := filepath.Glob(fmt.Sprintf("/sys/fs/bpf/kconsume/%d-*", rec.cmd.Process.Pid))
			if len(pins) != 1 {
				t.Fatalf("the killed recording's pins: %v, want one directory", pins)
			}
			out, code := shell(t, bin+" recover "+dir)
			if code != 0 || !strings.Contains(out, "the recording was killed") {
				t.Fatalf("recover: exit %d\n%s", code, out)
			}
			events, discarded := traceCounts(t, dir)
			if events+discarded != made {
				t.Errorf("babeltrace2 reads %d events and %d discarded, want %d in all\n%s", events, discarded, made, out)
			}
			t.Logf("%d events, %d discarded\n%s", events, discarded, out)
			if _, err := os.Stat(pins[0]); !os.IsNotExist(err) {
				t.Errorf("recover left the pins %s: %v", pins[0], err)
			}
			if _, err := os.Stat(filepath.Join(dir, consumer.CrashNote)); !os.IsNotExist(err) {
				t.Errorf("recover left the note: %v", err)
			}
			// A second recover has nothing more to count.
			if out, code := shell(t, bin+" recover "+dir); code != 0 || strings.Contains(out, "killed") {
				t.Errorf("recover again: exit %d\n%s", code, out)
			}
		})
	}
}

// noteCounts matches a note's kind of counts.
var noteCounts = regexp.MustCompile(`"counts":"(packets|area|records)"`)

// TestRecordLeavesNoPins: a recording that ends removes its note and
// its pins.
func TestRecordLeavesNoPins(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "t")
	rec := startRecording(t, "nopins"+uniq, "-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--duration", "10m")
	getpids(t, 1000)
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	if pins, _ := filepath.Glob(fmt.Sprintf("/sys/fs/bpf/kconsume/%d-*", rec.cmd.Process.Pid)); len(pins) != 0 {
		t.Errorf("record left its pins: %v", pins)
	}
	if _, err := os.Stat(filepath.Join(dir, consumer.CrashNote)); !os.IsNotExist(err) {
		t.Errorf("record left its note: %v", err)
	}
}
