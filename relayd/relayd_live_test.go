package relayd

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestRelaydLiveIdle: in a live session, Live gives a stream that never
// had a packet one empty packet (relayd takes beacons only after a first
// index), then beacons; the trace keeps exactly the local copy's events.
// When the idle stream's first own packet comes, begun at the channel's
// start (Begin), relayd gets it begun at the stream's last beacon: a
// live viewer never sees a stream's time go back.
func TestRelaydLiveIdle(t *testing.T) {
	r := testenv.StartRelayd(t)
	local := t.TempDir()
	dir, err := relayfmt.NewDirSink(local)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := ParseURL(r.URL())
	s, err := NewSink(context.Background(), Config{URL: u, Session: Session{Host: "hl", Name: "live", LiveTimer: 100 * time.Millisecond, Timeout: 5 * time.Second}, Streams: []string{"trace0", "trace1"}})
	if err != nil {
		t.Fatal(err)
	}
	tee := &Tee{Dir: dir, Remote: s}
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 8, CPUs: 2}, tee)
	if err != nil {
		t.Fatal(err)
	}
	cls, err := ch.AddEventClass("ev", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	ch.Begin(1e9 - 1000)
	p := make([]byte, 8)
	for tick := range 3 {
		for i := range 10 {
			if err := ch.Write(0, uint64(1e9+tick*1e6+i), cls.ID, p); err != nil {
				t.Fatal(err)
			}
		}
		if err := ch.Flush(); err != nil {
			t.Fatal(err)
		}
		// The Tee sends from goroutines of its own: the beacon goes
		// after the packets.
		if err := tee.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := s.Live(uint64(1e9 + tick*1e6 + 500)); err != nil {
			t.Fatalf("live tick %d: %v\n%s", tick, err, r.LogTail(20))
		}
	}
	if err := ch.Write(1, 1e9+3e6, cls.ID, p); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	// CPU 0's 3, CPU 1's one, and the empty packet that ends CPU 0's
	// stream with CPU 1's event.
	if st := s.Stats(); st.Err != nil || st.Sent != 5 {
		t.Fatalf("stats %+v, want 5 packets sent", st)
	}
	// relayd -v logs each beacon it takes (stream.c, stream_add_index).
	if log, _ := os.ReadFile(r.Log); strings.Count(string(log), "Received live beacon") < 2 {
		t.Errorf("relayd took fewer than 2 beacons for the idle stream:\n%s", r.LogTail(30))
	}
	remote := filepath.Join(r.SessionDir(t, "hl", "live"), DomainPath)
	b, err := os.ReadFile(filepath.Join(remote, "trace1"))
	if err != nil || len(b) != 2*4096 {
		t.Fatalf("idle stream on relayd: %d bytes (%v), want an empty packet and its own", len(b), err)
	}
	first, err1 := relayfmt.ParsePacketHeader(b)
	own, err2 := relayfmt.ParsePacketHeader(b[4096:])
	if err1 != nil || err2 != nil || first.TimestampEnd != 1e9+500 || own.TimestampBegin != 1e9+2e6+500 {
		t.Errorf("idle stream's packets on relayd: [%d, %d] then [%d, %d] (%v, %v): want the own packet begun at the last beacon, 1000002500", first.TimestampBegin, first.TimestampEnd, own.TimestampBegin, own.TimestampEnd, err1, err2)
	}
	want, _ := testenv.RunBT2(t, local)
	got, _ := testenv.RunBT2(t, remote)
	if len(want) != 31 || !slices.Equal(got, want) {
		t.Fatalf("babeltrace2: %d events from relayd, %d local", len(got), len(want))
	}
}

// TestRelaydLiveMetadataGrows adds an event class while babeltrace2 reads
// the session live: the viewer takes the metadata's new part and shows
// the new class's events. babeltrace2 needs each part of plain-text
// metadata to begin with the "/* CTF 1.8" signature, so a sink sending
// text rather than metadata packets fails here.
func TestRelaydLiveMetadataGrows(t *testing.T) {
	r := testenv.StartRelayd(t)
	bt2 := testenv.BT2(t)
	u, _ := ParseURL(r.URL())
	s, err := NewSink(context.Background(), Config{URL: u, Session: Session{Host: "hg", Name: "grow", LiveTimer: 100 * time.Millisecond, Timeout: 5 * time.Second}, Streams: []string{"trace0", "trace1"}})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 8, CPUs: 2, Clock: relayfmt.Clock{Offset: 1.7e18}}, s)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	a, err := ch.AddEventClass("ev_a", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	ch.Begin(1e9)
	view := exec.Command(bt2, "--input-format=lttng-live", r.LiveURL("hg", "grow"))
	var out, stderr testenv.Output
	view.Stdout, view.Stderr = &out, &stderr
	if err := view.Start(); err != nil {
		t.Fatal(err)
	}
	viewDone := make(chan error, 1)
	go func() { viewDone <- view.Wait() }()
	defer func() { _ = view.Process.Kill(); <-viewDone }()
	tick := 0
	p := make([]byte, 8)
	// until writes cls's events on both CPUs every 100 ms, a live tick
	// after each round, until the viewer prints want.
	until := func(cls *relayfmt.EventClass, want string) {
		t.Helper()
		for end := time.Now().Add(time.Minute); !strings.Contains(out.String(), want); tick++ {
			select {
			case err := <-viewDone:
				viewDone <- err
				t.Fatalf("babeltrace2 ended (%v) before printing %s:\n%s\nrelayd log:\n%s", err, want, stderr.String(), r.LogTail(20))
			default:
			}
			if time.Now().After(end) {
				t.Fatalf("babeltrace2 printed no %s in a minute:\n%s\nrelayd log:\n%s", want, stderr.String(), r.LogTail(20))
			}
			ts := uint64(1e9 + tick*1e6)
			for cpu := range 2 {
				binary.LittleEndian.PutUint64(p, uint64(tick))
				if err := ch.Write(cpu, ts+uint64(cpu), cls.ID, p); err != nil {
					t.Fatal(err)
				}
			}
			if err := ch.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := s.Live(ts + 500); err != nil {
				t.Fatalf("live tick %d: %v", tick, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	until(a, "ev_a:")
	b, err := ch.AddEventClass("ev_b", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	until(b, "ev_b:")
}

// TestRelaydSlow stalls relayd (SIGSTOP) for less than the sink's timeout
// while the channel writes: the local copy is written as if relayd were
// there, nothing is dropped, and once relayd goes on it catches up with
// every packet; relayd's trace is the local copy, as babeltrace2 reads
// them.
func TestRelaydSlow(t *testing.T) {
	r := testenv.StartRelayd(t)
	local := t.TempDir()
	dir, err := relayfmt.NewDirSink(local)
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, r, "hosts", "slow")
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 4, CPUs: 1}, &Tee{Dir: dir, Remote: s})
	if err != nil {
		t.Fatal(err)
	}
	cls, err := ch.AddEventClass("ev", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 8)
	ts := uint64(1e9)
	write := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			for range 50 {
				ts += 1000
				binary.LittleEndian.PutUint64(p, ts)
				_ = ch.Write(0, ts, cls.ID, p) // drops are counted
			}
			time.Sleep(time.Millisecond)
		}
	}
	write(200 * time.Millisecond)
	r.Pause()
	write(time.Second)
	r.Resume()
	write(200 * time.Millisecond)
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	cs, _ := ch.StatsCPU(0)
	if st := s.Stats(); st.Err != nil || st.NotSent != 0 || cs.Dropped != 0 {
		t.Fatalf("sink %+v, channel dropped %d: want everything sent and nothing dropped while relayd stalled", st, cs.Dropped)
	}
	remote := filepath.Join(r.SessionDir(t, "hosts", "slow"), DomainPath)
	want, err := os.ReadFile(filepath.Join(local, "trace0"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(remote, "trace0")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("relayd's trace0 (%d bytes, %v) is not the local one (%d bytes)", len(got), err, len(want))
	}
	wl, wd := testenv.RunBT2(t, local)
	gl, gd := testenv.RunBT2(t, remote)
	lost := 0
	for _, d := range gd {
		lost += d.Count
	}
	if !slices.Equal(gl, wl) || !slices.Equal(gd, wd) || uint64(lost) != cs.Dropped {
		t.Fatalf("babeltrace2: relayd %d events, %d discarded in %d ranges; local %d events, %d ranges; channel dropped %d", len(gl), lost, len(gd), len(wl), len(wd), cs.Dropped)
	}
}

// TestRelaydHungLocalAtDiskSpeed stops relayd (SIGSTOP) for longer than
// the sink's timeout while the channel writes and flushes: a relayd that
// hangs, neither dead nor answering. The local copy is written as fast
// as without relayd: every write and flush of the stall together take
// less than one timeout, which a local write waiting on relayd would
// take for its first packet alone. relayd falls behind, the sink gives
// up after its timeout and counts what it did not send: sent + not sent
// is every packet of the local copy, which holds every event.
func TestRelaydHungLocalAtDiskSpeed(t *testing.T) {
	r := testenv.StartRelayd(t)
	local := t.TempDir()
	dir, err := relayfmt.NewDirSink(local)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 2 * time.Second
	u, _ := ParseURL(r.URL())
	s, err := NewSink(context.Background(), Config{URL: u, Session: Session{Host: "hh", Name: "hung", Timeout: timeout}, Streams: []string{"trace0"}})
	if err != nil {
		t.Fatal(err)
	}
	tee := &Tee{Dir: dir, Remote: s}
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 4, CPUs: 1}, tee)
	if err != nil {
		t.Fatal(err)
	}
	cls, err := ch.AddEventClass("ev", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 8)
	ts := uint64(1e9)
	written := 0
	// round writes a few packets' worth of events and flushes.
	round := func() {
		for range 1000 {
			ts += 1000
			binary.LittleEndian.PutUint64(p, ts)
			if err := ch.Write(0, ts, cls.ID, p); err != nil {
				t.Fatalf("write while relayd hangs: %v", err)
			}
			written++
		}
		if err := ch.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	round()
	if err := tee.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.Pause()
	t0 := time.Now()
	for range 20 {
		round()
	}
	stalled := time.Since(t0)
	behind := tee.Behind()
	if stalled >= timeout {
		t.Errorf("20 rounds of writes and flushes took %v while relayd hung, at least the sink's timeout %v: local writes waited on relayd", stalled, timeout)
	}
	if behind == 0 {
		t.Errorf("relayd hung, and the Tee says it is behind by no packet")
	}
	// The sink gives up after its timeout; then the senders count the
	// rest at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*timeout)
	defer cancel()
	if err := tee.Sync(ctx); err != nil {
		t.Fatalf("the Tee did not catch up after relayd's timeout: %v", err)
	}
	r.Resume()
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	fi, err := os.Stat(filepath.Join(local, "trace0"))
	if err != nil {
		t.Fatal(err)
	}
	if packets := uint64(fi.Size() / 4096); st.Err == nil || st.NotSent == 0 || st.Sent+st.NotSent != packets {
		t.Fatalf("sink %+v; the local copy has %d packets", st, packets)
	}
	if lines, d := testenv.RunBT2(t, local); len(lines) != written || len(d) != 0 {
		t.Fatalf("local copy: %d events, %d discard notices; want %d and none", len(lines), len(d), written)
	}
	t.Logf("relayd hung: 20 rounds in %v (sink timeout %v), %d packets behind then; %d sent, %d not sent", stalled, timeout, behind, st.Sent, st.NotSent)
}
