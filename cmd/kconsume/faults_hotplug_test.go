package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
)

// TestFaultsHotplug takes a CPU offline and online again, at random
// moments, while getpid workers (pinned to it, to another CPU, or not
// pinned) run under a recording in a mode drawn at random: every event
// is in the trace or counted discarded, as babeltrace2 reads it, and
// record's summary says what the trace holds. Seeded like TestFaults
// (KC_FAULT_SEED, KC_FAULT_RUNS); it offlines CPUs, so it runs only in
// a vmtest guest.
func TestFaultsHotplug(t *testing.T) {
	if !testenv.InGuest() {
		t.Skip("offlines a CPU: runs only inside a vmtest guest (make vmtest)")
	}
	testenv.RequireRoot(t)
	ncpu := onlineCount(t)
	if ncpu < 2 {
		t.Fatalf("needs 2 CPUs online in the guest, have %d", ncpu)
	}
	runs, seed := testenv.FaultRuns(t, 3)
	modes := [][]string{nil, {"--latency", "5ms"}, {"--transport", "perf"}}
	var made, toggles int
	for i := range runs {
		s := seed + int64(i)
		rng := rand.New(rand.NewPCG(uint64(s), 2))
		mode := modes[rng.IntN(len(modes))]
		t.Run(fmt.Sprintf("seed%d", s), func(t *testing.T) {
			n, k := hotplugRun(t, rng, ncpu, mode, s)
			made += n
			toggles += k
		})
	}
	t.Logf("%d runs: CPU %d taken offline and back %d times under %d events", runs, ncpu-1, toggles, made)
}

// hotplugRun is one run of TestFaultsHotplug; it returns the events made
// and the times the CPU went offline.
func hotplugRun(t *testing.T, rng *rand.Rand, ncpu int, mode []string, seed int64) (made, toggles int) {
	victim := ncpu - 1
	t.Cleanup(func() { testenv.SetCPUOnline(t, victim, true) })
	type worker struct{ n, cpu int }
	ws := make([]worker, 2+rng.IntN(3))
	for i := range ws {
		ws[i] = worker{n: 20000 + rng.IntN(40000), cpu: rng.IntN(ncpu+1) - 1} // -1: not pinned
		made += ws[i].n
	}
	toggles = 1 + rng.IntN(3)
	t.Logf("mode %v: workers %v (events, CPU), CPU %d offline and back %d times", mode, ws, victim, toggles)
	dir := t.TempDir() + "/t"
	args := append([]string{"-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--duration", "10m"}, mode...)
	rec := startRecording(t, fmt.Sprintf("hp%d%s", seed, uniq), args...)
	var cmds []*exec.Cmd
	for _, w := range ws {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "KC_GETPIDS="+strconv.Itoa(w.n), "KC_GETPIDS_CPU="+strconv.Itoa(w.cpu), "GODEBUG=asyncpreemptoff=1", "GOGC=off")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for range toggles {
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		testenv.SetCPUOnline(t, victim, false)
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		testenv.SetCPUOnline(t, victim, true)
	}
	for _, cmd := range cmds {
		// A worker pinned to the CPU taken offline loses its affinity
		// (the kernel moves it) and goes on.
		if err := cmd.Wait(); err != nil {
			t.Fatalf("getpid worker: %v", err)
		}
	}
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	out := rec.out.String()
	if m := upToMissed.FindStringSubmatch(out); m != nil {
		// Where the kernel runs the recorder's programs preemptibly
		// and they ride on a tracepoint (the perf transport has no raw
		// syscall path), it skips runs while a preempted one holds the
		// CPU's guard, and with a filter a skipped run may not have
		// been an event: the summary gives the bound (issue 57).
		missed, _ := strconv.Atoi(m[1])
		events, discarded := traceCounts(t, dir)
		if events+discarded > made || events+discarded+missed < made {
			t.Errorf("after CPU hotplug: %d events, %d discarded and up to %d missed, of the %d made\n%s", events, discarded, missed, made, out)
		}
		t.Logf("%d events, %d discarded, up to %d missed, of %d made", events, discarded, missed, made)
		return made, toggles
	}
	checkTrace(t, "after CPU hotplug", dir, made, out)
	return made, toggles
}

// upToMissed finds the bound of the missed runs in record's summary.
var upToMissed = regexp.MustCompile(`(?m)^\d+ events recorded .*, up to (\d+) more missed`)

// onlineCount returns the number of CPUs online, which must be CPUs 0 to
// that number less one.
func onlineCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSpace(string(b))
	if s == "0" {
		return 1
	}
	lo, hi, ok := strings.Cut(s, "-")
	n, err := strconv.Atoi(hi)
	if !ok || lo != "0" || err != nil {
		t.Fatalf("online CPUs %q: want a range from 0", s)
	}
	return n + 1
}
