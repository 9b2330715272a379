package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// bpfStatsWanted reports whether KCONSUME_BENCH_BPF_STATS asks for the
// recorder programs' run-time statistics.
func bpfStatsWanted() bool { return os.Getenv("KCONSUME_BENCH_BPF_STATS") != "" }

// bpfProgStats is what the kernel counted of one BPF program's runs
// (BPF_ENABLE_STATS): how many, and their time in all.
type bpfProgStats struct {
	runs uint64
	time time.Duration
}

// add counts q's runs and time in p too.
func (p *bpfProgStats) add(q bpfProgStats) {
	p.runs += q.runs
	p.time += q.time
}

// perRun returns the mean time of a run in ns, or 0 without runs.
func (p bpfProgStats) perRun() float64 {
	if p.runs == 0 {
		return 0
	}
	return float64(p.time.Nanoseconds()) / float64(p.runs)
}

// bpfStatsWatch keeps the kernel's run-time statistics on and looks at
// the loaded programs every 20 ms, so that programs a command loads and
// frees are seen before they go.
type bpfStatsWatch struct {
	on     io.Closer
	prefix string
	quit   chan struct{}
	done   chan map[string]bpfProgStats
}

// watchBPFStats turns the kernel's BPF run-time statistics on (they stay
// on until stop, and cost each program run two clock reads) and starts
// watching the programs whose names begin with prefix. It fails when the
// kernel refuses the statistics (before Linux 5.8, or without
// CAP_SYS_ADMIN).
func watchBPFStats(prefix string) (*bpfStatsWatch, error) {
	on, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enabling BPF run-time statistics: %w", err)
	}
	w := &bpfStatsWatch{on: on, prefix: prefix, quit: make(chan struct{}), done: make(chan map[string]bpfProgStats, 1)}
	go w.watch()
	return w, nil
}

func (w *bpfStatsWatch) watch() {
	last := map[ebpf.ProgramID]bpfProgStats{}
	names := map[ebpf.ProgramID]string{}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		w.look(last, names)
		select {
		case <-t.C:
		case <-w.quit:
			w.look(last, names)
			sum := map[string]bpfProgStats{}
			for id, p := range last {
				s := sum[names[id]]
				s.add(p)
				sum[names[id]] = s
			}
			w.done <- sum
			return
		}
	}
}

// look records the statistics of every loaded program of w's prefix.
// names holds the name of every program looked at so far: the kernel
// does not hand a freed program's ID out again soon (idr_alloc_cyclic),
// so each program's name is asked once, and other programs are passed
// over without being opened, which keeps the watch's own system calls,
// made while the measured run goes on, few.
func (w *bpfStatsWatch) look(last map[ebpf.ProgramID]bpfProgStats, names map[ebpf.ProgramID]string) {
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			return // ErrNotExist past the last one
		}
		id = next
		name, known := names[id]
		if known && !strings.HasPrefix(name, w.prefix) {
			continue
		}
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // freed meanwhile
		}
		if !known {
			info, err := p.Info()
			if err != nil {
				p.Close()
				continue
			}
			name = info.Name
			names[id] = name
		}
		if strings.HasPrefix(name, w.prefix) {
			if st, err := p.Stats(); err == nil {
				last[id] = bpfProgStats{runs: st.RunCount, time: st.Runtime}
			}
		}
		p.Close()
	}
}

// stop turns the statistics off and returns, by program name, what the
// programs counted up to the last look.
func (w *bpfStatsWatch) stop() map[string]bpfProgStats {
	close(w.quit)
	sum := <-w.done
	w.on.Close()
	return sum
}
