package consumer

import (
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// gatedSink is a remote sink (it is no relayfmt.LocalSink) that takes
// no packet until gate is closed, then writes them to dir: relayd
// behind a link that stalled.
type gatedSink struct {
	dir  *relayfmt.DirSink
	gate chan struct{}
}

func (s gatedSink) WriteMetadata(text []byte) error { return s.dir.WriteMetadata(text) }
func (s gatedSink) Close() error                    { return s.dir.Close() }
func (s gatedSink) WritePacket(name string, p []byte) error {
	<-s.gate
	return s.dir.WritePacket(name, p)
}

// TestRemoteSinkBlockedSleeps records, in packet mode, packets that a
// remote sink does not take for a while, with the ring over the
// drainer's watermark: the drainer, whose packets wait in the ring for
// the channel's sub-buffers, sleeps until the sink frees one instead of
// draining again at once (it spun so, a core's worth, while relayd
// wrote), and every event reaches the trace once the sink takes them.
func TestRemoteSinkBlockedSleeps(t *testing.T) {
	testenv.RequireRoot(t)
	if !areaExpected(t) {
		t.Skip("packet mode needs kc_area rings: amd64 and Linux 5.12+")
	}
	const ring = 4 << 20
	dir := t.TempDir()
	ds, err := relayfmt.NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Under 3 MiB of events (some 20 bytes each), eleven 256 KiB
	// packets, which the ring holds.
	const n = 150000
	c := startChild(t, "getpid", n)
	gate := make(chan struct{})
	defer func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}()
	s, _ := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{c.tid}, RingSize: ring, Watermark: 256 << 10,
		Sink: gatedSink{ds, gate}})
	if err := s.Packets(); err != nil {
		t.Fatalf("packet mode not used: %v", err)
	}
	pinDrainer(t, s, 0)
	drainerCPU := func() (cpu time.Duration, blocked bool) {
		if err := s.dr.do(func() error {
			cpu = threadCPU() // the drainer's own thread, pinned
			for _, st := range s.dr.streams {
				blocked = blocked || st.blocked
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return cpu, blocked
	}
	cpu0, _ := drainerCPU()
	t0 := time.Now()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c.run(t)
	// Half a second more with the sink stalled.
	time.Sleep(500 * time.Millisecond)
	cpu1, blocked := drainerCPU()
	used, wall := cpu1-cpu0, time.Since(t0)
	t.Logf("the drainer used %v of CPU in %v (packets still waiting for the sink: %v)", used, wall, blocked)
	if !blocked {
		t.Fatal("no packet waited for the stalled sink: the test measured nothing")
	}
	// Spinning, it used nearly all of it; asleep, a few ms.
	if used > wall/5 {
		t.Fatalf("the drainer used %v of CPU in %v while it could mostly only wait for the sink", used, wall)
	}
	close(gate)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if counts, lost := countEvents(t, dir); counts["syscalls:sys_enter_getpid"] != n || lost != 0 {
		t.Fatalf("through the slow sink: %v, %d lost; want %d", counts, lost, n)
	}
}
