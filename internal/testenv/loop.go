package testenv

import (
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// ShellLoop returns a sh script that counts to n.
func ShellLoop(n int) string {
	return "i=0; while [ $i -lt " + strconv.Itoa(n) + " ]; do i=$((i+1)); done"
}

// LoopCPU returns a count for ShellLoop whose loop, run alone, takes at
// least want of CPU here, and the CPU it took: it doubles the count from
// 10,000 until the loop takes that long. A fixed count is a fixed time
// only on one machine: a machine twice as fast halves it, an emulated
// guest makes it tens of times longer.
func LoopCPU(tb testing.TB, want time.Duration) (int, time.Duration) {
	tb.Helper()
	for n := 10000; ; n *= 2 {
		cmd := exec.Command("sh", "-c", ShellLoop(n))
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		if took := time.Duration(ru.Utime.Nano() + ru.Stime.Nano()); took >= want || n >= 1<<30 {
			return n, took
		}
	}
}
