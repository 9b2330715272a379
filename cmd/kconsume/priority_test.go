package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

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
// --nice (default -20) but the runtime's monitor, which keeps kconsume's
// value before, as does the command; after it every thread is back.
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
		mon, err := monitorThread()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			want := c.want
			if strings.HasPrefix(l, strconv.Itoa(mon)+" ") {
				want = before
			}
			if n := niceOf(t, l); n != want {
				t.Errorf("%v: a kconsume thread ran at nice %d, want %d (the monitor is %d): %s", c.args, n, want, mon, l)
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

// voluntarySwitches returns each thread's voluntary context switches
// (/proc/self/task/TID/status).
func voluntarySwitches(t *testing.T) map[int]int {
	t.Helper()
	tids, err := threads()
	if err != nil {
		t.Fatal(err)
	}
	m := map[int]int{}
	for _, tid := range tids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", tid))
		if err != nil {
			continue // ended
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "voluntary_ctxt_switches:"); ok {
				m[tid], _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
	}
	return m
}

// TestMonitorThread: the thread monitorThread names is the runtime's
// sysmon. While a goroutine computes without a system call, no thread of
// the process has reason to sleep but sysmon, which sleeps between its
// checks of the running P (usleep in runtime.sysmon): its voluntary
// context switches grow, the others' hardly.
func TestMonitorThread(t *testing.T) {
	mon, err := monitorThread()
	if err != nil {
		t.Fatal(err)
	}
	if mon == 0 {
		t.Fatal("no monitor thread found")
	}
	before := voluntarySwitches(t)
	// A system call wakes sysmon from its deep sleep (entersyscall);
	// then, as long as a P runs, it checks every 20 µs to 10 ms.
	_ = syscall.Getppid()
	x := uint64(1)
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		for range 1000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	after := voluntarySwitches(t)
	most, mostTID := 0, 0
	for tid, n := range after {
		if d := n - before[tid]; d > most {
			most, mostTID = d, tid
		}
	}
	if mostTID != mon || most < 20 {
		t.Errorf("thread %d slept %d times while a goroutine computed (%d); monitorThread says %d, which slept %d times", mostTID, most, x&1, mon, after[mon]-before[mon])
	}
}

// TestSpareThreads: once startSpareThreads ran, goroutines blocking in
// system calls start no thread: the monitor, which hands their Ps to
// other threads, finds idle ones. Without it, in a fresh process, they
// do, which the test sees too. Each case runs in a process of its own.
func TestSpareThreads(t *testing.T) {
	if mode := os.Getenv("KC_TEST_SPARE"); mode != "" {
		if mode == "spare" {
			startSpareThreads(spareThreads)
		}
		// A goroutine that ended leaves its thread looking for work a
		// while before the thread idles, and one still looking when the
		// sleepers below start is not there to take their Ps (a slow
		// TCG guest showed it): let them settle, in both cases alike.
		time.Sleep(200 * time.Millisecond)
		before, err := threads()
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range spareThreads - 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ts := syscall.Timespec{Nsec: 50e6}
				// A system call that blocks, not the netpoller's
				// sleep: it holds its thread, and the monitor takes
				// its P back for another.
				syscall.Syscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
			}()
		}
		wg.Wait()
		after, err := threads()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("threads %d %d\n", len(before), len(after))
		return
	}
	for _, c := range []struct {
		mode string
		grow bool
	}{{"spare", false}, {"none", true}} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSpareThreads$", "-test.count", "1")
		cmd.Env = append(os.Environ(), "KC_TEST_SPARE="+c.mode)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.mode, err, out)
		}
		var before, after int
		i := strings.Index(string(out), "threads ")
		if i < 0 {
			t.Fatalf("%s: no count:\n%s", c.mode, out)
		}
		if _, err := fmt.Sscanf(string(out[i:]), "threads %d %d", &before, &after); err != nil {
			t.Fatalf("%s: %v:\n%s", c.mode, err, out)
		}
		t.Logf("%s: %d threads, %d with %d goroutines blocked in system calls", c.mode, before, after, spareThreads-2)
		if grew := after > before; grew != c.grow {
			t.Errorf("%s: %d threads before %d goroutines blocked in system calls, %d after", c.mode, before, spareThreads-2, after)
		}
	}
}
