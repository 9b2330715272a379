package consumer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/synth"
)

// TestWakeupLatency: every synthetic:wakeup_latency equals the time from
// the woken task's last sched_waking to the sched_switch that runs it,
// both recorded in the same trace, and a sleeping child gets one per
// sleep; babeltrace2 reads the events too.
func TestWakeupLatency(t *testing.T) {
	const n = 200
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			c := startChild(t, "sleep", n)
			s, dir := newTestSession(t, Config{
				Events:    []string{"sched:sched_waking", "sched:sched_switch", "synthetic:" + synth.WakeupLatency},
				Transport: tr,
				NSubbufs:  64,
			})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			waking := map[int64]uint64{}     // pid: time of its last sched_waking
			switched := map[[2]uint64]bool{} // {time, next_pid} of sched_switch records
			// A record the kernel did not let the recorder write (a
			// recursion miss, see CPUStats.Missed) is reported as
			// discarded; each may spoil one comparison.
			var mine, checked, bad int
			var lost uint64
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					lost += it.Count
					return
				}
				switch it.Class.Name {
				case "sched:sched_waking":
					waking[field(vals, "pid").Int(0)] = it.Time
				case "sched:sched_switch":
					switched[[2]uint64{it.Time, uint64(field(vals, "next_pid").Int(0))}] = true
				case "synthetic:wakeup_latency":
					pid := field(vals, "pid").Int(0)
					lat := field(vals, "latency_ns").Uint(0)
					w, ok := waking[pid]
					if !switched[[2]uint64{it.Time, uint64(pid)}] || !ok || it.Time-w != lat {
						t.Logf("wakeup_latency of %d at %d: %d ns; sched_waking at %d (seen %v), sched_switch at that time %v", pid, it.Time, lat, w, ok, switched[[2]uint64{it.Time, uint64(pid)}])
						bad++
					}
					if field(vals, "cpu").Uint(0) != uint64(it.CPU) {
						t.Fatalf("wakeup_latency cpu %d in stream %d", field(vals, "cpu").Uint(0), it.CPU)
					}
					delete(waking, pid)
					checked++
					if pid == int64(c.tid) {
						mine++
						if string(field(vals, "comm").Text()) != childComm || field(vals, "prio").Int(0) != 120 {
							t.Fatalf("child's wakeup_latency: %v", vals)
						}
					}
				}
			})
			if uint64(bad) > lost {
				st, _ := s.Stats()
				t.Fatalf("%d of %d wakeup_latency events disagree with the trace, %d records lost; stats %+v", bad, checked, lost, st)
			}
			// A 1 ms sleep is a hrtimer wakeup each time, but a wakeup that
			// finds the child still on its run queue (the timer expired
			// before it slept; frequent in a slow guest) switches nothing
			// (ttwu_runnable in kernel/sched/core.c), so not every sleep
			// gives an event.
			if mine < n/2 {
				t.Fatalf("%d wakeup_latency events of the child for %d sleeps (%d checked)", mine, n, checked)
			}
			lines, _ := testenv.RunBT2(t, dir)
			bt := 0
			for _, l := range lines {
				// The child's other threads (and other tests' children) share
				// its name: count its own thread's events, as our reader does.
				if strings.Contains(l, "synthetic:wakeup_latency:") && strings.Contains(l, fmt.Sprintf("pid = %d,", c.tid)) && strings.Contains(l, `comm = "`+childComm+`"`) {
					bt++
				}
			}
			if bt != mine {
				t.Fatalf("babeltrace2 shows %d of the child's wakeup_latency events, our reader %d", bt, mine)
			}
			t.Logf("%d wakeup_latency events checked, %d of the child, %d lost", checked, mine, lost)
		})
	}
}

// TestWakeupLatencyAlone: recording wakeup_latency alone hooks the sched
// tracepoints without writing them into the trace.
func TestWakeupLatencyAlone(t *testing.T) {
	c := startChild(t, "sleep", 50)
	s, dir := newTestSession(t, Config{Events: []string{"synthetic:" + synth.WakeupLatency}, PIDs: []int{c.tid}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c.run(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	counts, lost := countEvents(t, dir)
	if lost != 0 || len(counts) != 1 || counts["synthetic:wakeup_latency"] < 25 {
		t.Fatalf("events %v, lost %d", counts, lost)
	}
	if _, err := New(Config{Dir: t.TempDir(), Events: []string{"synthetic:wakeup_*"}}); !errors.Is(err, ErrUnknownEvent) {
		t.Fatalf("a glob matched a built-in event: %v", err)
	}
	def, _ := synth.Parse("klog u8 x")
	if _, err := New(Config{Dir: t.TempDir(), Events: []string{"synthetic:klog"}, Synth: []*synth.Event{def}}); !errors.Is(err, ErrConfig) {
		t.Fatalf("redefining klog: %v", err)
	}
}
