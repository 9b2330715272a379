package relayd

import (
	"context"
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
		r := testenv.StartRelayd(b)
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

func benchStream(b *testing.B, sink relayfmt.Sink) {
	const size = 64
	c, err := relayfmt.NewChannel(relayfmt.Config{SubbufSize: 1 << 20, NSubbufs: 16, CPUs: 1}, sink)
	if err != nil {
		b.Fatal(err)
	}
	cls, err := c.AddEventClass("rec", []relayfmt.Field{relayfmt.ArrayField("data", relayfmt.U8, size)})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, size)
	b.SetBytes(size + relayfmt.CompactHeaderSize)
	b.ResetTimer()
	start := time.Now()
	ts := uint64(1)
	for range b.N {
		_ = c.Write(0, ts, cls.ID, payload) // drops are counted below
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
