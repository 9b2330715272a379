package consumer

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer/recorder"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestRingInTimeOrder: records reach a kc_area ring in the order of their
// timestamps even when an interrupt's program writes in the middle of
// another program's record, because kc_area_reserve and kc_pkt_reserve
// read the clock inside their compare-and-swap loops. A getpid loop and a
// thread sleeping 20 µs at a time share CPU 0, so hrtimer interrupts,
// recorded, land inside sys_enter's program; the reorder window must
// find nothing to reorder, and every record must arrive whole. In packet
// mode, where no window looks, babeltrace2 must read every event in
// order. Through BPF ring buffers, which stamp a record after reserving
// it, the same load does need the window: the check that it nests.
func TestRingInTimeOrder(t *testing.T) {
	testenv.RequireRoot(t)
	for _, mode := range []string{"packets", "area", "ringbuf"} {
		area := mode != "ringbuf"
		t.Run(mode, func(t *testing.T) {
			switch mode {
			case "ringbuf":
				recorder.Testing.NoArea = true
				defer func() { recorder.Testing.NoArea = false }()
			case "area":
				recorder.Testing.NoPackets = true
				defer func() { recorder.Testing.NoPackets = false }()
			}
			s, dir := newTestSession(t, Config{
				Events: []string{"syscalls:sys_enter_getpid", "timer:hrtimer_expire_entry"},
			})
			if mode == "packets" {
				if s.Packets() != nil {
					if areaExpected(t) {
						t.Fatalf("packet mode not used: %v", s.Packets())
					}
					t.Skip("no kc_area rings here (amd64 and Linux 5.12+ only)")
				}
			} else if src, ok := s.dr.streams[0].src.(*ringbuf); !ok {
				if kernelAtLeast(t, 5, 8) {
					t.Fatalf("kernel 5.8+ recording without BPF ring buffers: %T", s.dr.streams[0].src)
				}
				t.Skip("kernel before 5.8: no BPF ring buffers, perf buffers stamp before the output")
			} else if area && !src.area {
				if areaExpected(t) {
					t.Fatalf("own rings not used: %v", s.OwnRings())
				}
				t.Skip("no kc_area rings here (amd64 and Linux 5.12+ only)")
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			nestOnCPU0(t, time.Second)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			st, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			// Interleaving: timer records between getpid records on CPU 0.
			// And every record whole: a writer that stored outside its
			// reservation would have zeroed part of a nested one.
			var timers, turns, events int
			var prev string
			last := map[uint32]uint64{}
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					return
				}
				events++
				if it.Time < last[it.CPU] {
					t.Fatalf("CPU %d: %s at %d after an event at %d", it.CPU, it.Class.Name, it.Time, last[it.CPU])
				}
				last[it.CPU] = it.Time
				switch it.Class.Name {
				case "syscalls:sys_enter_getpid":
					if nr := field(vals, "__syscall_nr").Int(0); nr != unix.SYS_GETPID {
						t.Fatalf("sys_enter_getpid with __syscall_nr %d: %v", nr, vals)
					}
				case "timer:hrtimer_expire_entry":
					// The event's type, two kernel addresses (the upper
					// half of the address space, 5-level paging's
					// included), and the timer base's time:
					// CLOCK_MONOTONIC or BOOTTIME near the record's own
					// (a TCG guest's interrupt runs tens of ms behind
					// it), or for a timer of another process on a
					// REALTIME or TAI base, the wall clock's.
					kernel := func(p uint64) bool { return p>>56 == 0xff && uint32(p) != 0 }
					now := field(vals, "now").Int(0)
					near := func(a, b int64, d time.Duration) bool { return max(a-b, b-a) <= int64(d) }
					if field(vals, "common_type").Uint(0) == 0 || !kernel(field(vals, "hrtimer").Uint(0)) || !kernel(field(vals, "function").Uint(0)) ||
						now <= 0 || !near(int64(it.Time), now, time.Second) && !near(time.Now().UnixNano(), now, time.Hour) {
						t.Fatalf("hrtimer_expire_entry at %d not whole: %v", it.Time, vals)
					}
				default:
					t.Fatalf("event %s not recorded", it.Class.Name)
				}
				if it.CPU != 0 {
					return
				}
				if it.Class.Name == "timer:hrtimer_expire_entry" {
					timers++
					if prev == "syscalls:sys_enter_getpid" {
						turns++
					}
				}
				prev = it.Class.Name
			})
			c := st[0]
			t.Logf("cpu 0: %d records, %d hrtimer records (%d amid getpid ones), reordered %d, clamped %d, discarded %d",
				c.Emitted, timers, turns, c.Reordered, c.Channel.Clamped, c.Discarded())
			if turns < 100 {
				t.Fatalf("only %d hrtimer records amid getpid ones on CPU 0: the load did not interrupt the recorder", turns)
			}
			if area && (c.Reordered != 0 || c.Channel.Clamped != 0) {
				t.Fatalf("kc_area ring out of time order: %d records reordered, %d clamped", c.Reordered, c.Channel.Clamped)
			}
			if mode == "packets" {
				if lines, _ := testenv.RunBT2(t, dir); len(lines) != events {
					t.Fatalf("babeltrace2 read %d events, our reader %d", len(lines), events)
				}
			}
			// The timer's own tp_btf program (the hot events table)
			// nests over a perf program: bpf_prog_active guards only
			// the classic tracepoint programs.
			onBTF, _ := s.BTFEvents()
			btfTimer := slices.Contains(onBTF, "timer:hrtimer_expire_entry")
			switch {
			case !area && s.rec.RawFromPerf() && !btfTimer && c.Discarded() == 0:
				// The raw path from perf tracepoints (preempt.go) holds
				// the CPU's bpf_prog_active: a timer's program in an
				// interrupt over it is skipped, counted, not nested.
				t.Fatal("the raw path from perf tracepoints: no timer run skipped under it and counted")
			case !area && (!s.rec.RawFromPerf() || btfTimer) && c.Reordered == 0:
				t.Fatal("no record reordered through a BPF ring buffer: the load did not nest programs")
			}
		})
	}
}

// nestOnCPU0 runs, for d, a getpid loop and a loop of 20 µs sleeps on
// CPU 0, each on a thread of its own: the sleeps' timers interrupt the
// getpid calls.
func nestOnCPU0(t *testing.T, d time.Duration) {
	t.Helper()
	var stop atomic.Bool
	var wg sync.WaitGroup
	onCPU0 := func(fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(0)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				t.Error(err)
				return
			}
			for !stop.Load() {
				fn()
			}
		}()
	}
	onCPU0(func() {
		for range 1000 {
			unix.Getpid()
		}
	})
	onCPU0(func() { _ = unix.Nanosleep(&unix.Timespec{Nsec: 20000}, nil) })
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
}
