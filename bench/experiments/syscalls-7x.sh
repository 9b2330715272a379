#!/bin/sh
# syscalls-7x.sh: BENCHMARKS.md, 2026-11-27 (879b13a). Runs inside a vmtest guest
# (go run ./vmtest/cmd/vmtest run -kernel newest -- THIS), with two
# kconsume binaries built on the host at /tmp/kc-old and /tmp/kc-new:
# the perf-event links and BPF links `record -e 'syscalls:*'` holds, then
# 5 alternated rounds of its stop (SIGINT to exit) and of the wall time
# of a 1 s recording.
cd /tmp
for b in old new; do
	/tmp/kc-$b record -q -o /tmp/o-$b --force -e 'syscalls:*' --duration 14s >/dev/null 2>&1 &
	sleep 12
	pid=$(pidof kc-$b)
	echo "$b: perf-event fds $(ls -l /proc/$pid/fd | grep -c perf_event), bpf-link fds $(ls -l /proc/$pid/fd | grep -c bpf_link)"
	wait
done
for i in 1 2 3 4 5; do
	for b in old new; do
		/tmp/kc-$b record -q -o /tmp/o-$b --force -e 'syscalls:*' >/dev/null 2>&1 &
		p=$!
		sleep 12
		s=$(date +%s.%N)
		kill -INT $p
		wait $p
		e=$(date +%s.%N)
		echo "$b stop $(echo "$e - $s" | bc) s"
		s=$(date +%s.%N)
		/tmp/kc-$b record -q -o /tmp/o-$b --force -e 'syscalls:*' --duration 1s >/dev/null 2>&1
		e=$(date +%s.%N)
		echo "$b wall $(echo "$e - $s" | bc) s"
	done
done
