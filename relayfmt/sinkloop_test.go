package relayfmt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// failSink fails every packet write after the first n, like a disk that
// fills up.
type failSink struct {
	Sink
	mu    sync.Mutex
	n     int
	local bool
}

// Local reports whether the channel is to write to f from its writer.
func (f *failSink) Local() bool { return f.local }

func (f *failSink) WritePacket(name string, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return errors.New("no space left on device")
	}
	f.n--
	return f.Sink.WritePacket(name, p)
}

func TestSinkFailureLeavesWholeFiles(t *testing.T) {
	for _, local := range []bool{true, false} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) { sinkFailure(t, local) })
	}
}

// sinkFailure checks that a sink failing at its fourth packet, local
// (written by the writer) or not, leaves the three before it whole.
func sinkFailure(t *testing.T, local bool) {
	var fs *failSink
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1}, func(s Sink) Sink {
		fs = &failSink{Sink: s, n: 3, local: local}
		return fs
	})
	if g.c.bufs[0].inline != local {
		t.Fatalf("inline writes %v with a sink that says local %v", g.c.bufs[0].inline, local)
	}
	g.defineClasses(3)
	select {
	case <-g.c.Failed():
		t.Fatal("Failed is closed before any failure")
	default:
	}
	// Flush after every few events, so every packet reaches the sink
	// whatever the scheduling, until the sink's fourth write fails.
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		g.burst(30, 0)
		err = g.c.Flush()
	}
	if err == nil || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("flush after a failed write: %v", err)
	}
	if g.c.Err() == nil {
		t.Fatal("Err() is nil after a sink failure")
	}
	select {
	case <-g.c.Failed():
	default:
		t.Fatal("Failed is not closed after a sink failure")
	}
	if err := g.c.Close(); err == nil {
		t.Fatal("close hid the sink failure")
	}
	fi, err := os.Stat(filepath.Join(g.dir, "trace0"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 3*4096 {
		t.Fatalf("trace0 is %d bytes, want the 3 whole packets written", fi.Size())
	}
	agree(t, g.dir)
}

// TestLocalSinkWrittenByWriter checks that a NoOverwrite channel on a
// local sink leaves finished sub-buffers to the writer's Commit, with no
// goroutine between: the file holds them when Commit returns, and not
// before. A writer that never commits loses nothing: a sub-buffer it
// needs the room of is written then.
func TestLocalSinkWrittenByWriter(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1}, nil)
	g.defineClasses(1)
	b := g.c.bufs[0]
	size := func() int64 {
		fi, err := os.Stat(filepath.Join(g.dir, "trace0"))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	for i := 0; b.produced.Load() == 0; i++ {
		if i > 10000 {
			t.Fatal("no sub-buffer finished after 10000 events")
		}
		if err := g.write(0, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := size(); n != 0 {
		t.Fatalf("trace0 holds %d bytes before Commit, want 0", n)
	}
	g.c.Commit()
	if n := size(); n != 4096 {
		t.Fatalf("trace0 holds %d bytes after Commit, want the 4096 of the finished sub-buffer", n)
	}
	// Twenty sub-buffers' worth through two, without a Commit.
	for b.produced.Load() < 21 {
		if err := g.write(0, 1); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := g.c.StatsCPU(0); st.Dropped != 0 || st.Written < 19 {
		t.Fatalf("without Commit: %d records dropped, %d packets written of 21 finished; want none dropped, at least 19 written", st.Dropped, st.Written)
	}
	g.close()
	if n, want := size(), int64(4096*b.produced.Load()); n != want {
		t.Fatalf("trace0 holds %d bytes after Close, want %d", n, want)
	}
	agree(t, g.dir)
}

// finalFailSink is a failSink whose inner DirSink takes the last packet
// of a failed stream (FinalSink), as on a full disk its reserve does.
type finalFailSink struct {
	*failSink
	dir *DirSink
}

func (f *finalFailSink) WriteFinal(name string, packets ...[]byte) error {
	return f.dir.WriteFinal(name, packets...)
}

func (f *finalFailSink) Reserve(names []string, size int) error { return f.dir.Reserve(names, size) }

// TestSinkFailureCountsUnwritten fails the sink at its fourth packet
// while records keep coming: every record Write took is then in the
// trace or among the events the trace reports discarded, whether the
// writer or a goroutine wrote the packets, and the stats count the ones
// the sink never took as Unwritten, not as Records.
func TestSinkFailureCountsUnwritten(t *testing.T) {
	for _, local := range []bool{true, false} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) {
			g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 4, CPUs: 2}, func(s Sink) Sink {
				return &finalFailSink{failSink: &failSink{Sink: s, n: 3, local: local}, dir: s.(*DirSink)}
			})
			g.defineClasses(3)
			calls := 0
			for i := 0; i < 2000; i++ {
				_ = g.write(i%2, uint64(1+i%7))
				calls++
				if i%50 == 0 {
					g.c.Commit()
				}
			}
			// Counted after Close: with a goroutine writing, the sink
			// may not have failed yet when the writes end (a slow
			// guest).
			if err := g.c.Close(); err == nil || !strings.Contains(err.Error(), "no space") {
				t.Fatalf("close: %v, want the sink's failure", err)
			}
			var after, unwritten, discarded uint64
			for cpu := range 2 {
				st, err := g.c.StatsCPU(cpu)
				if err != nil {
					t.Fatal(err)
				}
				after += st.Records
				unwritten += st.Unwritten
				discarded += st.Discarded()
			}
			lines, notices := runBT2(t, g.dir)
			agree(t, g.dir)
			lost := 0
			for _, n := range notices {
				var c int
				var kind string
				fmt.Sscan(n, &c, &kind)
				if kind != "events" {
					t.Fatalf("babeltrace2: %s: packets lost without a count", n)
				}
				lost += c
			}
			if len(lines)+lost != calls {
				t.Fatalf("%d events and %d discarded in the trace, of %d written (%d lost without a count)", len(lines), lost, calls, calls-len(lines)-lost)
			}
			if uint64(len(lines)) != after || unwritten == 0 || after+discarded != uint64(calls) {
				t.Fatalf("stats: %d records at the end, %d unwritten, %d discarded; the trace holds %d of %d", after, unwritten, discarded, len(lines), calls)
			}
		})
	}
}
