package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/chunks"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayd"
)

// uniq keeps these tests' session names (/run/kconsume/NAME) apart from
// other test processes' on the machine.
var uniq = "-" + strconv.Itoa(os.Getpid())

var relaydSummary = regexp.MustCompile(`relayd \S+: (\d+) packets sent \([^)]*\), (\d+) packets not sent`)

// relaydCounts returns the sent and not-sent packet counts of record's
// summary, failing t without them.
func relaydCounts(t *testing.T, out string) (sent, notSent uint64) {
	t.Helper()
	m := relaydSummary.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no relayd line in record's summary:\n%s", out)
	}
	sent, _ = strconv.ParseUint(m[1], 10, 64)
	notSent, _ = strconv.ParseUint(m[2], 10, 64)
	return sent, notSent
}

// packetsIn counts the packets of a trace directory's stream files.
func packetsIn(t *testing.T, dir string, size int64) uint64 {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "trace*"))
	var n uint64
	for _, f := range m {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		n += uint64(fi.Size() / size)
	}
	return n
}

// TestE2ERelayd records two sessions at once to one real lttng-relayd
// under two host names (two sessions of one machine need two names for
// kconsume ctl; relayd/TestRelaydHosts has one name on two hosts): one keeps a local copy, whose events babeltrace2
// reads exactly from relayd's trace too, the other streams only.
func TestE2ERelayd(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	r := testenv.StartRelayd(t)
	local := filepath.Join(t.TempDir(), "t")
	events := "sched:sched_switch,syscalls:sys_enter_getpid"
	a := exec.Command(bin, "record", "-q", "-o", local, "--relayd", r.URL(), "--relayd-hostname", "hosta", "--session", "fleeta"+uniq, "-e", events, "--subbuf-size", "16K", "--duration", "2s")
	// b ends with Ctrl-C, which must still send every finished packet.
	b := exec.Command(bin, "record", "-q", "--relayd", r.URL(), "--relayd-hostname", "hostb", "--session", "fleetb"+uniq, "-e", events)
	var aOut, bOut bytes.Buffer
	a.Stdout, a.Stderr = &aOut, &aOut
	b.Stdout, b.Stderr = &bOut, &bOut
	// Both record getpid calls of the test's, made all along: a quiet
	// machine may switch no task in a's 2 s, or in b's time.
	defer getpidsEvery()()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	aDone := make(chan error, 1)
	go func() { aDone <- a.Wait() }()
	defer func() { _ = a.Process.Kill() }()
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Process.Kill() }()
	// Ctrl-C once b records: before its gate opens (loading takes
	// seconds in a TCG guest) the signal would end it unhandled. It has
	// the getpid calls made between, and records at least until a's
	// duration has passed, however long a took to start.
	waitFor(t, func() bool {
		st, _ := os.ReadFile(filepath.Join("/run/kconsume", "fleetb"+uniq, "state"))
		return strings.TrimSpace(string(st)) == "running"
	})
	for range 100 {
		unix.Getpid()
	}
	var errA error
	select {
	case errA = <-aDone:
	case <-time.After(time.Minute):
		t.Fatal("record of a 2 s session still running a minute after b's gate opened")
	}
	if err := b.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	errB := b.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("record: %v, %v\n%s\n%s\nrelayd log:\n%s", errA, errB, aOut.String(), bOut.String(), r.LogTail(20))
	}
	// Without --live-timer, a live viewer will not list the session: say
	// so, and how to make it live.
	if !strings.Contains(aOut.String(), "not a live session") || !strings.Contains(aOut.String(), "--live-timer 1s") {
		t.Errorf("record --relayd without --live-timer did not say its session is not live:\n%s", aOut.String())
	}
	sent, notSent := relaydCounts(t, aOut.String())
	if notSent != 0 || sent == 0 || sent != packetsIn(t, local, 16<<10) {
		t.Fatalf("hosta: %d packets sent, %d not sent, %d in the local copy\n%s", sent, notSent, packetsIn(t, local, 16<<10), aOut.String())
	}
	remote := filepath.Join(r.SessionDir(t, "hosta", "fleeta"+uniq), "kernel")
	want, _ := testenv.RunBT2(t, local)
	got, _ := testenv.RunBT2(t, remote)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Fatalf("babeltrace2: %d events from relayd's trace, %d from the local copy", len(got), len(want))
	}
	// Our own reader takes relayd's directory (with its index/) too.
	if o, code := shell(t, bin+" report "+remote+" | md5sum; "+bin+" report "+local+" | md5sum"); code != 0 || len(strings.Split(strings.TrimSpace(o), "\n")) != 2 || strings.Split(o, "\n")[0] != strings.Split(o, "\n")[1] {
		t.Fatalf("kconsume report of relayd's trace and of the local copy differ: %d\n%s", code, o)
	}
	if _, notSent := relaydCounts(t, bOut.String()); notSent != 0 {
		t.Fatalf("hostb: %d packets not sent\n%s", notSent, bOut.String())
	}
	recorded := regexp.MustCompile(`(\d+) events recorded`).FindStringSubmatch(bOut.String())
	lines, _ := testenv.RunBT2(t, filepath.Join(r.SessionDir(t, "hostb", "fleetb"+uniq), "kernel"))
	if recorded == nil || recorded[1] == "0" || strconv.Itoa(len(lines)) != recorded[1] {
		t.Fatalf("hostb stopped by Ctrl-C: relayd's trace holds %d events; record said:\n%s", len(lines), bOut.String())
	}
}

// TestE2ERelaydUnreachable: with no relayd at the URL, record fails at
// once, says why and where, and traces nothing.
func TestE2ERelaydUnreachable(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	r := testenv.StartRelayd(t)
	r.Stop()
	local := filepath.Join(t.TempDir(), "t")
	cmd := exec.Command(bin, "record", "-q", "-o", local, "--session", "unreach"+uniq, "--relayd", r.URL(), "--relayd-timeout", "2s", "-e", "sched:sched_switch", "--duration", "10s")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
		t.Fatalf("record with relayd down: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "connection refused") || !strings.Contains(string(out), strconv.Itoa(r.Control)) || !strings.Contains(string(out), "nothing was traced") {
		t.Fatalf("record with relayd down, want the address, the cause and that nothing was traced:\n%s", out)
	}
	if m, _ := filepath.Glob(filepath.Join(local, "*")); len(m) != 0 {
		t.Fatalf("record with relayd down left %q", m)
	}
}

// TestE2ERelaydKilled kills relayd while record streams: recording goes
// on into the local copy, record warns, the control directory and the
// metrics count what relayd misses; relayd starts again and record
// creates the session again there; its summary counts every packet relayd
// never confirmed: sent + not sent = the local copy's packets.
func TestE2ERelaydKilled(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	r := testenv.StartRelayd(t)
	local := filepath.Join(t.TempDir(), "t")
	rec := exec.Command(bin, "record", "-q", "-o", local, "--relayd", r.URL(), "--relayd-hostname", "crashy", "--session", "crash"+uniq,
		"-e", "sched:sched_switch,syscalls:sys_enter_close", "--subbuf-size", "4K", "--metrics", "127.0.0.1:0")
	var out testenv.Output
	rec.Stdout, rec.Stderr = &out, &out
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- rec.Wait() }()
	// It has no --duration, which the steps below, each waiting up to a
	// minute, could outlast in a slow guest: it ends with Ctrl-C, and a
	// test that fails early must not leave it running.
	defer func() { _ = rec.Process.Kill() }()
	// Kill relayd once it has written a few packets. The test makes the
	// events itself (close(2)): an idle guest makes too few, and a TCG
	// guest beside another is slow to start record, so the limit is
	// generous and is reached only when nothing comes.
	deadline := time.Now().Add(time.Minute)
	for {
		closeDevNull(20)
		m, _ := filepath.Glob(filepath.Join(r.Out, "crashy", "crash"+uniq+"-*", "kernel", "trace*"))
		var size int64
		for _, f := range m {
			if fi, err := os.Stat(f); err == nil {
				size += fi.Size()
			}
		}
		if size >= 3*4096 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relayd got no packets in a minute\n%s\nrelayd log:\n%s", out.String(), r.LogTail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Kill()
	// Make sure packets keep coming after the kill.
	for range 50 {
		closeDevNull(1)
		time.Sleep(10 * time.Millisecond)
	}
	// The control directory and the metrics count what relayd missed
	// while record runs.
	ctl := filepath.Join("/run/kconsume", "crash"+uniq)
	waitFor(t, func() bool {
		// More events while it waits: the 50 above may not finish a
		// packet, and an idle guest makes few of its own.
		closeDevNull(1)
		b, _ := os.ReadFile(filepath.Join(ctl, "relayd_not_sent"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n > 0
	})
	addr := regexp.MustCompile(`metrics at (http://\S+)`).FindStringSubmatch(out.String())
	if addr == nil {
		t.Fatalf("no metrics address:\n%s", out.String())
	}
	resp, err := http.Get(addr[1])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^kconsume_relayd_packets_total\{result="not_sent"\} [1-9]`).Match(body) || !strings.Contains(string(body), "kconsume_relayd_up 0") {
		t.Errorf("metrics after relayd died:\n%s", body)
	}
	r.Restart(t)
	// The reconnector retries at growing intervals: the recording is
	// stopped once it is back, not at a duration a slow guest may pass.
	waitFor(t, func() bool { return strings.Contains(out.String(), "relayd is back") })
	for range 50 {
		closeDevNull(1)
		time.Sleep(10 * time.Millisecond)
	}
	if err := rec.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Fatalf("record after relayd died: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "relayd lost, recording goes on into "+local) {
		t.Errorf("no warning while recording:\n%s", out.String())
	}
	sent, notSent := relaydCounts(t, out.String())
	if sent == 0 || notSent == 0 || sent+notSent != packetsIn(t, local, 4096) {
		t.Fatalf("%d packets sent + %d not sent, %d in the local copy\n%s", sent, notSent, packetsIn(t, local, 4096), out.String())
	}
	if lines, _ := testenv.RunBT2(t, local); len(lines) == 0 {
		t.Fatal("no event in the local copy")
	}
	if o, code := shell(t, bin+" stats "+local); code != 0 || !strings.Contains(o, fmt.Sprintf("%d packets sent, %d packets not sent, session created again 1 times (this local copy has them)", sent, notSent)) {
		t.Errorf("kconsume stats of the local copy does not say what relayd missed: %d\n%s", code, o)
	}
	if !strings.Contains(out.String(), "session created again 1 times") {
		t.Errorf("summary does not count the reconnection:\n%s", out.String())
	}
	again, _ := filepath.Glob(filepath.Join(r.Out, "crashy", "crash"+uniq+"-*-1", "kernel"))
	if len(again) != 1 {
		t.Fatalf("no reconnected session directory in %s", r.Out)
	}
	if lines, _ := testenv.RunBT2(t, again[0]); len(lines) == 0 {
		t.Fatal("no event in the reconnected session's trace")
	}
}

// TestE2ERelaydLive records with --live-timer while babeltrace2 reads the
// session through relayd's live port: getpid events of a thread pinned
// to CPU 0 show while record still runs, although every other CPU's
// stream stays empty (they need their empty packet and beacons, or the
// viewer waits on them), and relayd's trace on disk has every event.
func TestE2ERelaydLive(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	bt2 := testenv.BT2(t)
	r := testenv.StartRelayd(t)
	rec := exec.Command(bin, "record", "-q", "--relayd", r.URL(), "--relayd-hostname", "hostlive", "--session", "live"+uniq, "--live-timer", "200ms",
		"-e", "syscalls:sys_enter_getpid", "--pid", strconv.Itoa(os.Getpid()), "--subbuf-size", "4K")
	var recOut testenv.Output
	rec.Stdout, rec.Stderr = &recOut, &recOut
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	recDone := make(chan error, 1)
	go func() { recDone <- rec.Wait() }()
	// It has no --duration: a test that fails early must not leave it.
	defer func() { _ = rec.Process.Kill() }()
	stop := make(chan struct{})
	genDone := make(chan struct{})
	go func() {
		defer close(genDone)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			t.Errorf("pin to CPU 0: %v", err)
			return
		}
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				unix.Getpid()
			}
		}
	}()
	defer func() { close(stop); <-genDone }()
	waitFor(t, func() bool {
		m, _ := filepath.Glob(filepath.Join(r.Out, "hostlive", "live"+uniq+"-*", "kernel", "metadata"))
		return len(m) == 1
	})
	view := exec.Command(bt2, "--input-format=lttng-live", r.LiveURL("hostlive", "live"+uniq))
	var viewOut, viewErr testenv.Output
	view.Stdout, view.Stderr = &viewOut, &viewErr
	if err := view.Start(); err != nil {
		t.Fatal(err)
	}
	viewDone := make(chan error, 1)
	go func() { viewDone <- view.Wait() }()
	defer func() { _ = view.Process.Kill() }()
	count := func() int { return strings.Count(viewOut.String(), "syscalls:sys_enter_getpid") }
	for end := time.Now().Add(time.Minute); count() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("live view printed no event in a minute\nbabeltrace2: %s\nrecord: %s\nrelayd log:\n%s", viewErr.String(), recOut.String(), r.LogTail(30))
		}
	}
	// Live: more events show while record still runs. They come a live
	// timer and a viewer's poll later, a second or more in a TCG guest;
	// a viewer that is not live shows none in a minute. Record is looked
	// at after each count: events that came with its end do not show
	// the view live.
	n1 := count()
	for end := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		n2 := count()
		select {
		case err := <-recDone:
			t.Fatalf("record ended before the live check: %v\n%s", err, recOut.String())
		default:
		}
		if n2 > n1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("live view: %d events, still %d a minute later: not live\n%s", n1, n2, viewErr.String())
		}
	}
	// The session runs until the viewer has been seen live (starting
	// babeltrace2 in a TCG guest takes seconds), then ends with Ctrl-C.
	if err := rec.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := <-recDone; err != nil {
		t.Fatalf("record: %v\n%s", err, recOut.String())
	}
	select {
	case err := <-viewDone:
		if err != nil {
			t.Fatalf("babeltrace2 live: %v\n%s", err, viewErr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("babeltrace2 live did not end with the session\n%s", viewErr.String())
	}
	recorded := regexp.MustCompile(`(\d+) events recorded`).FindStringSubmatch(recOut.String())
	lines, _ := testenv.RunBT2(t, filepath.Join(r.SessionDir(t, "hostlive", "live"+uniq), "kernel"))
	if recorded == nil || strconv.Itoa(len(lines)) != recorded[1] {
		t.Fatalf("relayd's trace holds %d events; record said:\n%s", len(lines), recOut.String())
	}
}

// TestE2EReportFollow: record --live-timer without relayd flushes the
// local trace often; report --follow prints its events while record
// runs, and in the end the same events as report of the finished trace.
func TestE2EReportFollow(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	out := filepath.Join(t.TempDir(), "t")
	// No --duration: report --follow, started beside it, must print while
	// it records, which in a TCG guest can take longer than any fixed
	// one. It ends with Ctrl-C once that was seen.
	rec := exec.Command(bin, "record", "-q", "-o", out, "--session", "follow"+uniq, "--live-timer", "200ms", "-e", "syscalls:sys_enter_getpid",
		"--pid", strconv.Itoa(os.Getpid()), "--subbuf-size", "4K")
	var recOut testenv.Output
	rec.Stdout, rec.Stderr = &recOut, &recOut
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	recDone := make(chan error, 1)
	go func() { recDone <- rec.Wait() }()
	// A test that fails early must not leave it.
	defer func() { _ = rec.Process.Kill() }()
	stop := getpidsEvery()
	defer stop()
	fol := exec.Command(bin, "report", "--follow", out)
	var folOut, folErr testenv.Output
	fol.Stdout, fol.Stderr = &folOut, &folErr
	if err := fol.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fol.Process.Kill() }()
	// Ten events printed while record runs: the comparison below wants
	// that many, and on a loaded guest the first comes long after the
	// recording began, with few after it.
	waitFor(t, func() bool { return strings.Count(folOut.String(), "syscalls:sys_enter_getpid") >= 10 })
	select {
	case err := <-recDone:
		t.Fatalf("record ended before report --follow printed: %v\n%s", err, recOut.String())
	default:
	}
	if err := rec.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := <-recDone; err != nil {
		t.Fatalf("record: %v\n%s", err, recOut.String())
	}
	stop()
	whole, code := shell(t, bin+" report "+out)
	if code != 0 {
		t.Fatalf("report: %d %s", code, whole)
	}
	want := strings.Split(strings.TrimSpace(whole), "\n")
	// report --follow reads the finished trace's last packets at its
	// next round, a followPeriod away, or several on a loaded or slow
	// machine: wait until it printed as many lines as report did, and no
	// longer than a minute, as a follow that missed events never does.
	for end := time.Now().Add(time.Minute); strings.Count(folOut.String(), "\n") < len(want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("report --follow printed %d lines in a minute after record ended, report %d", strings.Count(folOut.String(), "\n"), len(want))
		}
	}
	if err := fol.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := fol.Wait(); err != nil {
		t.Fatalf("report --follow: %v\n%s", err, folErr.String())
	}
	got := strings.Split(strings.TrimSpace(folOut.String()), "\n")
	slices.Sort(got)
	slices.Sort(want)
	if len(want) < 10 || !slices.Equal(got, want) {
		t.Fatalf("report --follow printed %d lines, report of the finished trace %d", len(got), len(want))
	}
}

// closeDevNull opens and closes /dev/null n times: n sys_enter_close
// events for a test's recording.
func closeDevNull(n int) {
	for range n {
		if f, err := os.Open("/dev/null"); err == nil {
			f.Close()
		}
	}
}

// getpidsEvery makes a getpid call every 10 ms, events for a recording to
// wait on, until the function it returns is called (once or more).
func getpidsEvery() (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(10 * time.Millisecond):
				unix.Getpid()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

// TestE2ERelaydRotate records a getpid flood on every CPU to a real
// lttng-relayd, alone and with a local copy (-o), rotating by size and
// once by ctl rotate: relayd archives the chunks as LTTng's rotations
// leave them (SESSION/archives/BEGIN-END-ID/kernel), the last one too at
// the end, each reads alone in babeltrace2 and in kconsume report, and
// their events and discarded events add up to the calls made, as
// record's summary says. The local copy's chunks, closed at the same
// moments, hold the same events chunk for chunk.
func TestE2ERelaydRotate(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BT2(t)
	t.Run("relayd", func(t *testing.T) { relaydRotate(t, false) })
	t.Run("relayd-and-local", func(t *testing.T) { relaydRotate(t, true) })
}

// relaydRotate is TestE2ERelaydRotate, with a local copy or not.
func relaydRotate(t *testing.T, local bool) {
	r := testenv.StartRelayd(t)
	perCPU := 200000
	if testenv.InGuest() {
		// Under TCG a fifth: still some ten chunks of 256 KiB.
		perCPU = 40000
	}
	cpus := min(runtime.NumCPU(), 2)
	name := "rot52" + uniq
	if local {
		name += "l"
	}
	// A small ring: the drainer, which rotates between its passes,
	// passes often.
	args := []string{"--relayd", r.URL(), "--relayd-hostname", "hostr", "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm,
		"--subbuf-size", "16K", "--ring-size", "256K", "--rotate-size", "256K", "--duration", "5m"}
	dir := filepath.Join(t.TempDir(), "t")
	if local {
		args = append(args, "-o", dir)
	}
	rec := startRecording(t, name, args...)
	getpidsOnEach(t, perCPU, cpus)
	// ctl rotate rotates relayd's trace too, and status says where.
	bin := testenv.KconsumeBin(t)
	if reply, err := exec.Command(bin, "ctl", "--session", name, "rotate").CombinedOutput(); err != nil || !strings.Contains(string(reply), "archived by relayd") {
		t.Errorf("ctl rotate: %v: %s", err, reply)
	}
	if st, err := exec.Command(bin, "ctl", "--session", name, "status").CombinedOutput(); err != nil || !strings.Contains(string(st), "being written on relayd") {
		t.Errorf("ctl status: %v: %s", err, st)
	}
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s\nrelayd log:\n%s", code, rec.out.String(), r.LogTail(20))
	}
	out := rec.out.String()
	sess := r.SessionDir(t, "hostr", name)
	// relayd moves the last chunk once its streams are closed, after
	// record returned.
	var archived []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		archived, _ = filepath.Glob(filepath.Join(sess, chunks.ArchivesDir, "*", relayd.DomainPath))
		if left, _ := filepath.Glob(filepath.Join(sess, ".tmp_*")); len(left) == 0 && len(archived) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Two at least: one rotation, and the last chunk. Under TCG the
	// flood is slow and the drainer passes seldom: 2 in a 7.3 guest,
	// 14 on the host.
	if len(archived) < 2 {
		t.Fatalf("relayd archived %d chunks (%q), want several\n%s\nrelayd log:\n%s", len(archived), archived, out, r.LogTail(20))
	}
	if stray, _ := filepath.Glob(filepath.Join(sess, "*", relayd.DomainPath)); len(stray) > 1 {
		t.Errorf("chunks left outside archives/: %q", stray)
	}
	var events, discarded int
	for _, c := range archived {
		e, d := traceCounts(t, c)
		events += e
		discarded += d
		if o, code := shell(t, testenv.KconsumeBin(t)+" report "+c+" | grep -c sys_enter_getpid"); strings.TrimSpace(o) != strconv.Itoa(e) {
			t.Errorf("kconsume report %s: exit %d, %s events; babeltrace2 read %d", c, code, strings.TrimSpace(o), e)
		}
	}
	made := cpus * perCPU
	if events+discarded != made {
		t.Errorf("%d chunks on relayd: %d events and %d discarded, %d of the %d calls made\n%s", len(archived), events, discarded, events+discarded, made, out)
	}
	recorded, lost := summaryCounts(t, out)
	if recorded != events || lost != discarded {
		t.Errorf("summary: %d recorded and %d discarded; relayd's chunks: %d and %d\n%s", recorded, lost, events, discarded, out)
	}
	if local {
		// By index, which ends each chunk's name.
		index := func(p string) int {
			name := filepath.Base(filepath.Dir(p))
			n, _ := strconv.Atoi(name[strings.LastIndexByte(name, '-')+1:])
			return n
		}
		slices.SortFunc(archived, func(a, b string) int { return index(a) - index(b) })
		kept := closedChunks(t, dir)
		if len(kept) != len(archived) {
			t.Errorf("%d local chunks, %d on relayd", len(kept), len(archived))
		}
		for i := range min(len(kept), len(archived)) {
			le, ld := traceCounts(t, kept[i])
			re, rd := traceCounts(t, archived[i])
			if le != re || ld != rd {
				t.Errorf("chunk %d: %d events and %d discarded locally (%s), %d and %d on relayd (%s)", i, le, ld, kept[i], re, rd, archived[i])
			}
		}
	}
	t.Logf("relayd archived %d chunks: %d events, %d discarded", len(archived), events, discarded)
}

// TestE2ERelaydKilledRotating: relayd killed while a recording with a
// local copy (-o) rotates on both. The local copy goes on rotating: its
// chunks' events and discarded events add up to the calls made, exactly,
// record ends well, and what relayd missed is counted as not sent.
func TestE2ERelaydKilledRotating(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BT2(t)
	r := testenv.StartRelayd(t)
	perCPU := 200000
	if testenv.InGuest() {
		perCPU = 40000
	}
	cpus := min(runtime.NumCPU(), 2)
	name := "rotk" + uniq
	dir := filepath.Join(t.TempDir(), "t")
	rec := startRecording(t, name, "-o", dir, "--relayd", r.URL(), "--relayd-hostname", "hostk", "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm,
		"--subbuf-size", "16K", "--ring-size", "256K", "--rotate-size", "256K", "--duration", "5m")
	// relayd dies once it archived a chunk, while the calls go on.
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		getpidsOnEach(t, perCPU, cpus)
	}()
	waitFor(t, func() bool {
		m, _ := filepath.Glob(filepath.Join(r.Out, "hostk", name+"-*", chunks.ArchivesDir, "*", relayd.DomainPath))
		return len(m) > 0
	})
	r.Kill()
	<-flood
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	out := rec.out.String()
	kept := closedChunks(t, dir)
	events, discarded := chunksCounts(t, kept)
	if made := cpus * perCPU; events+discarded != made {
		t.Errorf("%d local chunks: %d events and %d discarded, %d of the %d calls made\n%s", len(kept), events, discarded, events+discarded, made, out)
	}
	if m := relaydSummary.FindStringSubmatch(out); m == nil || m[2] == "0" {
		t.Errorf("the summary does not count what relayd missed:\n%s", out)
	}
	t.Logf("%d local chunks: %d events, %d discarded", len(kept), events, discarded)
}
