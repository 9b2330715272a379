package consumer

import (
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestCPUHotplug offlines CPU 1 before the session starts, brings it back,
// traces a child pinned to it, then traces again and offlines the CPU at
// once, before the consumer may have drained it. Every event must reach
// CPU 1's stream: the perf transport reopens the ring of a CPU that comes
// back, and records left in an offline CPU's ring are still drained.
func TestCPUHotplug(t *testing.T) {
	needCPU1(t)
	const n1, n2 = 3000, 2000
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			testenv.SetCPUOnline(t, 1, false)
			t.Cleanup(func() { testenv.SetCPUOnline(t, 1, true) })
			c1 := startChild(t, "getpid", n1, "KC_CHILD_CPU=1")
			c2 := startChild(t, "getpid", n2, "KC_CHILD_CPU=1")
			s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{c1.tid, c2.tid}, Transport: tr})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			testenv.SetCPUOnline(t, 1, true)
			// The children may run once CPU 1's ring is back: the perf
			// transport reopens it when a uevent tells it, or looking
			// every 100 ms; the ringbuf transport has nothing to reopen.
			// Asked on the drainer's goroutine, whose state it is, until
			// it is, for at most a minute: a fixed sleep (300 ms) was
			// too short for a slow guest.
			reopened := func() bool {
				ok := false
				if err := s.dr.do(func() error {
					ok = s.dr.perf == nil || s.dr.perf.online[1]
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				return ok
			}
			for end := time.Now().Add(time.Minute); !reopened(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("CPU 1's ring not reopened a minute after the CPU came back online")
				}
			}
			c1.run(t)
			c2.run(t)
			testenv.SetCPUOnline(t, 1, false)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			st, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			per := map[uint32]int{}
			var lost uint64
			walkTrace(t, dir, func(it *relayfmt.Item, _ []relayfmt.Value) {
				switch it.Kind {
				case relayfmt.EventItem:
					per[it.CPU]++
				case relayfmt.DiscardedEvents:
					lost += it.Count
				}
			})
			if per[1] != n1+n2 || len(per) != 1 || lost != 0 {
				t.Fatalf("events by CPU %v, %d lost; want %d on CPU 1; stats %+v", per, lost, n1+n2, st)
			}
			var emitted uint64
			for _, c := range st {
				if c.CPU == 1 {
					emitted = c.Emitted
				}
			}
			if emitted != n1+n2 {
				t.Errorf("stats %+v, want %d emitted on CPU 1", st, n1+n2)
			}
		})
	}
}

// TestPerfContextOfflineCounted: a perf context's counter cannot be
// opened on a CPU that is offline at the start. Once the CPU is back, its
// events carry 0 for the counter, and each is counted
// (StackCounts.CountersUnread) rather than passed off as a reading.
func TestPerfContextOfflineCounted(t *testing.T) {
	needCPU1(t)
	const n = 2000
	testenv.SetCPUOnline(t, 1, false)
	t.Cleanup(func() { testenv.SetCPUOnline(t, 1, true) })
	c := startChild(t, "getpid", n, "KC_CHILD_CPU=1")
	s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{c.tid}, Contexts: []string{"perf:cpu:cpu-clock"}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.SetCPUOnline(t, 1, true)
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	counts, err := s.StackCounts()
	if err != nil {
		t.Fatal(err)
	}
	var events, zeros int
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem || it.CPU != 1 {
			return
		}
		events++
		if field(vals, "perf_cpu_cpu_clock").Uint(0) == 0 {
			zeros++
		}
	})
	if events != n || zeros != n || counts.CountersUnread != n {
		t.Fatalf("%d events on CPU 1, %d with a zero counter, %d counted unread; want %d of each", events, zeros, counts.CountersUnread, n)
	}
}

// needCPU1 skips the test outside a vmtest guest, since it offlines a
// CPU, and fails it when the guest's CPU 1 is not online.
func needCPU1(t *testing.T) {
	t.Helper()
	if !testenv.InGuest() {
		t.Skip("offlines a CPU: runs only inside a vmtest guest (make vmtest)")
	}
	testenv.RequireRoot(t)
	online, err := onlineCPUs(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(online) < 2 || !online[1] {
		t.Fatalf("needs CPU 1 online in the guest, have %v", online)
	}
}
