package chunks

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// chunkCounts is what one closed chunk holds, as relayfmt and
// babeltrace2 each read it.
type chunkCounts struct {
	events, discarded uint64
	uuid              [16]byte
}

// readChunk reads the trace in dir alone with relayfmt's reader and with
// babeltrace2, fails t when the two disagree or babeltrace2 reports a
// loss it cannot count, and returns the counts.
func readChunk(t *testing.T, dir string) chunkCounts {
	t.Helper()
	tr, err := relayfmt.Open(dir)
	if err != nil {
		t.Fatalf("chunk %s: %v", dir, err)
	}
	var c chunkCounts
	c.uuid = tr.Meta.UUID
	for _, name := range tr.Streams {
		st, err := relayfmt.TallyStream(tr, name)
		if err != nil {
			t.Fatalf("chunk %s: %v", dir, err)
		}
		c.events += st.Events
		c.discarded += st.Discarded
		if st.Packets > 0 && st.Last.UUID != tr.Meta.UUID {
			t.Errorf("chunk %s stream %s: packets of UUID %x in a trace of %x", dir, name, st.Last.UUID, tr.Meta.UUID)
		}
		// A new stream: numbered from 1, or from 0 behind an empty
		// packet that counts no loss.
		if uint64(st.Packets) != st.Last.SeqNum && uint64(st.Packets) != st.Last.SeqNum+1 {
			t.Errorf("chunk %s stream %s: %d packets, the last numbered %d", dir, name, st.Packets, st.Last.SeqNum)
		}
	}
	if _, err := exec.LookPath("babeltrace2"); err != nil && !testenv.Strict() {
		return c
	}
	lines, discards := testenv.RunBT2(t, dir)
	var lost uint64
	for _, d := range discards {
		if d.Kind != "events" {
			t.Errorf("chunk %s: babeltrace2 reports %d discarded %s", dir, d.Count, d.Kind)
		}
		lost += uint64(d.Count)
	}
	if uint64(len(lines)) != c.events || lost != c.discarded {
		t.Errorf("chunk %s: babeltrace2 reads %d events and %d discarded, relayfmt %d and %d", dir, len(lines), lost, c.events, c.discarded)
	}
	out, _ := exec.Command(testenv.BT2(t), dir).CombinedOutput()
	if strings.Contains(string(out), "may have discarded") {
		t.Errorf("chunk %s: babeltrace2 reports an uncounted loss:\n%s", dir, out)
	}
	return c
}

// closedChunks returns the closed chunks' directories under root, oldest
// first (their names sort by time, and a test's chunks by index within
// one second).
func closedChunks(t *testing.T, root string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(root, ArchivesDir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, filepath.Join(root, ArchivesDir, e.Name()))
		}
	}
	return out
}

// recordChunks writes events of two CPUs into a channel over s, with
// losses before and right after each rotation, rotating every rotate
// events, and returns the events and losses written.
func recordChunks(t *testing.T, s relayfmt.Sink, n, rotate int) (events, lost uint64) {
	t.Helper()
	c, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 4096, NSubbufs: 4, CPUs: 2}, s)
	if err != nil {
		t.Fatal(err)
	}
	cls, err := c.AddEventClass("rec", []relayfmt.Field{relayfmt.ScalarField("n", relayfmt.U64)})
	if err != nil {
		t.Fatal(err)
	}
	c.Begin(1000)
	payload := make([]byte, 8)
	ts := uint64(2000)
	for i := range n {
		cpu := i % 2
		if i%3 == 0 {
			cpu = 0 // CPU 0 busier: the streams end the chunks apart
		}
		binary.LittleEndian.PutUint64(payload, uint64(i))
		ts += 1000
		if err := c.Write(cpu, ts, cls.ID, payload); err != nil {
			t.Fatal(err)
		}
		events++
		switch i % rotate {
		case rotate / 2:
			_ = c.Discard(1, 2)
			lost += 2
		case rotate - 1:
			_ = c.Discard(0, 1)
			lost++
			if _, err := c.Rotate(ts + 10); err != nil {
				t.Fatal(err)
			}
			// Losses right at the boundary belong to the next chunk.
			_ = c.Discard(1, 3)
			lost += 3
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	return events, lost
}

// Every closed chunk reads alone, in relayfmt and babeltrace2, under a
// UUID of its own, and the chunks' events and losses add up to those
// written: none lost or counted twice at a boundary.
func TestChunksAddUp(t *testing.T) {
	root := t.TempDir()
	s, err := New(Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	events, lost := recordChunks(t, s, 3000, 700)
	dirs := closedChunks(t, root)
	if len(dirs) != 5 {
		t.Fatalf("%d closed chunks, want 5 (4 rotations and the last): %v", len(dirs), dirs)
	}
	var got chunkCounts
	uuids := map[[16]byte]bool{}
	for _, d := range dirs {
		c := readChunk(t, d)
		got.events += c.events
		got.discarded += c.discarded
		uuids[c.uuid] = true
	}
	if got.events != events || got.discarded != lost {
		t.Errorf("chunks hold %d events and %d discarded, %d and %d were written", got.events, got.discarded, events, lost)
	}
	if len(uuids) != len(dirs) {
		t.Errorf("%d UUIDs for %d chunks", len(uuids), len(dirs))
	}
	if _, err := os.Stat(filepath.Join(root, relayfmt.MetadataFile)); !os.IsNotExist(err) {
		t.Errorf("a rotated trace's last chunk stays in place: %v", err)
	}
	st := s.Stats()
	if st.Closed != 5 || st.Kept != 5 || st.Deleted != 0 {
		t.Errorf("stats %+v, want 5 closed and kept", st)
	}
}

// Under a budget of chunks the oldest closed ones go first, and what
// they held is counted: the kept chunks and the deleted counts add up to
// what was written.
func TestChunksBudget(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "kernel"), 0o750); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Root: root, Trace: "kernel", MaxChunks: 3})
	if err != nil {
		t.Fatal(err)
	}
	events, lost := recordChunks(t, s, 3800, 500)
	dirs := closedChunks(t, root)
	if len(dirs) != 3 {
		t.Fatalf("%d closed chunks kept, want 3: %v", len(dirs), dirs)
	}
	if !strings.HasSuffix(dirs[2], "-7") {
		t.Errorf("newest kept chunk %s, want index 7", dirs[2])
	}
	var got chunkCounts
	for _, d := range dirs {
		c := readChunk(t, filepath.Join(d, "kernel"))
		got.events += c.events
		got.discarded += c.discarded
	}
	st := s.Stats()
	if st.Deleted != 5 || st.Kept != 3 {
		t.Errorf("stats %+v: want 5 deleted, 3 kept", st)
	}
	if got.events+st.DeletedEvents != events || got.discarded+st.DeletedDiscarded != lost {
		t.Errorf("kept chunks hold %d events and %d discarded, deleted ones %d and %d: %d and %d were written",
			got.events, got.discarded, st.DeletedEvents, st.DeletedDiscarded, events, lost)
	}
	if st.DeletedBytes == 0 {
		t.Errorf("deleted chunks of 0 bytes")
	}
}

// A budget that keeps no closed chunk is refused.
func TestChunksBadBudget(t *testing.T) {
	for _, cfg := range []Config{{MaxChunks: 1}, {MaxChunks: -1}, {MaxSize: 1 << 20, ChunkSize: 1 << 20}} {
		cfg.Root = t.TempDir()
		if _, err := New(cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}
