#!/bin/sh
# ab-stats.sh EVENT PROG 'LOAD' BIN...: BENCHMARKS.md, 2026-11-27 (47b27d1). For
# each kconsume binary in turn, records EVENT, runs LOAD pinned to CPU 0,
# and prints the mean ns a run of the recorder's program PROG, from the
# kernel's BPF statistics, which bpfstats must hold on meanwhile:
#
#   go build -o /tmp/bpfstats ./bench/experiments/bpfstats
#   gcc -O2 -static -o /tmp/gp bench/experiments/gp.c
#   /tmp/bpfstats 10m & sleep 1
#   for i in $(seq 30); do bench/experiments/ab-stats.sh \
#       syscalls:sys_enter_getpid kc_sys_enter '/tmp/gp 3000000' $BASE $NEW; done
#   kill %1
event=$1 prog=$2 load=$3
shift 3
for b in "$@"; do
	$b record -q -o /tmp/ab-stats.trace --force -e "$event" >/dev/null 2>&1 &
	p=$!
	sleep 1.5
	taskset -c 0 $load >/dev/null
	id=$(bpftool prog show | grep " name $prog " | cut -d: -f1 | tail -1)
	bpftool prog show id "$id" | grep -o "run_time_ns [0-9]* run_cnt [0-9]*" |
		awk -v b="$b" '{printf "%s %.1f ns/run (%d runs)\n", b, $2 / $4, $4}'
	kill -INT $p
	wait $p
done
