package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/consumer/recorder"
)

// serveMetrics serves the session's per-CPU counters at http://addr/metrics
// in the Prometheus text format, until the returned function is called.
func serveMetrics(addr string, h *handler) (net.Addr, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		s, err := h.session()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		stats, err := s.Stats()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		chains, err := s.StackCounts()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		b := bytes.NewBuffer(promText(s.Running(), stats, s.Drainer(), chains))
		h.relay.prom(b)
		_, _ = w.Write(b.Bytes())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			_ = srv.Close()
		}
	}, nil
}

// promText renders the counters in the Prometheus text exposition
// format: the per-CPU ones of stats, the drainer's d and the call
// chains' chains.
func promText(running bool, stats []consumer.CPUStats, d consumer.DrainerStats, chains recorder.StackCounts) []byte {
	var b bytes.Buffer
	up := 0
	if running {
		up = 1
	}
	fmt.Fprintf(&b, "# HELP kconsume_running Whether the session's gate is open.\n# TYPE kconsume_running gauge\nkconsume_running %d\n", up)
	counter := func(name, help string, val func(c consumer.CPUStats) uint64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
		for _, c := range stats {
			fmt.Fprintf(&b, "%s{cpu=\"%d\"} %d\n", name, c.CPU, val(c))
		}
	}
	counter("kconsume_emitted_total", "Records the BPF programs handed to the ring.", func(c consumer.CPUStats) uint64 { return c.Emitted })
	counter("kconsume_events_total", "Events written into sub-buffers.", func(c consumer.CPUStats) uint64 { return c.Channel.Records })
	counter("kconsume_bytes_total", "Event bytes written into sub-buffers.", func(c consumer.CPUStats) uint64 { return c.Channel.Bytes })
	counter("kconsume_subbuffers_total", "Sub-buffers finished.", func(c consumer.CPUStats) uint64 { return c.Channel.Packets })
	counter("kconsume_reordered_total", "Records written before a record that reached the ring earlier.", func(c consumer.CPUStats) uint64 { return c.Reordered })
	counter("kconsume_wakeups_total", "Times the consumer was woken for the CPU's ring.", func(c consumer.CPUStats) uint64 { return c.Wakeups })
	counter("kconsume_missed_total", "Runs of the recorder the kernel skipped, another BPF program running on the CPU: at most that many events lost, those known lost also in kconsume_lost_total.", func(c consumer.CPUStats) uint64 { return c.Missed })
	fmt.Fprintf(&b, "# HELP kconsume_callchains_lost_total Call chains cut at the depth (truncated) or recorded empty (empty).\n# TYPE kconsume_callchains_lost_total counter\n")
	fmt.Fprintf(&b, "kconsume_callchains_lost_total{state=\"truncated\"} %d\nkconsume_callchains_lost_total{state=\"empty\"} %d\n", chains.Truncated, chains.Failed)
	fmt.Fprintf(&b, "# HELP kconsume_perf_contexts_unread_total Perf counter contexts the kernel would not read, written as 0.\n# TYPE kconsume_perf_contexts_unread_total counter\nkconsume_perf_contexts_unread_total %d\n", chains.CountersUnread)
	fmt.Fprintf(&b, "# HELP kconsume_lost_total Events lost, by layer.\n# TYPE kconsume_lost_total counter\n")
	for _, c := range stats {
		for _, l := range []struct {
			layer string
			n     uint64
		}{{"kernel", c.KernelLost}, {"dropped", c.Channel.Dropped}, {"overwritten", c.Channel.Overwritten}, {"invalid", c.Channel.Invalid + c.Channel.TooLarge + c.Undecodable}, {"disk", c.Channel.Unwritten}} {
			fmt.Fprintf(&b, "kconsume_lost_total{cpu=\"%d\",layer=%q} %d\n", c.CPU, l.layer, l.n)
		}
	}
	fmt.Fprintf(&b, "# HELP kconsume_drainer_late_total Times the consumer ran more than its latency after it asked to.\n# TYPE kconsume_drainer_late_total counter\nkconsume_drainer_late_total %d\n", d.Late)
	fmt.Fprintf(&b, "# HELP kconsume_drainer_overrun_max_seconds The longest the consumer ran after it asked to.\n# TYPE kconsume_drainer_overrun_max_seconds gauge\nkconsume_drainer_overrun_max_seconds %g\n", d.LongestOverrun.Seconds())
	return b.Bytes()
}
