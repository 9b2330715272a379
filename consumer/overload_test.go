package consumer

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// closeFDs reads the fd argument of every syscalls:sys_enter_close event
// in dir, in merged order, and the discarded count of our reader.
func closeFDs(t *testing.T, dir string) (fds []int, lost uint64) {
	t.Helper()
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		switch it.Kind {
		case relayfmt.DiscardedEvents:
			lost += it.Count
		case relayfmt.EventItem:
			fds = append(fds, int(field(vals, "fd").Uint(0))-closeBase)
		}
	})
	return fds, lost
}

// bt2Discarded sums babeltrace2's discarded-events warnings for dir and
// checks it printed one line per event we kept; discarded packets (the
// sub-buffers an overwrite snapshot left out) are summed apart.
func bt2Discarded(t *testing.T, dir string, kept int) (sum, packets int) {
	t.Helper()
	lines, discards := testenv.RunBT2(t, dir)
	if len(lines) != kept {
		t.Fatalf("babeltrace2 printed %d events, our reader %d", len(lines), kept)
	}
	for _, d := range discards {
		if d.Kind == "packets" {
			packets += d.Count
			continue
		}
		sum += d.Count
	}
	return sum, packets
}

// TestOverloadNoOverwrite floods tiny buffers (a 16 KiB ring, 2 x 4 KiB
// sub-buffers) from one filtered child: every produced record is written
// or counted as discarded, at the layer it was lost, and babeltrace2
// prints the same discarded total.
func TestOverloadNoOverwrite(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 200000
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			c := startChild(t, "close", n)
			s, dir := newTestSession(t, Config{
				Events: []string{"syscalls:sys_enter_close"}, PIDs: []int{c.tid}, Transport: tr,
				SubbufSize: 4096, NSubbufs: 2, RingSize: 16 << 10,
				// perf reports its losses only once the consumer made room
				// during the flood: a latency tick makes sure it runs then.
				Latency: time.Millisecond,
			})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			stats, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			var kernel, missed, perf, dropped, records uint64
			for _, st := range stats {
				kernel += st.KernelLost
				missed += st.Missed
				perf += st.PerfLost
				dropped += st.Channel.Dropped
				records += st.Channel.Records
			}
			fds, lost := closeFDs(t, dir)
			t.Logf("%s: %d written, lost: %d in the kernel, %d by perf, %d runs missed, %d channel drops", tr, len(fds), kernel, perf, missed, dropped)
			// Runs the kernel skipped (recursion) are not attributed to a
			// task, so with the pid filter they only bound the gap.
			if w := uint64(len(fds)) + lost; w > n || w+missed < n {
				t.Fatalf("written %d + discarded %d = %d, want %d produced (%d runs missed)", len(fds), lost, w, n, missed)
			}
			if kernel+dropped != lost || records != uint64(len(fds)) || perf > kernel || tr == Perf && perf == 0 {
				t.Fatalf("stats: kernel %d (perf-reported %d) + channel %d != discarded %d in the trace; channel records %d vs %d read", kernel, perf, dropped, lost, records, len(fds))
			}
			if lost == 0 {
				t.Fatalf("no loss: the overload did not overload")
			}
			for i := 1; i < len(fds); i++ {
				if fds[i] <= fds[i-1] {
					t.Fatalf("event %d: fd %d after %d: order lost", i, fds[i], fds[i-1])
				}
			}
			if got, pkts := bt2Discarded(t, dir, len(fds)); uint64(got) != lost || pkts != 0 {
				t.Fatalf("babeltrace2 reports %d discarded events and %d packets, our reader %d events", got, pkts, lost)
			}
		})
	}
}

// TestOverwriteKeepsNewest: in overwrite mode after a flood the trace
// holds the newest records, one run up to the last, and the oldest are
// the ones reported lost.
func TestOverwriteKeepsNewest(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 50000
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			// One CPU: each CPU's flight recorder keeps its own newest
			// records, so a child that migrated would leave two runs.
			c := startChild(t, "close", n, "KC_CHILD_CPU=0")
			// The ring holds the whole flood, so only the channel loses.
			s, dir := newTestSession(t, Config{
				Events: []string{"syscalls:sys_enter_close"}, PIDs: []int{c.tid}, Transport: tr,
				SubbufSize: 4096, NSubbufs: 2, Mode: relayfmt.Overwrite, RingSize: 4 << 20,
			})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			fds, lost := closeFDs(t, dir)
			st, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if w := uint64(len(fds)) + lost; len(fds) == 0 || w > n || w+st[0].Missed < n {
				t.Fatalf("kept %d + lost %d != %d (%d runs missed)", len(fds), lost, n, st[0].Missed)
			}
			for i, fd := range fds {
				if want := n - len(fds) + i; fd != want {
					st, _ := s.Stats()
					t.Fatalf("kept event %d of %d has fd %d, want %d: not the newest run (lost %d; stats %+v)", i, len(fds), fd, want, lost, st)
				}
			}
			got, pkts := bt2Discarded(t, dir, len(fds))
			t.Logf("kept %d, lost %d; babeltrace2: %d events and %d packets discarded", len(fds), lost, got, pkts)
			if uint64(got) != lost || pkts == 0 {
				t.Fatalf("babeltrace2 reports %d discarded events (and %d packets), our reader %d events", got, pkts, lost)
			}
		})
	}
}

// TestSchedSwitch records sched:sched_switch for a second: every event
// has the switching-out task as its common_pid, and the child's switches
// carry its comm as /proc shows it.
func TestSchedSwitch(t *testing.T) {
	testenv.RequireRoot(t)
	c := startChild(t, "sleep", 200)
	s, dir := newTestSession(t, Config{Events: []string{"sched:sched_switch"}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	comm := procComm(t, c.tid)
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	total, mine := 0, 0
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Fatalf("unexpected notice %+v", it)
		}
		total++
		if field(vals, "common_pid").Int(0) != field(vals, "prev_pid").Int(0) {
			t.Fatalf("event %d: common_pid %d != prev_pid %d", total, field(vals, "common_pid").Int(0), field(vals, "prev_pid").Int(0))
		}
		for _, side := range []string{"prev", "next"} {
			if int(field(vals, side+"_pid").Int(0)) == c.tid {
				mine++
				if got := string(field(vals, side+"_comm").Text()); got != comm {
					t.Fatalf("%s_comm %q for pid %d, /proc says %q", side, got, c.tid, comm)
				}
			}
		}
	})
	if mine < 200 {
		t.Fatalf("%d switches of the child (of %d), want at least 200 (it slept 200 times)", mine, total)
	}
	lines, _ := testenv.RunBT2(t, dir)
	if len(lines) != total {
		t.Fatalf("babeltrace2 printed %d events, our reader %d", len(lines), total)
	}
	want := fmt.Sprintf("prev_comm = \"%s\", prev_pid = %d", comm, c.tid)
	found := false
	for _, l := range lines {
		if strings.Contains(l, "sched:sched_switch:") && strings.Contains(l, want) && strings.Contains(l, "next_comm = ") && strings.Contains(l, "next_pid = ") {
			found = true
			break
		}
	}
	if !found {
		t.Fatalf("babeltrace2 shows no switch with %q; first line %q", want, lines[0])
	}
}

func procComm(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
