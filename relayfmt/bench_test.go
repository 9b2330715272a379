package relayfmt

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
)

// BenchmarkWrite measures Channel.Write. "flight" is the writer alone:
// Overwrite mode in a ring that stays in L2, where no sink is waited for and
// nothing is dropped. "stream" adds the hand-off to a sink goroutine that
// discards packets, "disk" a DirSink; both report the records accepted per
// second and the share dropped.
func BenchmarkWrite(b *testing.B) {
	for _, size := range []int{64, 256} {
		b.Run(fmt.Sprintf("flight/%dB", size), func(b *testing.B) {
			benchWrite(b, size, Config{SubbufSize: 64 << 10, NSubbufs: 8, CPUs: 1, Mode: Overwrite}, &DiscardSink{})
		})
	}
	b.Run("stream/64B", func(b *testing.B) {
		benchWrite(b, 64, Config{SubbufSize: 1 << 20, NSubbufs: 16, CPUs: 1}, &DiscardSink{})
	})
	b.Run("disk/64B", func(b *testing.B) {
		s, err := NewDirSink(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		benchWrite(b, 64, Config{SubbufSize: 1 << 20, NSubbufs: 16, CPUs: 1}, s)
	})
}

func benchWrite(b *testing.B, size int, cfg Config, sink Sink) {
	c, err := NewChannel(cfg, sink)
	if err != nil {
		b.Fatal(err)
	}
	cls, err := c.AddEventClass("rec", []Field{ArrayField("data", U8, size)})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, size)
	b.SetBytes(int64(size + CompactHeaderSize))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	ts := uint64(1)
	for range b.N {
		_ = c.Write(0, ts, cls.ID, payload) // drops are counted below
		ts += 7
	}
	el := time.Since(start)
	b.StopTimer()
	st, _ := c.StatsCPU(0)
	if cfg.Mode == Overwrite {
		c.Reset() // the benchmark measures writing, not the final snapshot
	}
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(st.Records)/el.Seconds()/1e6, "Mrec/s")
	b.ReportMetric(float64(st.Records)*float64(size+CompactHeaderSize)/el.Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(st.Dropped)/float64(b.N), "dropped/op")
}

var (
	benchMu     sync.Mutex
	benchRoot   string
	benchTraces = map[string][2]int{} // dir → streams, events
)

// TestMain removes the benchmark traces, which outlive single benchmarks.
func TestMain(m *testing.M) {
	code := m.Run()
	if benchRoot != "" {
		os.RemoveAll(benchRoot)
	}
	testenv.RemoveBin()
	os.Exit(code)
}

// benchTrace writes, once per process, a trace of n events over the given
// number of per-CPU streams, with no losses.
func benchTrace(b *testing.B, streams, n int) (dir string, events int) {
	benchMu.Lock()
	defer benchMu.Unlock()
	var err error
	if benchRoot == "" {
		if benchRoot, err = os.MkdirTemp("", "kconsume-bench"); err != nil {
			b.Fatal(err)
		}
	}
	dir = filepath.Join(benchRoot, fmt.Sprintf("s%d-n%d", streams, n))
	if v, ok := benchTraces[dir]; ok {
		return dir, v[1]
	}
	if err := os.Mkdir(dir, 0o750); err != nil {
		b.Fatal(err)
	}
	g := newGenIn(b, dir, Config{SubbufSize: 1 << 20, NSubbufs: 64, CPUs: streams}, nil)
	g.defineClasses(12)
	for i := range n {
		for g.write(i%streams, uint64(1+i%97)) == ErrDropped {
			time.Sleep(time.Millisecond) // let the sink catch up: no losses
		}
	}
	g.close()
	benchTraces[dir] = [2]int{streams, len(g.written)}
	return dir, len(g.written)
}

// readTrace decodes every field of every event of dir, merged by time.
func readTrace(b *testing.B, dir string) int {
	_, m := openMerged(b, dir)
	defer m.Close() // now, not at the end of the benchmark
	var err error
	var vals []Value
	n := 0
	for m.Next() {
		if it := m.Item(); it.Kind == EventItem {
			if vals, err = it.Fields(vals); err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	if err := m.Err(); err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkReadMerge measures decode and merge of every event and field.
func BenchmarkReadMerge(b *testing.B) {
	for _, streams := range []int{2, 8} {
		b.Run(fmt.Sprintf("%dstreams", streams), func(b *testing.B) {
			dir, events := benchTrace(b, streams, 1_000_000)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if n := readTrace(b, dir); n != events {
					b.Fatalf("read %d events, wrote %d", n, events)
				}
			}
			b.ReportMetric(float64(events*b.N)/time.Since(start).Seconds()/1e6, "Mev/s")
		})
	}
}

// BenchmarkVsBabeltrace2 times our reader (decode and merge of every
// field) and babeltrace2 on the same trace in alternation, and reports the
// median of the per-pair ratios, which survives a noisy machine better
// than separate benchmarks. "text" is babeltrace2's default text output to
// /dev/null; "decode" is babeltrace2 into sink.utils.dummy, which decodes
// without formatting.
func BenchmarkVsBabeltrace2(b *testing.B) {
	for _, mode := range []string{"text", "decode", "report"} {
		b.Run(mode, func(b *testing.B) { benchVsBT2(b, mode) })
	}
}

func benchVsBT2(b *testing.B, mode string) {
	bt2 := testenv.BT2(b)
	dir, events := benchTrace(b, 2, 200_000)
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer devnull.Close()
	var report string
	if mode == "report" {
		report = testenv.KconsumeBin(b)
	}
	var ratios, ours, theirs []float64
	for range b.N {
		t0 := time.Now()
		if mode == "report" {
			// The command as users run it: text out, like babeltrace2's.
			cmd := exec.Command(report, "report", dir)
			var stderr strings.Builder
			cmd.Stdout, cmd.Stderr = devnull, &stderr
			if err := cmd.Run(); err != nil {
				b.Fatalf("kconsume report: %v\n%s", err, stderr.String())
			}
		} else {
			readTrace(b, dir)
		}
		a := time.Since(t0).Seconds()
		t1 := time.Now()
		cmd := exec.Command(bt2, dir)
		if mode == "decode" {
			cmd.Args = append(cmd.Args, "-c", "sink.utils.dummy")
		}
		var stderr strings.Builder
		cmd.Stdout, cmd.Stderr = devnull, &stderr
		if err := cmd.Run(); err != nil {
			b.Fatalf("babeltrace2: %v\n%s", err, stderr.String())
		}
		t := time.Since(t1).Seconds()
		ours, theirs = append(ours, float64(events)/a), append(theirs, float64(events)/t)
		ratios = append(ratios, t/a)
	}
	b.ReportMetric(median(ours)/1e6, "ours-Mev/s")
	b.ReportMetric(median(theirs)/1e6, "bt2-Mev/s")
	b.ReportMetric(median(ratios), "x-bt2")
	b.ReportMetric(slices.Min(ratios), "x-bt2-min")
	b.ReportMetric(slices.Max(ratios), "x-bt2-max")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
