package main

import (
	"bytes"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/internal/testenv"
)

// shell runs a command line in sh and returns its output and exit code.
func shell(t *testing.T, line string) (string, int) {
	t.Helper()
	return runShell(t, exec.Command("sh", "-c", line))
}

// runShell runs cmd and returns its output and exit code, failing t when
// it cannot run at all.
func runShell(t *testing.T, cmd *exec.Cmd) (string, int) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// TestE2EControlFromShell runs the built binary: record in the background,
// then from a shell: cat state and dropped, echo stop > state, ctl status,
// and kconsume report on the finished trace, once a SIGINT ended it.
func TestE2EControlFromShell(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	out := filepath.Join(t.TempDir(), "t")
	name := "e2e" + strings.ReplaceAll(filepath.Base(filepath.Dir(out)), "/", "")
	// No --duration: the steps below, each a shell and a process, take
	// what the machine takes (seconds in a TCG guest), and a recording
	// that ended before them would leave them no session. It ends on the
	// SIGINT below, or on the Cleanup's SIGKILL when the test fails.
	rec := exec.Command(bin, "record", "-o", out, "--session", name, "-e", "sched:sched_switch")
	var recOut bytes.Buffer
	rec.Stdout, rec.Stderr = &recOut, &recOut
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = rec.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = rec.Process.Kill()
		<-exited
		// A killed session leaves its control directory behind.
		_ = os.RemoveAll(filepath.Join(control.DefaultRoot, name))
	})
	ctl := filepath.Join("/run/kconsume", name)
	waitFor(t, func() bool { _, err := os.Stat(filepath.Join(ctl, "ctl.sock")); return err == nil })
	// state reads stopped while the session loads, running once the gate opens.
	waitFor(t, func() bool { o, _ := shell(t, "cat "+ctl+"/state"); return strings.TrimSpace(o) == "running" })
	if o, code := shell(t, "cat "+ctl+"/dropped"); code != 0 || strings.TrimSpace(o) != "0" {
		t.Fatalf("cat dropped: %q", o)
	}
	if _, code := shell(t, "echo stop > "+ctl+"/state"); code != 0 {
		t.Fatal("echo stop > state failed")
	}
	waitFor(t, func() bool { o, _ := shell(t, "cat "+ctl+"/state"); return strings.TrimSpace(o) == "stopped" })
	if o, code := shell(t, bin+" ctl --session "+name+" status"); code != 0 || !strings.Contains(o, "state stopped") {
		t.Fatalf("ctl status: %d %s", code, o)
	}
	if err := rec.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("record still running a minute after SIGINT")
	}
	if !rec.ProcessState.Success() {
		t.Fatalf("record: %v\n%s", rec.ProcessState, recOut.String())
	}
	if o, code := shell(t, bin+" report "+out+" | head -1"); code != 0 || !strings.Contains(o, "sched:sched_switch:") {
		t.Fatalf("report: %d %q", code, o)
	}
}

// TestE2EKillRecover: SIGKILL a recording; kconsume recover makes the
// files readable by babeltrace2. --latency makes records reach the disk
// while the load is light; without it they wait for a quarter-full ring.
func TestE2EKillRecover(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	out := filepath.Join(t.TempDir(), "t")
	rec := exec.Command(bin, "record", "-q", "-o", out, "-e", "sched:sched_switch,syscalls:sys_enter_close", "--subbuf-size", "4K", "--latency", "10ms")
	var recOut bytes.Buffer
	rec.Stdout, rec.Stderr = &recOut, &recOut
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = rec.Wait(); close(exited) }()
	t.Cleanup(func() { _ = rec.Process.Kill(); <-exited })
	// Let sub-buffers reach the disk, then kill it mid-write. The test
	// makes events (close(2)) as it waits: an idle machine makes few.
	waitFor(t, func() bool {
		closeDevNull(20)
		select {
		case <-exited:
			t.Fatalf("record exited early: %s", recOut.String())
		default:
		}
		m, _ := filepath.Glob(filepath.Join(out, "trace*"))
		for _, f := range m {
			if fi, err := os.Stat(f); err == nil && fi.Size() >= 3*4096 {
				return true
			}
		}
		return false
	})
	time.Sleep(100 * time.Millisecond)
	_ = rec.Process.Signal(syscall.SIGKILL)
	<-exited
	if o, code := shell(t, bin+" recover "+out); code != 0 {
		t.Fatalf("recover: %d %s", code, o)
	}
	testenv.RunBT2(t, out)
	if o, code := shell(t, bin+" stats "+out); code != 0 {
		t.Fatalf("stats after recover: %d %s", code, o)
	}
	// The killed session's control directory is stale: a new record with
	// the same name replaces it.
	out2 := filepath.Join(t.TempDir(), "t")
	if o, code := shell(t, bin+" record -q -o "+out2+" --session t -e sched:sched_switch --duration 100ms"); code != 0 {
		t.Fatalf("record after a killed session: %d %s", code, o)
	}
}

// TestE2EBrokenPipe: a recording whose output nobody reads any more
// (record ... | true) ends as it would have: exit status 0, whole files,
// and no control directory left behind, which a SIGPIPE at the summary
// used to leave.
func TestE2EBrokenPipe(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	dir := t.TempDir()
	out, status := filepath.Join(dir, "t"), filepath.Join(dir, "status")
	const name = "kc-broken-pipe"
	ctl := filepath.Join(control.DefaultRoot, name)
	t.Cleanup(func() { _ = os.RemoveAll(ctl) })
	if o, code := shell(t, "("+bin+" record -o "+out+" --session "+name+" -e sched:sched_switch -- sleep 0.1; echo $? >"+status+") | true"); code != 0 {
		t.Fatalf("pipeline: %d %s", code, o)
	}
	if _, err := os.Stat(ctl); !os.IsNotExist(err) {
		t.Errorf("control directory left behind: %v", err)
	}
	if b, err := os.ReadFile(status); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Fatalf("record's exit status: %q %v", b, err)
	}
	// A sleeping command switches out at least once: a quiet machine and
	// recorder may switch no task in a fixed 300 ms.
	if lines, _ := testenv.RunBT2(t, out); len(lines) == 0 {
		t.Fatal("babeltrace2 read no event")
	}
}

// TestE2ENotRoot: without privileges, one line and exit 1.
func TestE2ENotRoot(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	// nobody must be able to run the binary from its temp directory.
	if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "record", "-o", filepath.Join(os.TempDir(), "kc-nobody"), "-e", "sched:sched_switch")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "CAP_BPF") {
		t.Fatalf("as nobody, want one line naming CAP_BPF: %q", out)
	}
}

func TestMain(m *testing.M) {
	if n := os.Getenv("KC_GETPIDS"); n != "" {
		os.Exit(getpidsChild(n))
	}
	code := m.Run()
	testenv.RemoveBin()
	testenv.SweepPins()
	os.Exit(code)
}

// TestE2ECommand records a command, which kconsume starts held before
// its exec and lets go once the gate is open: the command gets its
// arguments, environment and standard input as given, its exit status is
// kconsume's, and its exec is in the trace. A command that does not exist
// is refused before anything is recorded.
func TestE2ECommand(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "cmd.sh")
	body := "#!/bin/sh\nprintf '%s|' \"$@\"\nread -r x\necho \"in=$x env=$KC_E2E_VAR\"\nexit 3\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "t")
	rec := exec.Command(bin, "record", "-q", "-o", out, "-e", "sched:sched_process_exec", script, "a b", "$HOME", "")
	rec.Env = append(os.Environ(), "KC_E2E_VAR=v 1")
	rec.Stdin = strings.NewReader("hello\n")
	var stdout, stderr bytes.Buffer
	rec.Stdout, rec.Stderr = &stdout, &stderr
	err := rec.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("record: %v, want the command's exit status 3\n%s", err, stderr.String())
	}
	// The summary follows on standard output.
	if want := "a b|$HOME||in=hello env=v 1\n"; !strings.HasPrefix(stdout.String(), want) {
		t.Fatalf("command wrote %q, want %q first", stdout.String(), want)
	}
	rep, err := exec.Command(bin, "report", out).Output()
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if n := strings.Count(string(rep), `filename="`+script+`"`); n != 1 {
		t.Fatalf("%d execs of %s in the trace, want 1:\n%s", n, script, rep)
	}

	missing := exec.Command(bin, "record", "-q", "-o", filepath.Join(dir, "t2"), "-e", "sched:sched_switch", filepath.Join(dir, "no-such-command"))
	msg, err := missing.CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "no-such-command") {
		t.Fatalf("missing command: %v\n%s", err, msg)
	}
}

// TestE2EOwnCPU runs the built binary on a command that burns CPU in a
// shell loop and on one that makes many recorded syscalls: the summary
// gives kconsume's own CPU time while recording, which leaves the
// command's out (the loop's CPU, sized on this machine, is not in it)
// and grows with the events recorded.
func TestE2EOwnCPU(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	line := regexp.MustCompile(`(?m)^kconsume's own CPU while recording: ([0-9.]+) ms \(([0-9.]+) ms user, ([0-9.]+) ms system\)(, ([0-9]+) ns an event)?$`)
	// own returns kconsume's own CPU while recording in ms, per event in
	// ns, and the CPU of everything else the run took: kconsume's setup
	// and the command, which kconsume reaps, so that the Rusage of its
	// process includes it.
	own := func(events string, command ...string) (ms float64, perEvent int, rest time.Duration) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"record", "-q", "-o", filepath.Join(t.TempDir(), "t"), "-e", events, "--"}, command...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
		m := line.FindStringSubmatch(string(out))
		if m == nil {
			t.Fatalf("%v: no line of kconsume's own CPU in the summary:\n%s", cmd.Args, out)
		}
		all, _ := strconv.ParseFloat(m[1], 64)
		user, _ := strconv.ParseFloat(m[2], 64)
		sys, _ := strconv.ParseFloat(m[3], 64)
		if math.Abs(all-user-sys) > 0.15 {
			t.Errorf("%s ms is not %s user + %s system", m[1], m[2], m[3])
		}
		perEvent, _ = strconv.Atoi(m[5])
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		total := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		return all, perEvent, total - time.Duration(all*float64(time.Millisecond))
	}
	// kconsume's own CPU with a command that does nothing: its fixed cost
	// while recording, on this machine; the least of three, as a busy
	// machine only adds to it.
	idleMS := math.Inf(1)
	for range 3 {
		ms, _, _ := own("sched:sched_process_exit", "true")
		idleMS = min(idleMS, ms)
	}
	// A shell loop long enough that counting its CPU in would show: at
	// least a quarter of a second and twenty times that fixed cost, sized
	// on this machine by timing the loop alone, so that the bounds below
	// hold on a machine of any speed, an emulated guest included.
	n, loop := testenv.LoopCPU(t, max(250*time.Millisecond, time.Duration(20*idleMS*float64(time.Millisecond))))
	loopMS, _, rest := own("sched:sched_process_exit", "sh", "-c", testenv.ShellLoop(n))
	// Counted in, the loop would add about its own CPU; left out, kconsume
	// adds to its fixed cost only what it spends idle beside the loop.
	if loopMS > idleMS+float64(loop.Milliseconds())/2 || rest < loop/2 {
		t.Errorf("a shell loop of %v alone: kconsume's own %.1f ms (%.1f ms beside true), the rest %v", loop, loopMS, idleMS, rest)
	}
	// 200,000 one-byte reads and writes, each recorded.
	ddMS, perEvent, _ := own("syscalls:sys_enter_read,syscalls:sys_enter_write", "dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=200000")
	if ddMS <= idleMS || perEvent <= 0 || perEvent > 20000 {
		t.Errorf("400,000 events: kconsume's own %.1f ms, %d ns an event; with no events %.1f ms", ddMS, perEvent, idleMS)
	}
	t.Logf("beside true: kconsume %.1f ms; a shell loop of %v alone: kconsume %.1f ms, the rest %v; dd: kconsume %.1f ms, %d ns an event", idleMS, loop, loopMS, rest, ddMS, perEvent)
}
