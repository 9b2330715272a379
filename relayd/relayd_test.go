package relayd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// writeChannel writes n events per CPU on a 2-CPU channel into sink, adds
// a second event class half way (a metadata update), and closes the
// channel.
func writeChannel(t *testing.T, sink relayfmt.Sink, n int) {
	t.Helper()
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 64, CPUs: 2, Clock: relayfmt.Clock{Offset: 1.7e18}}, sink)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ch.AddEventClass("ev_a", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	var b *relayfmt.EventClass
	p := make([]byte, 8)
	for i := range n {
		if i == n/2 {
			if b, err = ch.AddEventClass("ev_b", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}}); err != nil {
				t.Fatal(err)
			}
		}
		for cpu := range 2 {
			binary.LittleEndian.PutUint64(p, uint64(i*2+cpu))
			id := a.ID
			if b != nil && i%3 == 0 {
				id = b.ID
			}
			if err := ch.Write(cpu, 1e9+uint64(i)*1000+uint64(cpu), id, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
}

func newSink(t *testing.T, r *testenv.Relayd, host, name string) *Sink {
	t.Helper()
	u, err := ParseURL(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSink(context.Background(), Config{URL: u, Session: Session{Host: host, Name: name, Timeout: 5 * time.Second}, Streams: []string{"trace0", "trace1"}})
	if err != nil {
		t.Fatalf("%v\nrelayd log:\n%s", err, r.LogTail(20))
	}
	return s
}

// TestRelaydTrace streams a channel to a real lttng-relayd beside a local
// copy: relayd's files are byte for byte the local ones (relayd writes the
// padding itself), it wrote an index per packet, and babeltrace2 reads the
// same events from both.
func TestRelaydTrace(t *testing.T) {
	r := testenv.StartRelayd(t)
	local := t.TempDir()
	dir, err := relayfmt.NewDirSink(local)
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, r, "hosta", "sess")
	writeChannel(t, &Tee{Dir: dir, Remote: s}, 3000)
	st := s.Stats()
	if st.Err != nil || st.NotSent != 0 || st.Sent == 0 {
		t.Fatalf("sink stats %+v\nrelayd log:\n%s", st, r.LogTail(20))
	}
	remote := filepath.Join(r.SessionDir(t, "hosta", "sess"), DomainPath)
	if want := filepath.Join("hosta", filepath.Base(filepath.Dir(remote))); s.Client().OutputPath != want {
		t.Errorf("relayd said the output path is %q, want %q", s.Client().OutputPath, want)
	}
	var packets uint64
	for _, name := range []string{"metadata", "trace0", "trace1"} {
		want, err := os.ReadFile(filepath.Join(local, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(remote, name))
		if err != nil {
			t.Fatalf("%v\nrelayd log:\n%s", err, r.LogTail(20))
		}
		if name == "metadata" {
			// Sent as metadata packets, each part of it as it grew.
			text, uuid, err := relayfmt.UnpacketizeMetadata(got)
			if err != nil || !bytes.Equal(text, want) {
				t.Errorf("relayd's metadata (%v) holds %d bytes of text, differing from the local %d bytes", err, len(text), len(want))
			}
			if m, err := relayfmt.ParseMetadata(want); err != nil || m.UUID != uuid {
				t.Errorf("metadata packets carry uuid %x, the trace's is not that (%v)", uuid, err)
			}
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: relayd wrote %d bytes, differing from the local %d bytes", name, len(got), len(want))
		}
		packets += uint64(len(want) / 4096)
		// CTF index (lttng-tools' ctf-index.h): a 16-byte big-endian
		// header (magic, major, minor, entry length) then one entry per
		// packet, 72 bytes in index 1.1.
		idx, err := os.ReadFile(filepath.Join(remote, "index", name+".idx"))
		if err != nil {
			t.Fatal(err)
		}
		if len(idx) < 16 || binary.BigEndian.Uint32(idx) != 0xC1F1DCC1 {
			t.Fatalf("%s: index of %d bytes without the CTF index magic", name, len(idx))
		}
		entry := int(binary.BigEndian.Uint32(idx[12:]))
		if entry < 56 || (len(idx)-16)%entry != 0 {
			t.Fatalf("%s: index entries of %d bytes do not divide its %d bytes", name, entry, len(idx)-16)
		}
		if n := (len(idx) - 16) / entry; n != len(want)/4096 {
			t.Errorf("%s: index holds %d entries for %d packets", name, n, len(want)/4096)
		}
	}
	if packets != st.Sent {
		t.Errorf("sink sent %d packets, the files hold %d", st.Sent, packets)
	}
	want, _ := testenv.RunBT2(t, local)
	got, _ := testenv.RunBT2(t, remote)
	if len(want) != 6000 {
		t.Fatalf("babeltrace2 read %d events locally, want 6000", len(want))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("babeltrace2 read %d events from relayd's trace, %d from the local one", len(got), len(want))
	}
}

// TestRelaydHosts streams two sessions with different host names to one
// relayd at once: each lands in its own directory with its own events.
func TestRelaydHosts(t *testing.T) {
	r := testenv.StartRelayd(t)
	sa := newSink(t, r, "hosta", "fleet")
	sb := newSink(t, r, "hostb", "fleet")
	done := make(chan struct{})
	go func() {
		defer close(done)
		writeChannel(t, sa, 500)
	}()
	writeChannel(t, sb, 1500)
	<-done
	for host, n := range map[string]int{"hosta": 1000, "hostb": 3000} {
		lines, _ := testenv.RunBT2(t, filepath.Join(r.SessionDir(t, host, "fleet"), DomainPath))
		if len(lines) != n {
			t.Errorf("%s: babeltrace2 read %d events, want %d", host, len(lines), n)
		}
	}
}

// TestRelaydUnreachable: no relayd at the address is an error at once,
// naming the address.
func TestRelaydUnreachable(t *testing.T) {
	r := testenv.StartRelayd(t)
	r.Stop()
	u, _ := ParseURL(r.URL())
	_, err := NewSink(context.Background(), Config{URL: u, Session: Session{Host: "h", Name: "s", Timeout: time.Second}})
	if err == nil || !strings.Contains(err.Error(), u.String()) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("NewSink with relayd stopped: %v", err)
	}
}

// TestRelaydKilled kills relayd mid-stream: the local copy gets every
// packet, the sink counts every packet relayd did not confirm, and
// together they account for all of them.
func TestRelaydKilled(t *testing.T) {
	r := testenv.StartRelayd(t)
	local := t.TempDir()
	dir, err := relayfmt.NewDirSink(local)
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, r, "hosta", "crash")
	k := &killAfter{Sink: s, n: 6, kill: r.Kill}
	writeChannel(t, &Tee{Dir: dir, Remote: k}, 3000)
	st := s.Stats()
	if st.Err == nil || st.NotSent == 0 {
		t.Fatalf("stats after relayd was killed: %+v", st)
	}
	var packets uint64
	for _, name := range []string{"trace0", "trace1"} {
		fi, err := os.Stat(filepath.Join(local, name))
		if err != nil {
			t.Fatal(err)
		}
		packets += uint64(fi.Size() / 4096)
	}
	if st.Sent+st.NotSent != packets {
		t.Fatalf("sent %d + not sent %d != %d packets written locally", st.Sent, st.NotSent, packets)
	}
	// Every packet relayd confirmed is in its files; those in flight
	// when it died may be there too, unconfirmed.
	var held uint64
	dirs, _ := filepath.Glob(filepath.Join(r.Out, "hosta", "crash*", "kernel"))
	for _, d := range dirs {
		for _, name := range []string{"trace0", "trace1"} {
			if fi, err := os.Stat(filepath.Join(d, name)); err == nil {
				held += uint64(fi.Size() / 4096)
			}
		}
	}
	t.Logf("relayd confirmed %d packets, holds %d in %v", st.Sent, held, dirs)
	if len(dirs) != 1 || st.Sent > 6 || held < st.Sent || held > 6 {
		t.Fatalf("relayd confirmed %d packets and holds %d in %v: want confirmed ≤ held ≤ 6 (it was killed at the 7th)", st.Sent, held, dirs)
	}
	if lines, _ := testenv.RunBT2(t, local); len(lines) != 6000 {
		t.Fatalf("local copy: %d events, want 6000", len(lines))
	}
	if !errors.Is(k.lastErr, ErrNotSent) {
		t.Fatalf("a packet after the kill: error %v, want ErrNotSent", k.lastErr)
	}
}

// killAfter kills relayd once n packets went through.
type killAfter struct {
	*Sink
	n       int
	kill    func()
	mu      sync.Mutex
	lastErr error
}

func (k *killAfter) WritePacket(name string, p []byte) error {
	k.mu.Lock()
	if k.n == 0 {
		k.kill()
	}
	k.n--
	k.mu.Unlock()
	err := k.Sink.WritePacket(name, p)
	if err != nil {
		k.mu.Lock()
		k.lastErr = err
		k.mu.Unlock()
	}
	return err
}

// TestRelaydReconnect kills relayd mid-stream and starts it again: the
// sink counts what relayd missed, Reconnect fails while relayd is down
// and then creates the session again in a directory of its own, where the
// rest of the packets go; sent + not sent = the local copy's packets.
func TestRelaydReconnect(t *testing.T) {
	r := testenv.StartRelayd(t)
	local := t.TempDir()
	dir, err := relayfmt.NewDirSink(local)
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, r, "hostr", "again")
	tee := &Tee{Dir: dir, Remote: s}
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 64, CPUs: 2}, tee)
	if err != nil {
		t.Fatal(err)
	}
	cls, err := ch.AddEventClass("ev", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 8)
	ts := uint64(1e9)
	write := func(n int) {
		for range n {
			for cpu := range 2 {
				ts += 100
				binary.LittleEndian.PutUint64(p, ts)
				if err := ch.Write(cpu, ts, cls.ID, p); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := ch.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	write(1000)
	// The Tee sends from goroutines of its own, and the sink does not
	// wait for relayd's replies to each index: relayd has the metadata
	// and packets of both streams in its files before it dies.
	if err := tee.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := filepath.Join(r.SessionDir(t, "hostr", "again"), DomainPath)
	waitFor(t, 10*time.Second, func() bool {
		for _, f := range []string{"metadata", "trace0", "trace1"} {
			if fi, err := os.Stat(filepath.Join(first, f)); err != nil || fi.Size() == 0 {
				return false
			}
		}
		return true
	})
	r.Kill()
	write(1000)
	if err := tee.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Err == nil || st.NotSent == 0 {
		t.Fatalf("after the kill: %+v", st)
	}
	if err := s.Reconnect(context.Background()); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Reconnect with relayd down: %v", err)
	}
	r.Restart(t)
	if err := s.Reconnect(context.Background()); err != nil {
		t.Fatalf("Reconnect: %v\n%s", err, r.LogTail(20))
	}
	// A class defined after the reconnection reaches relayd too.
	cls2, err := ch.AddEventClass("ev2", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	cls = cls2
	write(1000)
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Err != nil || st.Reconnects != 1 {
		t.Fatalf("stats %+v", st)
	}
	var packets uint64
	for _, name := range []string{"trace0", "trace1"} {
		fi, err := os.Stat(filepath.Join(local, name))
		if err != nil {
			t.Fatal(err)
		}
		packets += uint64(fi.Size() / 4096)
	}
	if st.Sent+st.NotSent != packets {
		t.Fatalf("sent %d + not sent %d != %d local packets", st.Sent, st.NotSent, packets)
	}
	dirs, _ := filepath.Glob(filepath.Join(r.Out, "hostr", "again-*"))
	if len(dirs) != 2 {
		t.Fatalf("relayd session directories: %q, want the first and the reconnected one", dirs)
	}
	var total int
	for _, d := range dirs {
		if !strings.HasSuffix(d, "-1") {
			// relayd was killed (SIGKILL) in the first session, maybe in
			// the middle of writing a packet: cut its files back to whole
			// packets, as kconsume recover does after a crash.
			if _, err := relayfmt.Recover(filepath.Join(d, DomainPath)); err != nil {
				t.Fatalf("recovering the killed session %s: %v", d, err)
			}
		}
		lines, _ := testenv.RunBT2(t, filepath.Join(d, DomainPath))
		total += len(lines)
		if strings.HasSuffix(d, "-1") && (len(lines) < 2000 || !strings.Contains(strings.Join(lines, "\n"), "ev2")) {
			t.Errorf("reconnected session %s: %d events", d, len(lines))
		}
	}
	if total >= 6000 || total < 2000 {
		t.Fatalf("relayd holds %d events of 6000 in its two sessions", total)
	}
}

// TestRelaydIndexRefusedLater sends indexes without waiting for relayd's
// replies (SendIndex), then one for a stream relayd does not know: the
// refusal is not lost, it fails the next command that reads a reply.
func TestRelaydIndexRefusedLater(t *testing.T) {
	r := testenv.StartRelayd(t)
	u, err := ParseURL(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(context.Background(), u, Session{Host: "h", Name: "refused", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("%v\nrelayd log:\n%s", err, r.LogTail(20))
	}
	defer c.Close()
	h, err := c.AddStream("trace0", DomainPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StreamsSent(); err != nil {
		t.Fatal(err)
	}
	if err := c.SendIndex(&Index{Stream: h + 1000, Seq: 0}); err != nil {
		t.Fatalf("SendIndex waited for the refusal: %v", err)
	}
	_, err = c.DataPending(h, 0)
	t.Logf("data pending: %v", err)
	if err == nil || !strings.Contains(err.Error(), "send index") {
		t.Fatalf("data pending after a refused index: %v, want the index's refusal", err)
	}
}

// TestRelaydRotate rotates a channel streamed to a real lttng-relayd
// twice, CPU 1's stream writing nothing before the first rotation:
// relayd archives three chunks, as LTTng's rotations leave them
// (archives/BEGIN-END-ID/kernel), each a trace babeltrace2 and our
// reader (which checks every packet's UUID) read alone, and their
// events add up to those written, each once.
func TestRelaydRotate(t *testing.T) {
	r := testenv.StartRelayd(t)
	s := newSink(t, r, "hosta", "rotate")
	ch, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 64, CPUs: 2, Clock: relayfmt.Clock{Offset: 1.7e18}}, s)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ch.AddEventClass("ev_a", []relayfmt.Field{{Name: "value", Kind: relayfmt.Scalar, Elem: relayfmt.U64}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000 // per CPU, about 9 packets each
	p := make([]byte, 8)
	for i := range n {
		if i == n/3 || i == 2*n/3 {
			if _, err := ch.Rotate(1e9 + uint64(i)*1000); err != nil {
				t.Fatalf("rotate at event %d: %v\nrelayd log:\n%s", i, err, r.LogTail(20))
			}
		}
		for cpu := range 2 {
			if cpu == 1 && i < n/3 {
				continue
			}
			binary.LittleEndian.PutUint64(p, uint64(i*2+cpu))
			if err := ch.Write(cpu, 1e9+uint64(i)*1000+uint64(cpu), a.ID, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := ch.Close(); err != nil {
		t.Fatalf("%v\nrelayd log:\n%s", err, r.LogTail(20))
	}
	written := 2*n - n/3
	if st := s.Stats(); st.Err != nil || st.NotSent != 0 {
		t.Fatalf("sink: %+v", st)
	}
	sess := r.SessionDir(t, "hosta", "rotate")
	var chunks []string
	// relayd moves a chunk once its last stream leaves it, after Close
	// returned.
	deadline := time.Now().Add(10 * time.Second)
	for {
		chunks, _ = filepath.Glob(filepath.Join(sess, "archives", "*", DomainPath))
		if len(chunks) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(chunks) != 3 {
		var all []string
		_ = filepath.WalkDir(sess, func(p string, _ os.DirEntry, _ error) error { all = append(all, p); return nil })
		t.Fatalf("relayd's archives: %q, want 3 chunks; session holds %q\nrelayd log:\n%s", chunks, all, r.LogTail(30))
	}
	seen := map[string]int{}
	for _, c := range chunks {
		ours, err := traceEvents(c)
		if err != nil {
			t.Errorf("chunk %s, our reader: %v", c, err)
		}
		lines, discards := testenv.RunBT2(t, c)
		if ours != len(lines) {
			t.Errorf("chunk %s: our reader read %d events, babeltrace2 %d", c, ours, len(lines))
		}
		if len(discards) != 0 {
			t.Errorf("chunk %s: discarded %v", c, discards)
		}
		t.Logf("chunk %s: %d events", filepath.Base(filepath.Dir(c)), len(lines))
		if len(lines) == 0 {
			t.Errorf("chunk %s holds no event", c)
		}
		for _, l := range lines {
			i := strings.Index(l, "value = ")
			if i < 0 {
				t.Fatalf("chunk %s: %q", c, l)
			}
			seen[l[i:]]++
		}
	}
	if len(seen) != written {
		t.Fatalf("the chunks hold %d distinct events, want %d", len(seen), written)
	}
	for v, k := range seen {
		if k != 1 {
			t.Fatalf("event %q in %d chunks", v, k)
		}
	}
}

// waitFor polls cond until it holds, failing t after limit.
func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still not so after %v", limit)
		}
	}
}

// traceEvents returns the events our reader reads in the trace in dir.
func traceEvents(dir string) (int, error) {
	tr, err := relayfmt.Open(dir)
	if err != nil {
		return 0, err
	}
	n, err := tr.Events()
	return int(n), err
}
