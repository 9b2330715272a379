package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kconsume/kconsume/chunks"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// getpidsOn runs the getpid child for n calls pinned to cpu and waits
// for it.
func getpidsOn(t *testing.T, n, cpu int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KC_GETPIDS="+strconv.Itoa(n), "KC_GETPIDS_CPU="+strconv.Itoa(cpu), "GODEBUG=asyncpreemptoff=1", "GOGC=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("getpid child on CPU %d: %v\n%s", cpu, err, out)
	}
}

// getpidsOnEach runs n getpid calls on each of CPUs 0 to cpus-1 at once
// (getpidsOn), and returns when all are done.
func getpidsOnEach(t *testing.T, n, cpus int) {
	t.Helper()
	var wg sync.WaitGroup
	for cpu := range cpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			getpidsOn(t, n, cpu)
		}()
	}
	wg.Wait()
}

// closedChunks returns the closed chunks in the session directory dir,
// oldest first: their names begin with their time, to the second, and
// end with their index.
func closedChunks(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, chunks.ArchivesDir))
	if err != nil {
		t.Fatalf("closed chunks: %v", err)
	}
	index := func(name string) int {
		n, _ := strconv.Atoi(name[strings.LastIndexByte(name, '-')+1:])
		return n
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if index(out[j]) < index(out[i]) {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	for i, n := range out {
		out[i] = filepath.Join(dir, chunks.ArchivesDir, n)
	}
	return out
}

// chunksCounts returns the events and discarded events that
// babeltrace2 reads in all of the traces dirs (traceCounts).
func chunksCounts(t *testing.T, dirs []string) (events, discarded int) {
	t.Helper()
	for _, c := range dirs {
		e, d := traceCounts(t, c)
		events += e
		discarded += d
	}
	return events, discarded
}

// diskUse is what a trace directory's files take: the closed chunks,
// each and in all, the current chunk's files, and the room set aside for
// last packets (relayfmt.ReserveFile).
type diskUse struct {
	total, archives, reserve uint64
	chunks                   map[string]uint64
}

// current returns the bytes of the current chunk's files.
func (u diskUse) current() uint64 { return u.total - u.archives - u.reserve }

// biggest returns the size of the largest closed chunk.
func (u diskUse) biggest() uint64 {
	var m uint64
	for _, b := range u.chunks {
		m = max(m, b)
	}
	return m
}

// treeBytes returns the diskUse of the regular files under dir; files that
// vanish under the walk (a chunk deleted) are not counted.
func treeBytes(dir string) diskUse {
	u := diskUse{chunks: map[string]uint64{}}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		n := uint64(fi.Size())
		u.total += n
		if d.Name() == relayfmt.ReserveFile {
			u.reserve += n
		}
		if rel, err := filepath.Rel(filepath.Join(dir, chunks.ArchivesDir), p); err == nil && !strings.HasPrefix(rel, "..") {
			u.archives += n
			u.chunks[strings.SplitN(rel, string(filepath.Separator), 2)[0]] += n
		}
		return nil
	})
	return u
}

var deletedLine = regexp.MustCompile(`deleted the (\d+) oldest chunks \([^)]*\) under the budget: (\d+) events, (\d+) discarded`)

// deletedCounts returns what record's summary says the deleted chunks
// held: chunks, events, discarded events; zeros when none was deleted.
func deletedCounts(out string) (chunks, events, discarded int) {
	m := deletedLine.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, 0
	}
	chunks, _ = strconv.Atoi(m[1])
	events, _ = strconv.Atoi(m[2])
	discarded, _ = strconv.Atoi(m[3])
	return chunks, events, discarded
}

// TestRotateWeekInMinutes is issue 52's long run in small: a getpid
// flood on every CPU, small sub-buffers and chunks, a disk budget of a
// few chunks. Disk use sampled through the run never passes the budget
// by more than a chunk, every kept chunk reads alone in babeltrace2, and
// the events of the kept chunks, their discarded events and what record
// says the deleted chunks held add up to the workload's calls exactly.
func TestRotateWeekInMinutes(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BT2(t)
	perCPU, maxSize, rotateSize := 600000, 2<<20, "256K"
	if testenv.InGuest() {
		// Under TCG a twentieth of the calls, in chunks as small.
		perCPU, maxSize, rotateSize = 30000, 256<<10, "32K"
	}
	cpus := min(runtime.NumCPU(), 2)
	dir := filepath.Join(t.TempDir(), "t")
	rec := startRecording(t, "week52"+uniq, "-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm,
		"--subbuf-size", "16K", "--ring-size", "256K", "--rotate-size", rotateSize, "--max-size", strconv.Itoa(maxSize), "--duration", "5m")
	var (
		peak              diskUse
		biggest           uint64
		samples           int
		stopSampling      = make(chan struct{})
		sampled           = make(chan struct{})
		sawArchivesDuring bool
	)
	go func() {
		defer close(sampled)
		for {
			u := treeBytes(dir)
			if u.total > peak.total {
				peak = u
			}
			biggest = max(biggest, u.biggest())
			samples++
			if len(u.chunks) > 0 {
				sawArchivesDuring = true
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	getpidsOnEach(t, perCPU, cpus)
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	close(stopSampling)
	<-sampled
	out := rec.out.String()
	if !sawArchivesDuring {
		t.Fatalf("no closed chunk seen during the run in %d samples\n%s", samples, out)
	}
	// The last chunk, which takes what the rings hold at the end, closes
	// after the last sample may have been taken.
	biggest = max(biggest, treeBytes(dir).biggest())
	// Besides the chunks, the room set aside for the streams' last
	// packets (docs/rotation.md, "The disk budget").
	if limit := uint64(maxSize) + biggest + peak.reserve; peak.total > limit {
		t.Errorf("disk use peaked at %d bytes (closed chunks %d, current %d, reserve %d): over the budget %d, a chunk (%d) and the reserve\n%s",
			peak.total, peak.archives, peak.current(), peak.reserve, maxSize, biggest, out)
	}
	kept := closedChunks(t, dir)
	events, discarded := chunksCounts(t, kept)
	ndel, delEvents, delDiscarded := deletedCounts(out)
	if ndel == 0 {
		t.Errorf("no chunk deleted under a budget of %d bytes:\n%s", maxSize, out)
	}
	made := cpus * perCPU
	if got := events + discarded + delEvents + delDiscarded; got != made {
		t.Errorf("%d kept chunks: %d events and %d discarded; %d deleted chunks held %d and %d: %d of the %d calls made\n%s",
			len(kept), events, discarded, ndel, delEvents, delDiscarded, got, made, out)
	}
	recorded, lost := summaryCounts(t, out)
	if recorded != events+delEvents || lost != discarded+delDiscarded {
		t.Errorf("summary: %d recorded and %d discarded; the chunks: %d and %d\n%s", recorded, lost, events+delEvents, discarded+delDiscarded, out)
	}
	t.Logf("%d chunks kept, %d deleted; disk use at most %d bytes (closed %d, current %d, reserve %d) in %d samples (budget %d, largest chunk %d); %d events, %d discarded",
		len(kept), ndel, peak.total, peak.archives, peak.current(), peak.reserve, samples, maxSize, biggest, events+delEvents, discarded+delDiscarded)
}

// TestRotateCtl rotates by hand (ctl rotate) while record runs, under
// both profiles: the closed chunk reads alone in babeltrace2 while the
// next one is written, with every event made before the rotation and
// none after; ctl status counts the chunks; the last chunk, closed at
// the end, holds the rest. Under --profile lttng each chunk's trace is in
// kernel/, and LTTng's analyses read a closed chunk alone.
func TestRotateCtl(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BT2(t)
	for _, prof := range []string{"ftrace", "lttng"} {
		t.Run(prof, func(t *testing.T) {
			const before, after = 30000, 20000
			dir := filepath.Join(t.TempDir(), "t")
			name := "ctlrot52" + prof + uniq
			args := []string{"-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--rotate-interval", "1h", "--duration", "5m"}
			if prof == "lttng" {
				args = append(args, "--profile", "lttng", "-e", "sched:sched_switch")
			}
			rec := startRecording(t, name, args...)
			bin := testenv.KconsumeBin(t)
			getpids(t, before)
			reply, err := exec.Command(bin, "ctl", "--session", name, "rotate").CombinedOutput()
			if err != nil || !strings.Contains(string(reply), "chunk 0 closed") {
				t.Fatalf("ctl rotate: %v\n%s", err, reply)
			}
			closed := closedChunks(t, dir)
			if len(closed) != 1 || !strings.HasSuffix(closed[0], "-0") {
				t.Fatalf("closed chunks %v, want one, index 0", closed)
			}
			trace := closed[0]
			if prof == "lttng" {
				trace = filepath.Join(trace, "kernel")
			}
			// While record still runs and writes the next chunk.
			lines, discards := testenv.RunBT2(t, trace)
			if n := countEvent(lines, "_getpid:"); n+len(discards) != before || len(discards) != 0 {
				t.Errorf("closed chunk: %d getpid events, %d discard notices; want %d and none", n, len(discards), before)
			}
			if prof == "lttng" && !testenv.InGuest() {
				// The analyses read the same trace on every kernel:
				// the host runs them, not each TCG guest, where they
				// take most of a minute.
				runAnalysis(t, "lttng-cputop", closed[0])
			}
			st, err := exec.Command(bin, "ctl", "--session", name, "status").CombinedOutput()
			if err != nil || !strings.Contains(string(st), "chunk 1 being written; 1 closed, 1 kept") {
				t.Errorf("ctl status: %v\n%s", err, st)
			}
			getpids(t, after)
			if code := rec.stop(t); code != 0 {
				t.Fatalf("record: exit %d\n%s", code, rec.out.String())
			}
			closed = closedChunks(t, dir)
			if len(closed) != 2 {
				t.Fatalf("closed chunks at the end %v, want 2\n%s", closed, rec.out.String())
			}
			last := closed[1]
			if prof == "lttng" {
				last = filepath.Join(last, "kernel")
			}
			lines, discards = testenv.RunBT2(t, last)
			if n := countEvent(lines, "_getpid:"); n != after || len(discards) != 0 {
				t.Errorf("last chunk: %d getpid events, %d discard notices; want %d and none\n%s", n, len(discards), after, rec.out.String())
			}
			if _, err := os.Stat(filepath.Join(dir, "metadata")); err == nil {
				t.Errorf("a rotated trace's last chunk stayed in %s", dir)
			}
		})
	}
}

// countEvent counts babeltrace2's lines of events whose name holds name.
func countEvent(lines []string, name string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, name) {
			n++
		}
	}
	return n
}

// TestRotateBadInput: rotation settings that cannot work are refused
// with a usage error before anything is traced.
func TestRotateBadInput(t *testing.T) {
	testenv.RequireRoot(t)
	out := filepath.Join(t.TempDir(), "t")
	ev := []string{"record", "-o", out, "-e", "syscalls:sys_enter_getpid"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--rotate-size", "8K", "--subbuf-size", "16K"}, "under one packet per stream"},
		{[]string{"--rotate-size", "100K"}, "under one packet per stream"},
		{[]string{"--rotate-interval", "0"}, "--rotate-interval 0s: want a positive duration"},
		{[]string{"--rotate-interval", "-1s"}, "want a positive duration"},
		{[]string{"--rotate-size", "0"}, "want a positive number"},
		{[]string{"--rotate-size", "1M", "--max-size", "1M"}, "smaller than two chunks"},
		{[]string{"--rotate-interval", "1m", "--max-size", "16K"}, "smaller than two chunks"},
		{[]string{"--max-size", "1G"}, "need --rotate-size, --rotate-interval or a rotate trigger"},
		{[]string{"--max-chunks", "4"}, "need --rotate-size, --rotate-interval or a rotate trigger"},
		{[]string{"--rotate-size", "1M", "--max-chunks", "1"}, "want 2 or more"},
		{[]string{"--rotate-size", "1M", "--max-chunks", "-3"}, "want 2 or more"},
		{[]string{"--rotate-size", "1M", "--mode", "overwrite"}, "needs --mode discard"},
		{[]string{"--rotate-interval", "1m", "--relayd", "net://localhost", "--live-timer", "1s"}, "does not go with --live-timer"},
	}
	for _, c := range cases {
		code, _, stderr := runCmd(append(slicesClone(ev), c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", c.args, code, stderr, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%v created %s", c.args, out)
		}
	}
	// Without -o, with relayd alone: no budget, no live session.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rotate-size", "1M", "--max-chunks", "3"}, "lttng-relayd keeps every chunk it archives"},
		{[]string{"--rotate-size", "1M", "--max-size", "1G"}, "lttng-relayd keeps every chunk it archives"},
		{[]string{"--rotate-interval", "1m", "--live-timer", "1s"}, "does not go with --live-timer"},
	} {
		code, _, stderr := runCmd(append([]string{"record", "-e", "syscalls:sys_enter_getpid", "--relayd", "net://localhost"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("--relayd %v: exit %d, stderr %q; want exit 2 mentioning %q", c.args, code, stderr, c.want)
		}
	}
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// TestRotateKillRecover: a rotated recording killed (SIGKILL) with
// events still in its rings: recover counts, in the current chunk (the
// trace's directory), only what that chunk lost, not the closed chunks'
// events, so the closed chunks and the recovered current one add up to
// the events made, exactly.
func TestRotateKillRecover(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BT2(t)
	bin := testenv.KconsumeBin(t)
	for _, m := range []struct {
		name string
		args []string
	}{{"packets", nil}, {"record-rings", []string{"--latency", "50ms"}}} {
		t.Run(m.name, func(t *testing.T) {
			const made = 60000
			dir := filepath.Join(t.TempDir(), "t")
			name := "rotkill52" + m.name + uniq
			rec := startRecording(t, name, append([]string{"-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--rotate-interval", "1h", "--duration", "10m"}, m.args...)...)
			getpids(t, made/3)
			if reply, err := exec.Command(bin, "ctl", "--session", name, "rotate").CombinedOutput(); err != nil {
				t.Fatalf("ctl rotate: %v\n%s", err, reply)
			}
			getpids(t, made/3)
			if reply, err := exec.Command(bin, "ctl", "--session", name, "rotate").CombinedOutput(); err != nil {
				t.Fatalf("ctl rotate: %v\n%s", err, reply)
			}
			getpids(t, made/3)
			_ = rec.cmd.Process.Kill()
			rec.wait(t)
			out, code := shell(t, bin+" recover "+dir)
			if code != 0 {
				t.Fatalf("recover: exit %d\n%s", code, out)
			}
			events, discarded := traceCounts(t, dir)
			closed := closedChunks(t, dir)
			if len(closed) != 2 {
				t.Fatalf("closed chunks %v, want 2", closed)
			}
			for _, c := range closed {
				e, d := traceCounts(t, c)
				events += e
				discarded += d
			}
			if events+discarded != made {
				t.Errorf("the chunks read %d events and %d discarded, want %d in all\n%s", events, discarded, made, out)
			}
		})
	}
}

// TestRotateDiskFull: a rotated recording on a small tmpfs that fills
// after a workload of known count is handled as one that does not
// rotate: record stops saying the disk is full, and the chunks' events
// and discarded events, those counted at the streams' end included, add
// up to the calls made; the summary says what the chunks hold.
func TestRotateDiskFull(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BT2(t)
	const n = 100000
	mnt := mountTmpfs(t, 8<<20)
	dir := filepath.Join(mnt, "t")
	rec := startRecording(t, "rotfull52"+uniq, "-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm,
		"--subbuf-size", "64K", "--rotate-size", "512K", "--duration", "5m")
	getpids(t, n)
	fillDisk(t, mnt)
	code := rec.stop(t)
	out := rec.out.String()
	if code != 1 || !strings.Contains(out, "disk full") {
		t.Fatalf("record: exit %d, want 1 and a disk-full message\n%s", code, out)
	}
	closed := closedChunks(t, dir)
	events, discarded := chunksCounts(t, closed)
	if events+discarded != n {
		t.Errorf("%d chunks read %d events and %d discarded, want %d in all\n%s", len(closed), events, discarded, n, out)
	}
	recorded, lost := summaryCounts(t, out)
	if recorded != events || lost != discarded || lost == 0 {
		t.Errorf("summary: %d recorded, %d discarded; the chunks %d and %d\n%s", recorded, lost, events, discarded, out)
	}
	if len(closed) < 2 {
		t.Errorf("%d chunks: the recording did not rotate before the disk filled\n%s", len(closed), out)
	}
}

// TestRotateInterval: --rotate-interval closes chunks by itself while
// getpid bursts come and go, idle chunks included, and the chunks'
// events add up to the calls made.
func TestRotateInterval(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BT2(t)
	const bursts, each = 6, 5000
	dir := filepath.Join(t.TempDir(), "t")
	rec := startRecording(t, "rotint52"+uniq, "-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--rotate-interval", "150ms", "--duration", "5m")
	for range bursts {
		getpids(t, each)
		time.Sleep(200 * time.Millisecond)
	}
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	closed := closedChunks(t, dir)
	if len(closed) < bursts {
		t.Errorf("%d chunks in %d bursts 200 ms apart at an interval of 150 ms: %v", len(closed), bursts, closed)
	}
	events, discarded := chunksCounts(t, closed)
	if events+discarded != bursts*each {
		t.Errorf("%d chunks: %d events and %d discarded, want %d\n%s", len(closed), events, discarded, bursts*each, rec.out.String())
	}
}

// TestRotateUserSymbols: each closed chunk of a recording of user call
// chains carries the user symbols known at its closing, so report places
// its frames in their objects on its own, the first chunk's too.
func TestRotateUserSymbols(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "t")
	name := "rotsym52" + uniq
	rec := startRecording(t, name, "-o", dir, "-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--stack", "user", "--rotate-interval", "1h", "--duration", "5m")
	getpids(t, 2000)
	bin := testenv.KconsumeBin(t)
	if reply, err := exec.Command(bin, "ctl", "--session", name, "rotate").CombinedOutput(); err != nil {
		t.Fatalf("ctl rotate: %v\n%s", err, reply)
	}
	getpids(t, 2000)
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	placed := regexp.MustCompile(`callstack_user=\[[^ \]]+ \(/`)
	for _, c := range closedChunks(t, dir) {
		out, err := exec.Command(bin, "report", c).Output()
		if err != nil {
			t.Fatalf("report %s: %v", c, err)
		}
		first, _, _ := strings.Cut(string(out), "\n")
		if !placed.MatchString(first) {
			t.Errorf("chunk %s: its first event's user frames are in no object: %s", filepath.Base(c), first)
		}
	}
}

// TestRotateTrigger: a rotate trigger on a failed openat by a named
// shell closes the trace's chunk with the event in it, while record
// goes on: the closed chunk holds the getpid calls made before, and the
// last one those made after, exactly, each read alone by babeltrace2.
func TestRotateTrigger(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BT2(t)
	testenv.RequireKernel(t, 5, 12, "triggers (BPF compare-and-swap)")
	const before, after, comm = 20000, 10000, "kc-rot-trig"
	dir := filepath.Join(t.TempDir(), "t")
	missing := filepath.Join(t.TempDir(), "kc-rot-nonexistent")
	rec := startRecording(t, "trigrot52"+uniq, "-o", dir, "--comm", getpidsComm+","+comm,
		"-e", "syscalls:sys_enter_getpid", "-e", "syscalls:sys_exit_openat",
		"--trigger", `syscalls:sys_exit_openat ret == -2 && comm == "`+comm+`" : rotate, every 1m`, "--duration", "5m")
	getpids(t, before)
	if out, err := exec.Command("sh", "-c", "printf "+comm+" > /proc/self/comm; true < "+missing+" 2>/dev/null; true").CombinedOutput(); err != nil {
		t.Fatalf("the failed open: %v\n%s", err, out)
	}
	// The drainer rotates once the trigger's doorbell wakes it.
	waitFor(t, func() bool {
		ents, _ := os.ReadDir(filepath.Join(dir, chunks.ArchivesDir))
		return len(ents) > 0
	})
	getpids(t, after)
	if code := rec.stop(t); code != 0 {
		t.Fatalf("record: exit %d\n%s", code, rec.out.String())
	}
	if !strings.Contains(rec.out.String(), "rotated the trace 1 times") {
		t.Errorf("the summary does not count one rotation:\n%s", rec.out.String())
	}
	closed := closedChunks(t, dir)
	if len(closed) != 2 {
		t.Fatalf("closed chunks %v, want the trigger's and the last\n%s", closed, rec.out.String())
	}
	lines, discards := testenv.RunBT2(t, closed[0])
	if n, opens := countEvent(lines, "_getpid:"), countEvent(lines, "sys_exit_openat:"); n != before || opens != 1 || len(discards) != 0 {
		t.Errorf("the trigger's chunk: %d getpid events, %d failed opens, %d discard notices; want %d, 1 and none", n, opens, len(discards), before)
	}
	lines, discards = testenv.RunBT2(t, closed[1])
	if n := countEvent(lines, "_getpid:"); n != after || len(discards) != 0 {
		t.Errorf("the last chunk: %d getpid events, %d discard notices; want %d and none", n, len(discards), after)
	}
}
