package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
	"golang.org/x/sys/unix"
)

// loopDevice attaches a loop device to a new file of size bytes and
// returns its path and its dev_t as the kernel encodes it (major << 20 |
// minor, as block events carry it), with no I/O scheduler; it is
// detached when t ends. It skips
// t where the kernel has no loop devices (no /dev/loop-control: the loop
// module is not loaded).
func loopDevice(t *testing.T, size int64) (string, uint64) {
	t.Helper()
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices for the block I/O workload (the loop module): %v", err)
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		testenv.Missing(t, "losetup is required for the block I/O workload (apt-get install util-linux): %v", err)
	}
	file := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup --find --show %s: %v\n%s", file, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v\n%s", dev, err, out)
		}
	})
	// No I/O scheduler, so the submitter issues its request itself (as
	// Linux 6.x does for loop devices): with one (5.10's mq-deadline)
	// kblockd's workers issue them, and the requests are theirs.
	sched := filepath.Join("/sys/block", filepath.Base(dev), "queue", "scheduler")
	if err := os.WriteFile(sched, []byte("none"), 0o644); err != nil {
		t.Fatalf("%s: %v", sched, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return dev, uint64(unix.Major(st.Rdev))<<20 | uint64(unix.Minor(st.Rdev))
}

// iousageBytes returns lttng-iousagetop's Block I/O bytes of section
// ("Block I/O Read" or "Block I/O Write") in its output a, by thread: a
// row names a task by pid when the analyses know its process, else by
// tid. It fails t when the section is missing.
func iousageBytes(t *testing.T, a, section string) map[string]float64 {
	t.Helper()
	i := strings.Index(a, section)
	if i < 0 {
		t.Fatalf("lttng-iousagetop has no %s section\n%s", section, a)
	}
	rest := a[i:]
	if j := strings.Index(rest, "\n\n"); j >= 0 {
		rest = rest[:j]
	}
	out := map[string]float64{}
	for _, m := range reBlockRow.FindAllStringSubmatch(rest, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		v *= map[string]float64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[m[2]]
		out[m[3]+m[4]] += v
	}
	return out
}

// TestLTTngBlock writes 8 blocks of 64 KiB to a loop device with O_DIRECT
// and reads them back, recorded with --profile lttng (with the sched
// events the analyses need to know the tasks): babeltrace2 shows
// block_rq_issue and block_rq_complete as lttng-modules names them, 8 of
// each direction on the device, of 128 sectors and 65536 bytes, with an
// integer rwbs (the write bit set for the writes, the read bit for the
// reads) and the issuing task's tid; lttng-iousagetop counts 16 requests
// and 2048 sectors on the device, and the bytes it files under each task
// that issued them are the bytes of the completed requests that task
// issued (the workload on Linux 6.x, kblockd's workers on 5.10). The
// ftrace profile keeps ftrace's names and rwbs text.
func TestLTTngBlock(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	work := buildWorkload(t)
	const n, size = 8, 64 << 10
	for _, prof := range []string{"lttng", "ftrace"} {
		t.Run(prof, func(t *testing.T) {
			dev, devt := loopDevice(t, 2*n*size)
			out := filepath.Join(t.TempDir(), "kernel")
			o, code := shell(t, fmt.Sprintf("%s record -q --profile %s -o %s --session block%d -e 'block:block_rq_issue,block:block_rq_complete,block:block_rq_insert,block:block_bio_queue,sched:sched_switch,sched:sched_process_fork,sched:sched_process_exec' -- %s dio %s %d %d",
				bin, prof, out, os.Getpid(), work, dev, n, size))
			if code != 0 {
				t.Fatalf("record: %d\n%s", code, o)
			}
			lines, _ := testenv.RunBT2(t, out)
			type key struct {
				ev    string
				write bool
			}
			type rq struct{ dev, sector, nr string }
			counts := map[key]int{}
			issued := map[rq]string{}             // request → "tid write?"
			done := map[string]map[bool]float64{} // tid → write → bytes of completed requests
			issuers := map[string]bool{}          // of the loop device's requests
			for _, l := range lines {
				if strings.Contains(l, "block:") != (prof == "ftrace") && strings.Contains(l, "block_") {
					t.Fatalf("profile %s, event named otherwise: %s", prof, l)
				}
				m := reBlockRq.FindStringSubmatch(l)
				if m == nil {
					if strings.Contains(l, "block_rq_issue:") || strings.Contains(l, "block_rq_complete:") {
						t.Fatalf("unexpected block event: %s", l)
					}
					continue
				}
				ev, tid, r, bytes, errno, rwbs := m[1], m[2], rq{m[3], m[4], m[5]}, m[6], m[7], m[8]
				var write bool
				if prof == "lttng" {
					v, err := strconv.Atoi(rwbs)
					if err != nil {
						t.Fatalf("rwbs %s is not an integer: %s", rwbs, l)
					}
					// lttng-modules' RWBS_FLAG_WRITE and _READ.
					write = v&1 != 0
					if r.dev == strconv.FormatUint(devt, 10) && write == (v&4 != 0) {
						t.Errorf("rwbs %d: want a read or a write: %s", v, l)
					}
				} else {
					write = strings.HasPrefix(rwbs, `"W`)
					if r.dev == strconv.FormatUint(devt, 10) && !write && !strings.HasPrefix(rwbs, `"R`) {
						t.Errorf("rwbs %s: want R or W: %s", rwbs, l)
					}
				}
				if ev == "block_rq_issue" {
					issued[r] = tid
				} else if who, ok := issued[r]; ok && r.nr != "0" {
					// As the analyses: a completion counts for the
					// request issued at that sector with as many sectors.
					nr, _ := strconv.Atoi(r.nr)
					if done[who] == nil {
						done[who] = map[bool]float64{}
					}
					done[who][write] += float64(nr * 512)
					delete(issued, r)
				}
				if r.dev != strconv.FormatUint(devt, 10) {
					continue
				}
				if r.nr != strconv.Itoa(size/512) || ev == "block_rq_issue" && bytes != strconv.Itoa(size) || ev == "block_rq_complete" && errno != "0" {
					t.Errorf("want %d sectors, %d bytes, no error: %s", size/512, size, l)
				}
				if ev == "block_rq_issue" {
					issuers[tid] = true
				}
				counts[key{ev, write}]++
			}
			t.Logf("requests on %s (%d): %v, issued by threads %v", dev, devt, counts, issuers)
			for _, ev := range []string{"block_rq_issue", "block_rq_complete"} {
				if counts[key{ev, true}] != n || counts[key{ev, false}] != n {
					t.Errorf("%s: %d writes and %d reads of %s, want %d of each", ev, counts[key{ev, true}], counts[key{ev, false}], dev, n)
				}
			}
			if prof != "lttng" {
				return
			}
			// Without --no-intersection: the analyses keep by default only
			// the span every stream covers, which holds the whole trace
			// because every stream begins at the start and ends at the
			// stop, as LTTng's do (relayfmt's Channel.Begin and Close); a
			// stream ending at its CPU's last event cut the requests off
			// in 1 run of 6.
			a := runAnalysis(t, "lttng-iousagetop", filepath.Dir(out), "--limit", "100000")
			name := filepath.Base(dev)
			disk := map[string]string{}
			for _, m := range reDiskRow.FindAllStringSubmatch(a, -1) {
				if m[3] == name {
					disk[m[2]] = m[1]
				}
			}
			t.Logf("lttng-iousagetop: %s: %v", name, disk)
			if want := strconv.Itoa(2 * n); disk["requests"] != want {
				t.Errorf("lttng-iousagetop: %s requests on %s, want %s\n%s", disk["requests"], name, want, a)
			}
			if want := strconv.Itoa(2 * n * size / 512); disk["sectors"] != want {
				t.Errorf("lttng-iousagetop: %s sectors on %s, want %s\n%s", disk["sectors"], name, want, a)
			}
			for _, dir := range []struct {
				section string
				write   bool
			}{{"Block I/O Read", false}, {"Block I/O Write", true}} {
				got := iousageBytes(t, a, dir.section)
				for tid := range issuers {
					// iousagetop prints 2 decimals of its unit.
					if want := done[tid][dir.write]; got[tid] < want*0.999 || got[tid] > want*1.001 {
						t.Errorf("lttng-iousagetop: %s: %.0f bytes by thread %s, the trace's completed requests of it %.0f\n%s", dir.section, got[tid], tid, want, a)
					} else {
						t.Logf("lttng-iousagetop: %s: %.0f bytes by thread %s, as the trace", dir.section, got[tid], tid)
					}
				}
			}
		})
	}
}
