package relayd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// BenchmarkStream writes 64-byte records at full speed into a channel of
// 16 × 1 MiB sub-buffers whose packets go to a local directory ("disk"),
// or to a real lttng-relayd on loopback that writes them to disk
// ("relayd"): whether streaming keeps up with writing locally. It
// reports the records accepted per second and the share dropped because
// every sub-buffer still waited for the sink.
func BenchmarkStream(b *testing.B) {
	b.Run("disk/64B", func(b *testing.B) {
		s, err := relayfmt.NewDirSink(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		benchStream(b, s)
	})
	b.Run("relayd/64B", func(b *testing.B) {
		r := testenv.StartQuietRelayd(b)
		u, err := ParseURL(r.URL())
		if err != nil {
			b.Fatal(err)
		}
		s, err := NewSink(context.Background(), Config{URL: u, Session: Session{Host: "bench", Name: "stream"}, Streams: []string{"trace0"}})
		if err != nil {
			b.Fatal(err)
		}
		benchStream(b, s)
		if st := s.Stats(); st.Err != nil || st.NotSent != 0 {
			b.Fatalf("relayd sink: %+v", st)
		}
	})
}

// streamChannel returns a channel of 16 × 1 MiB sub-buffers on one CPU
// whose packets go to sink, the id of its one event class (size bytes),
// and a payload.
func streamChannel(b *testing.B, sink relayfmt.Sink, size int) (*relayfmt.Channel, uint32, []byte) {
	c, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 1 << 20, NSubbufs: 16, CPUs: 1}, sink)
	if err != nil {
		b.Fatal(err)
	}
	cls, err := c.AddEventClass("rec", []relayfmt.Field{relayfmt.ArrayField("data", relayfmt.U8, size)})
	if err != nil {
		b.Fatal(err)
	}
	return c, cls.ID, make([]byte, size)
}

func benchStream(b *testing.B, sink relayfmt.Sink) {
	const size = 64
	c, id, payload := streamChannel(b, sink, size)
	b.SetBytes(size + relayfmt.CompactHeaderSize)
	b.ResetTimer()
	start := time.Now()
	ts := uint64(1)
	for range b.N {
		_ = c.Write(0, ts, id, payload) // drops are counted below
		ts += 7
	}
	// Flushed and written out: the time includes getting every packet
	// to the sink.
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	b.StopTimer()
	st, _ := c.StatsCPU(0)
	b.ReportMetric(float64(st.Records)/el.Seconds()/1e6, "Mrec/s")
	b.ReportMetric(float64(st.Records)*float64(size+relayfmt.CompactHeaderSize)/el.Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(st.Dropped)/float64(b.N), "dropped/op")
}

// streamTargets are where the paced benchmarks stream to: a local
// directory and a real lttng-relayd on loopback.
var streamTargets = []string{"disk", "relayd"}

// streamOpener returns a function that makes the sink of one run to
// target, named run, and a function that counts the events in the files
// the run wrote and removes them; for relayd it starts one lttng-relayd
// for all the runs of b.
func streamOpener(b *testing.B, target string) func(run string) (relayfmt.Sink, func() uint64) {
	if target == "disk" {
		return func(string) (relayfmt.Sink, func() uint64) {
			dir, err := os.MkdirTemp(b.TempDir(), "run")
			if err != nil {
				b.Fatal(err)
			}
			s, err := relayfmt.NewDirSink(dir)
			if err != nil {
				b.Fatal(err)
			}
			return s, func() uint64 { return countEvents(b, dir, dir) }
		}
	}
	r := testenv.StartQuietRelayd(b)
	u, err := ParseURL(r.URL())
	if err != nil {
		b.Fatal(err)
	}
	return func(run string) (relayfmt.Sink, func() uint64) {
		s, err := NewSink(context.Background(), Config{URL: u, Session: Session{Host: "bench", Name: run}, Streams: []string{"trace0"}})
		if err != nil {
			b.Fatal(err)
		}
		return s, func() uint64 {
			sess := r.SessionDir(b, "bench", run)
			return countEvents(b, filepath.Join(sess, DomainPath), sess)
		}
	}
}

// pacedStream offers n 64-byte records at rate records a second (in
// bursts of 1000) to a channel of 16 × 1 MiB sub-buffers whose packets
// go to sink, and returns how many the channel dropped, every sub-buffer
// still waiting for the sink, and the rate it wrote at (below rate
// where the writer cannot go faster).
func pacedStream(b *testing.B, sink relayfmt.Sink, n int, rate float64) (dropped uint64, wrote float64) {
	const size, burst = 64, 1000
	c, id, payload := streamChannel(b, sink, size)
	start := time.Now()
	ts := uint64(1)
	for i := 0; i < n; i += burst {
		for k := 0; k < burst && i+k < n; k++ {
			_ = c.Write(0, ts, id, payload) // drops are counted below
			ts += 7
		}
		if d := time.Until(start.Add(time.Duration(float64(i+burst) / rate * 1e9))); d > 0 {
			time.Sleep(d)
		}
	}
	wrote = float64(n) / time.Since(start).Seconds()
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
	st, _ := c.StatsCPU(0)
	return st.Dropped, wrote
}

// countEvents returns the events of the trace in dir, as its reader
// finds them, and removes the directory gone (the trace's or above).
func countEvents(b *testing.B, dir, gone string) uint64 {
	defer os.RemoveAll(gone)
	t, err := relayfmt.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	n, err := t.Events()
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// streamRate is the offered rate of BenchmarkStreamPaced, records a
// second: KCONSUME_STREAM_RATE, or 4 M (a quarter of the channel's
// full-speed rate into a local directory on the 2-core VMs of
// BENCHMARKS.md).
func streamRate(b *testing.B) float64 {
	if s := os.Getenv("KCONSUME_STREAM_RATE"); s != "" {
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || r <= 0 {
			b.Fatalf("KCONSUME_STREAM_RATE=%q: want records a second", s)
		}
		return r
	}
	return 4e6
}

// BenchmarkStreamPaced offers b.N 64-byte records at streamRate to a
// local directory and to a real lttng-relayd on loopback, and reports
// the share of them in the files each wrote (delivered-%, counted by
// reading the trace back) and the share the channel dropped: whether
// streaming delivers what writing locally does at one rate.
func BenchmarkStreamPaced(b *testing.B) {
	rate := streamRate(b)
	for _, target := range streamTargets {
		b.Run(target, func(b *testing.B) {
			open := streamOpener(b, target)
			sink, count := open(fmt.Sprintf("paced-%d", time.Now().UnixNano()))
			dropped, wrote := pacedStream(b, sink, b.N, rate)
			got := count()
			b.ReportMetric(100*float64(got)/float64(b.N), "delivered-%")
			b.ReportMetric(100*float64(dropped)/float64(b.N), "dropped-%")
			b.ReportMetric(wrote/1e6, "offered-Mrec/s")
		})
	}
}

// BenchmarkStreamLossless finds, for a local directory and a real
// lttng-relayd on loopback, the highest rate at which every one of
// 1.5 M records lands in the files: offered from 0.5 M records a second,
// doubled to the first loss (or until the writer cannot go faster),
// then the gap halved six times. It reports the rate written at in the
// fastest lossless run (lossless-Mrec/s); b.N is ignored.
func BenchmarkStreamLossless(b *testing.B) {
	const n = 1_500_000
	for _, target := range streamTargets {
		b.Run(target, func(b *testing.B) {
			open := streamOpener(b, target)
			trial := 0
			best := 0.0
			// lossless runs a trial at rate: whether nothing was lost,
			// and whether the writer kept the pace.
			lossless := func(rate float64) (ok, paced bool) {
				trial++
				sink, count := open(fmt.Sprintf("lossless-%d-%d", time.Now().UnixNano(), trial))
				dropped, wrote := pacedStream(b, sink, n, rate)
				ok = dropped == 0 && count() == n
				if ok && wrote > best {
					best = wrote
				}
				return ok, wrote >= 0.9*rate
			}
			lo, hi := 0.0, 0.5e6
			for {
				ok, paced := lossless(hi)
				if !ok {
					break
				}
				lo = hi
				if !paced {
					// Writer-bound: no faster offer is lossless or not.
					hi = lo
					break
				}
				hi *= 2
			}
			for i := 0; i < 6 && hi > lo; i++ {
				mid := (lo + hi) / 2
				if ok, _ := lossless(mid); ok {
					lo = mid
				} else {
					hi = mid
				}
			}
			b.ReportMetric(best/1e6, "lossless-Mrec/s")
			b.ReportMetric(float64(trial), "trials")
		})
	}
}
