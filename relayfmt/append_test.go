package relayfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestAppendAfterRecover: a stream cut mid-packet, recovered, then given
// back the packet it lost as a producer left it (only its times and
// content size set) and an empty packet counting events lost, as
// kconsume recover does for a killed recording; and a stream that had no
// file gets one that counts its losses. babeltrace2 and our reader agree
// on the result, every event of the packet is back, and the losses are
// where they were appended.
func TestAppendAfterRecover(t *testing.T) {
	const sub = 4096
	g := newGen(t, Config{SubbufSize: sub, NSubbufs: 64, CPUs: 2, Mode: Overwrite}, nil)
	g.defineClasses(7)
	g.burst(1500, 0)
	g.close()
	path := filepath.Join(g.dir, "trace1")
	whole, err := os.ReadFile(path)
	if err != nil || len(whole) < 6*sub {
		t.Fatalf("trace1: %d bytes, %v; want 6 packets at least", len(whole), err)
	}
	orig, _ := readAll(t, g.dir)
	lostPkt := bytes.Clone(whole[5*sub : 6*sub])
	inPkt := packetEvents(t, g.dir, lostPkt)
	if inPkt == 0 {
		t.Fatal("the packet the cut loses holds no event")
	}
	truncate(t, path, 5*sub+1000)
	if _, err := Recover(g.dir); err != nil {
		t.Fatal(err)
	}
	tr, err := Open(g.dir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := OpenAppender(tr, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A packet that begins before the stream's end is refused whole.
	early := bytes.Clone(whole[4*sub : 5*sub])
	if err := a.Packet(early, 1); !errors.Is(err, ErrBadPacket) {
		t.Errorf("a packet from before the stream's end: %v, want ErrBadPacket", err)
	}
	// What a producer leaves: the channel's header fields are not yet
	// written.
	for _, off := range []int{offMagic, offStreamInstanceID, offPacketSeqNum, offEventsDiscarded} {
		binary.LittleEndian.PutUint32(lostPkt[off:], 0)
	}
	if err := a.Packet(lostPkt, uint64(inPkt)); err != nil {
		t.Fatal(err)
	}
	if err := a.Discarded(17); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	fresh, err := OpenAppender(tr, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Discarded(5); err != nil {
		t.Fatal(err)
	}
	if err := fresh.Close(); err != nil {
		t.Fatal(err)
	}
	tr, _ = Open(g.dir)
	agree(t, g.dir)
	got, notices := readAll(t, g.dir)
	if want := packetEvents(t, g.dir, whole[:6*sub]); len(got[1]) != want || want > len(orig[1]) {
		t.Errorf("trace1 holds %d events, want %d (every event of its first six packets)", len(got[1]), want)
	}
	var counts []string
	for _, n := range notices {
		counts = append(counts, n.Stream+":"+strconv.FormatUint(n.Count, 10))
	}
	if s := strings.Join(counts, " "); s != "trace1:17 trace3:5" && s != "trace3:5 trace1:17" {
		t.Errorf("discard notices %q, want 17 at trace1's end and 5 in trace3", s)
	}
	for _, n := range []int{1, 3} {
		st, err := TallyStream(tr, StreamFile(n, false))
		if err != nil {
			t.Fatal(err)
		}
		if want := map[int]uint64{1: 17, 3: 5}[n]; st.Discarded != want {
			t.Errorf("trace%d: tally says %d discarded, want %d", n, st.Discarded, want)
		}
	}
}

// packetEvents returns the events in pkt, packets of trace1 of the trace
// in dir.
func packetEvents(t *testing.T, dir string, pkt []byte) int {
	t.Helper()
	tr, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStreamReader(tr.Meta, "trace1", bytes.NewReader(pkt), int64(len(pkt)))
	n := 0
	for s.Next() {
		if s.Item().Kind == EventItem {
			n++
		}
	}
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
	return n
}
