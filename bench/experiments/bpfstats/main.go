// Command bpfstats keeps the kernel's BPF run-time statistics on for a
// while: BENCHMARKS.md, 2026-11-27 (47b27d1). The statistics stay on only while a
// process holds the file descriptor BPF_ENABLE_STATS returns, so they go
// off when bpfstats exits, however it exits; the machine's
// kernel.bpf_stats_enabled setting is never written.
//
//	go run ./bench/experiments/bpfstats 10m &
//	bpftool prog show   # run_time_ns and run_cnt per program
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: bpfstats DURATION")
		os.Exit(2)
	}
	d, err := time.ParseDuration(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bpfstats:", err)
		os.Exit(2)
	}
	c, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bpfstats: enabling BPF statistics:", err)
		os.Exit(1)
	}
	defer c.Close()
	time.Sleep(d)
}
