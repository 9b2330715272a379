package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/testenv"
)

// getpidsComm is the command name of the getpid child (getpidsChild),
// which record's --comm selects.
const getpidsComm = "kc-getpids"

// getpidsChild is the test binary run as the child that makes exactly n
// getpid calls (KC_GETPIDS=n), on one thread named getpidsComm and
// pinned to CPU 0, as the C program does, or to the CPU
// KC_GETPIDS_CPU names (-1: none). It returns its exit
// status.
func getpidsChild(arg string) int {
	runtime.LockOSThread()
	n, err := strconv.Atoi(arg)
	if err != nil {
		return 2
	}
	cpu := 0
	if v := os.Getenv("KC_GETPIDS_CPU"); v != "" {
		if cpu, err = strconv.Atoi(v); err != nil {
			return 2
		}
	}
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		// A CPU offline just now (TestFaultsHotplug) takes no task:
		// the worker runs unpinned, as one pinned to it before would
		// after the kernel moved it.
		if err := unix.SchedSetaffinity(0, &set); err != nil && (!errors.Is(err, unix.EINVAL) || os.Getenv("KC_GETPIDS_CPU") == "") {
			return 3
		}
	}
	if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&append([]byte(getpidsComm), 0)[0])), 0, 0, 0); err != nil {
		return 4
	}
	for range n {
		syscall.Getpid()
	}
	return 0
}

// getpids runs the getpid child for n calls and waits for it. Without
// asynchronous preemption the Go runtime makes no getpid of its own on
// the child's named thread.
func getpids(t *testing.T, n int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KC_GETPIDS="+strconv.Itoa(n), "GODEBUG=asyncpreemptoff=1", "GOGC=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("getpid child: %v\n%s", err, out)
	}
}

// recording is a kconsume record running in the background.
type recording struct {
	cmd    *exec.Cmd
	out    *testenv.Output
	exited chan error
	name   string
}

// startRecording starts record with args and session name, and returns
// once its gate is open (its control directory says running).
func startRecording(t *testing.T, name string, args ...string) *recording {
	t.Helper()
	bin := testenv.KconsumeBin(t)
	r := &recording{out: &testenv.Output{}, exited: make(chan error, 1), name: name}
	r.cmd = exec.Command(bin, append([]string{"record", "-q", "--session", name}, args...)...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.exited <- r.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-r.exited:
		default:
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
	})
	state := filepath.Join("/run/kconsume", name, "state")
	waitFor(t, func() bool {
		select {
		case err := <-r.exited:
			r.exited <- err // for Cleanup, which waits for the exit
			t.Fatalf("record ended before it ran: %v\n%s", err, r.out.String())
		default:
		}
		st, _ := os.ReadFile(state)
		return strings.TrimSpace(string(st)) == "running"
	})
	return r
}

// stop sends Ctrl-C and returns record's exit code once it ended.
func (r *recording) stop(t *testing.T) int {
	t.Helper()
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	return r.wait(t)
}

// wait returns record's exit code once it ended.
func (r *recording) wait(t *testing.T) int {
	t.Helper()
	err := <-r.exited
	r.exited <- err // for Cleanup
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("record: %v", err)
	return -1
}

var summaryTotals = regexp.MustCompile(`(?m)^(\d+) events recorded \([^)]*\) in \S+, (\d+) discarded(, up to \d+ more missed.*)?$`)

// summaryCounts returns the events record's summary says it recorded and
// discarded, failing t without a summary.
func summaryCounts(t *testing.T, out string) (recorded, discarded int) {
	t.Helper()
	m := summaryTotals.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary in record's output:\n%s", out)
	}
	recorded, _ = strconv.Atoi(m[1])
	discarded, _ = strconv.Atoi(m[2])
	return recorded, discarded
}

// traceCounts returns the events babeltrace2 reads in dir and the events
// it reports discarded. A discarded packet, whose events nobody counted,
// fails t.
func traceCounts(t *testing.T, dir string) (events, discarded int) {
	t.Helper()
	lines, discards := testenv.RunBT2(t, dir)
	for _, d := range discards {
		if d.Kind != "events" {
			t.Fatalf("babeltrace2 %s: %d %s discarded between %s and %s in %s: lost without a count", dir, d.Count, d.Kind, d.Begin, d.End, d.Stream)
		}
		discarded += d.Count
	}
	return len(lines), discarded
}

// checkTrace checks the invariant on the trace in dir of a workload of
// produced events: babeltrace2's events and discarded events add up to
// them, and record's summary (out) says the same as the trace.
func checkTrace(t *testing.T, what, dir string, produced int, out string) {
	t.Helper()
	events, discarded := traceCounts(t, dir)
	if events+discarded != produced {
		t.Errorf("%s: babeltrace2 reads %d events and %d discarded, %d lost without a count, of the %d made\n%s", what, events, discarded, produced-events-discarded, produced, out)
	}
	if out == "" {
		return
	}
	recorded, lost := summaryCounts(t, out)
	if recorded != events || lost != discarded {
		t.Errorf("%s: record's summary says %d events recorded and %d discarded; the trace holds %d and %d discarded\n%s", what, recorded, lost, events, discarded, out)
	}
}

// TestFaultRelaydKilledLocalWhole is issue 55's first case: record streams
// to a real lttng-relayd with a local copy under a getpid flood, relayd is
// killed (SIGKILL) between two floods: the local copy holds every event of
// both, or counts at their place those it lost, and record's summary says
// what the trace holds.
func TestFaultRelaydKilledLocalWhole(t *testing.T) {
	testenv.RequireRoot(t)
	r := testenv.StartRelayd(t)
	local := filepath.Join(t.TempDir(), "t")
	const n = 100000
	rec := startRecording(t, "kill55"+uniq, "-o", local, "--relayd", r.URL(), "--relayd-hostname", "killed",
		"-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--subbuf-size", "64K", "--duration", "5m")
	getpids(t, n)
	r.Kill()
	getpids(t, n)
	// record says so once a send fails, which a slow guest may reach only
	// after the floods: as a user would, wait for it before Ctrl-C.
	said := false
	for deadline := time.Now().Add(time.Minute); !said && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		said = strings.Contains(rec.out.String(), "relayd lost, recording goes on into "+local)
	}
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	if !said {
		t.Errorf("record did not say relayd was lost within a minute:\n%s", rec.out.String())
	}
	checkTrace(t, "local copy", local, 2*n, rec.out.String())
	_, notSent := relaydCounts(t, rec.out.String())
	for _, want := range []string{
		fmt.Sprintf("lost at relayd: %d packets relayd never confirmed", notSent),
		fmt.Sprintf("the local copy in %s holds all %d events", local, 2*n),
	} {
		if notSent == 0 || !strings.Contains(rec.out.String(), want) {
			t.Errorf("record's summary does not say %q:\n%s", want, rec.out.String())
		}
	}
}

// TestFaultRelaydOnlyWhole streams a getpid flood to relayd alone (no
// local copy), relayd up throughout: relayd's trace holds every event.
// The packets the drainer could not hand on while relayd was behind were
// once left in the rings at the end, counted nowhere.
func TestFaultRelaydOnlyWhole(t *testing.T) {
	testenv.RequireRoot(t)
	r := testenv.StartRelayd(t)
	const n = 200000
	name := "only55" + uniq
	rec := startRecording(t, name, "--relayd", r.URL(), "--relayd-hostname", "only",
		"-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--subbuf-size", "64K", "--duration", "5m")
	getpids(t, n)
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	checkTrace(t, "relayd's trace", filepath.Join(r.SessionDir(t, "only", name), "kernel"), n, rec.out.String())
}

// mountTmpfs mounts a tmpfs of size bytes on a fresh directory, unmounted
// when t ends, and returns the directory.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		testenv.Missing(t, "cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}

// fillDisk writes a file into dir until its file system is full, and
// returns how many bytes it wrote.
func fillDisk(t *testing.T, dir string) int64 {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 64<<10)
	buf := make([]byte, 4096)
	var n int64
	for {
		k, err := w.Write(buf)
		n += int64(k)
		if err == nil {
			continue
		}
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatal(err)
		}
		break
	}
	return n
}

// TestFaultDiskFullCounted is issue 55's second case, on a real small
// tmpfs. The disk fills after a workload of known count, before the
// end's packets are written: the trace holds every event or reports it
// discarded at the stream's end, and the summary agrees with the trace.
// Then the disk fills under the flood itself: record stops by itself,
// saying why, and its summary still says what the trace holds.
func TestFaultDiskFullCounted(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 100000
	t.Run("after", func(t *testing.T) {
		mnt := mountTmpfs(t, 8<<20)
		out := filepath.Join(mnt, "t")
		rec := startRecording(t, "dfa55"+uniq, "-o", out, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--subbuf-size", "64K", "--duration", "5m")
		getpids(t, n)
		fillDisk(t, mnt)
		code := rec.stop(t)
		if code != 1 || !strings.Contains(rec.out.String(), "disk full") {
			t.Fatalf("record: exit %d, want 1 and a disk-full message\n%s", code, rec.out.String())
		}
		checkTrace(t, "full disk", out, n, rec.out.String())
		recorded, lost := summaryCounts(t, rec.out.String())
		for _, want := range []string{
			fmt.Sprintf("lost on the disk: %d events", lost),
			fmt.Sprintf("the trace holds the other %d events; babeltrace2 reports the %d lost", recorded, lost),
		} {
			if lost == 0 || !strings.Contains(rec.out.String(), want) {
				t.Errorf("record's summary does not say %q:\n%s", want, rec.out.String())
			}
		}
		if _, err := os.Stat(filepath.Join(out, ".reserve")); err == nil {
			t.Error("record left its reserve file")
		}
	})
	t.Run("during", func(t *testing.T) {
		mnt := mountTmpfs(t, 3<<20)
		out := filepath.Join(mnt, "t")
		rec := startRecording(t, "dfd55"+uniq, "-o", out, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--subbuf-size", "64K", "--duration", "5m")
		// More than 3 MiB of events: the disk fills and record stops
		// by itself; the child's calls after its stop are not events.
		getpids(t, 4*n)
		if code := rec.wait(t); code != 1 || !strings.Contains(rec.out.String(), "disk full") {
			t.Fatalf("record: exit %d, want 1 and a disk-full message\n%s", code, rec.out.String())
		}
		events, discarded := traceCounts(t, out)
		recorded, lost := summaryCounts(t, rec.out.String())
		if recorded != events || lost != discarded || events+discarded > 4*n {
			t.Errorf("summary: %d recorded, %d discarded; babeltrace2: %d events, %d discarded, of %d made\n%s", recorded, lost, events, discarded, 4*n, rec.out.String())
		}
		t.Logf("disk full under the flood: %d events in the trace, %d discarded", events, discarded)
	})
}

// TestFaultRelaydHungLocalWhole stops relayd (SIGSTOP: not dead, not
// answering) through a getpid flood, in chunks, of several times the
// memory record holds (1 MiB a CPU), with a --relayd-timeout far longer than the flood,
// then lets it go on: the local copy is written at the disk's speed and
// holds every event, none discarded, and relayd catches up with every
// packet. Local writes that waited on relayd (up to --relayd-timeout a
// packet) filled the ring and the sub-buffers and lost events.
func TestFaultRelaydHungLocalWhole(t *testing.T) {
	testenv.RequireRoot(t)
	r := testenv.StartRelayd(t)
	local := filepath.Join(t.TempDir(), "t")
	const n = 400000 // about 5.6 MB of events
	name := "hung55" + uniq
	rec := startRecording(t, name, "-o", local, "--relayd", r.URL(), "--relayd-hostname", "hung", "--relayd-timeout", "5m",
		"-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--memory", "1M", "--duration", "10m")
	r.Pause()
	// In chunks of a fifth of the ring's room, so that a drainer slowed
	// by a busy machine catches up between them: the events are lost
	// only if the local copy waits on relayd.
	for range n / 10000 {
		getpids(t, 10000)
	}
	// The flood is over: whatever relayd is behind by, the local copy
	// has had the time to take it (it takes a fraction of the flood).
	behind := filepath.Join("/run/kconsume", name, "relayd_behind")
	waitFor(t, func() bool {
		b, _ := os.ReadFile(behind)
		v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return v > 0
	})
	r.Resume()
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	checkTrace(t, "local copy", local, n, rec.out.String())
	if _, discarded := summaryCounts(t, rec.out.String()); discarded != 0 {
		t.Errorf("%d events discarded while relayd hung: the local copy waited on it\n%s", discarded, rec.out.String())
	}
	checkTrace(t, "relayd's trace", filepath.Join(r.SessionDir(t, "hung", name), "kernel"), n, "")
}
