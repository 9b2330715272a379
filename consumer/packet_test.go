package consumer

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// pktExpected reports whether s writes packets from its BPF programs,
// failing t where kc_area rings are expected and it does not.
func pktExpected(t *testing.T, s *Session) bool {
	t.Helper()
	if s.Packets() == nil {
		return true
	}
	if areaExpected(t) {
		t.Fatalf("packet mode not used: %v", s.Packets())
	}
	return false
}

// TestPacketLatency: in packet mode a packet reaches the file when it
// fills, at a Flush or at Close, and a latency bound keeps a session on
// the record walk. The bound takes records out of the ring within it: in
// packet mode that was closing the open packet, a whole sub-buffer of the
// file for the few events of a period (at 1 ms, 1.4 GB in 3 s of an
// otherwise idle recording); the walk moves them into the channel's open
// packet, and the file grows by full packets only.
func TestPacketLatency(t *testing.T) {
	testenv.RequireRoot(t)
	t.Run("none", func(t *testing.T) {
		const n = 100
		c := startChild(t, "getpid", n)
		s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{c.tid}})
		if !pktExpected(t, s) {
			t.Skip("no kc_area rings here (amd64 and Linux 5.12+ only)")
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		c.run(t)
		time.Sleep(200 * time.Millisecond)
		if counts, _ := countEvents(t, dir); counts["syscalls:sys_enter_getpid"] != 0 {
			t.Fatalf("%d records written before Close without a latency bound: the open packet was closed by something", counts["syscalls:sys_enter_getpid"])
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if counts, _ := countEvents(t, dir); counts["syscalls:sys_enter_getpid"] != n {
			t.Fatalf("%d of %d records after Close", counts["syscalls:sys_enter_getpid"], n)
		}
		if lines, _ := testenv.RunBT2(t, dir); len(lines) != n {
			t.Fatalf("babeltrace2 read %d events, want %d", len(lines), n)
		}
	})
	t.Run("1ms", func(t *testing.T) {
		// A switch of the child's about every millisecond, for 300 ms.
		c := startChild(t, "sleep", 300)
		cfg := Config{Events: []string{"sched:sched_switch"}, PIDs: []int{c.tid}, Latency: time.Millisecond}
		s, dir := newTestSession(t, cfg)
		switch err := s.Packets(); {
		case err == nil:
			t.Fatal("packet mode with a latency bound")
		case areaExpected(t) && !strings.Contains(err.Error(), "latency"):
			// Where the own rings are not, that is the reason.
			t.Fatalf("not in packet mode, but not for the latency bound: %v", err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		c.run(t)
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		// The flush wrote one packet a CPU at most; more would be
		// packets the latency closed.
		sub := s.Config().SubbufSize
		var size int64
		files, _ := filepath.Glob(filepath.Join(dir, "trace*"))
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil {
				size += fi.Size()
			}
		}
		if size > int64(len(files)*sub) {
			t.Fatalf("the trace files hold %d bytes after a flush, more than a %d-byte packet a CPU", size, sub)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		counts, _ := countEvents(t, dir)
		if counts["sched:sched_switch"] == 0 {
			t.Fatal("no switch of the child's recorded")
		}
		if lines, _ := testenv.RunBT2(t, dir); len(lines) != counts["sched:sched_switch"] {
			t.Fatalf("babeltrace2 read %d events, the reader %d", len(lines), counts["sched:sched_switch"])
		}
		t.Logf("%d switches in %d bytes of %d files", counts["sched:sched_switch"], size, len(files))
	})
}

// TestPacketsEqualWalk records one child's scheduler and syscall events
// with two sessions at once, one writing packets from its programs and
// one walking records (KC_NO_PKT), and compares what they wrote, CPU by
// CPU, event by event and byte by byte (as sorted lists: an interrupt's
// event may fall between the two sessions' programs for one tracepoint): the programs' transcoding
// (kc_ctf_build: __data_loc strings such as sched_stat_runtime's comm on
// Linux 6.10+, holes) must write what the consumer's would, which the
// comparisons with trace-cmd check. babeltrace2 must read the packets.
func TestPacketsEqualWalk(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 20000
	c := startChild(t, "getpid", n)
	cfg := Config{Events: []string{"sched:*", "syscalls:sys_enter_getpid", "syscalls:sys_exit_getpid", "syscalls:sys_enter_write"}, PIDs: []int{c.tid}}
	pkt, pktDir := newTestSession(t, cfg)
	if !pktExpected(t, pkt) {
		t.Skip("no kc_area rings here (amd64 and Linux 5.12+ only)")
	}
	recorder.Testing.NoPackets = true
	walk, walkDir := newTestSession(t, cfg)
	recorder.Testing.NoPackets = false
	if walk.Packets() == nil {
		t.Fatal("packet mode with KC_NO_PKT")
	}
	for _, s := range []*Session{pkt, walk} {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	c.run(t)
	for _, s := range []*Session{pkt, walk} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	type ev struct {
		class   string
		payload string
	}
	// The sessions stop one after the other, and the child's very last
	// events (its final runtime and switch, after its parent reaped it)
	// may come between: each trace is compared up to the child's last
	// sched_process_exit, which both hold.
	exited := func(dir string) (at uint64) {
		walkTrace(t, dir, func(it *relayfmt.Item, _ []relayfmt.Value) {
			if it.Kind == relayfmt.EventItem && it.Class.Name == "sched:sched_process_exit" {
				at = max(at, it.Time)
			}
		})
		return at
	}
	read := func(dir string) (map[uint32][]ev, int, uint64) {
		until := exited(dir)
		byCPU := map[uint32][]ev{}
		total := 0
		var lost uint64
		walkTrace(t, dir, func(it *relayfmt.Item, _ []relayfmt.Value) {
			switch it.Kind {
			case relayfmt.EventItem:
				total++
				if it.Time > until {
					return
				}
				byCPU[it.CPU] = append(byCPU[it.CPU], ev{it.Class.Name, string(it.Payload)})
			case relayfmt.DiscardedEvents:
				lost += it.Count
			}
		})
		return byCPU, total, lost
	}
	p, pn, plost := read(pktDir)
	w, wn, wlost := read(walkDir)
	classes := map[string]int{}
	for _, evs := range p {
		for _, e := range evs {
			classes[e.class]++
		}
	}
	t.Logf("packets: %d events, %d lost; walk: %d events, %d lost; classes %v", pn, plost, wn, wlost, classes)
	if plost != 0 || wlost != 0 {
		t.Fatalf("events lost: %d in packets, %d walking", plost, wlost)
	}
	if classes["syscalls:sys_enter_getpid"] != n || classes["sched:sched_stat_runtime"] == 0 || classes["sched:sched_process_exit"] == 0 {
		t.Fatalf("not the child's events: %v", classes)
	}
	// In order, but for an interrupt's event that falls between the two
	// sessions' programs for one tracepoint: compared as sorted lists.
	less := func(a, b ev) int { return strings.Compare(a.class+a.payload, b.class+b.payload) }
	for cpu, pe := range p {
		we := w[cpu]
		slices.SortFunc(pe, less)
		slices.SortFunc(we, less)
		for i := range max(len(pe), len(we)) {
			if i >= len(pe) || i >= len(we) || pe[i] != we[i] {
				var a, b ev
				if i < len(pe) {
					a = pe[i]
				}
				if i < len(we) {
					b = we[i]
				}
				t.Fatalf("CPU %d, event %d of %d and %d: packets %s %x, walk %s %x", cpu, i, len(pe), len(we), a.class, a.payload, b.class, b.payload)
			}
		}
	}
	if lines, _ := testenv.RunBT2(t, pktDir); len(lines) != pn {
		t.Fatalf("babeltrace2 read %d events of the packets, our reader %d", len(lines), pn)
	}
	checkPadding(t, pktDir)
}

// checkPadding fails t when a packet of a stream file in dir has a byte
// other than zero after its content (relayfmt/FORMAT.md): packet mode
// clears only the padding of the ring's elements, not what earlier laps
// left under the events.
func checkPadding(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "trace*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no stream files in %s: %v", dir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(b); {
			h, err := relayfmt.ParsePacketHeader(b[off:])
			if err != nil {
				t.Fatalf("%s at %d: %v", f, off, err)
			}
			end := off + int(h.PacketSize/8)
			if h.PacketSize == 0 || end > len(b) {
				t.Fatalf("%s at %d: packet of %d bits in a file of %d bytes", f, off, h.PacketSize, len(b))
			}
			for i := off + int(h.ContentSize/8); i < end; i++ {
				if b[i] != 0 {
					t.Fatalf("%s: packet at %d has %#x at %d, in its padding", f, off, b[i], i)
				}
			}
			off = end
		}
	}
}
