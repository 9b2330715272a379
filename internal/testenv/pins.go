package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// started is when the test binary started.
var started = time.Now()

// SweepPins removes what recordings started by this test binary pinned
// under /sys/fs/bpf/kconsume and left there because a test killed them
// without running kconsume recover (a test that failed, say), so that
// the suite leaves the machine's BPF filesystem as it found it. Pins of
// recordings still running or older than the test binary stay.
func SweepPins() {
	dirs, _ := filepath.Glob("/sys/fs/bpf/kconsume/*-*")
	for _, d := range dirs {
		pid, at, ok := strings.Cut(filepath.Base(d), "-")
		n, err1 := strconv.Atoi(pid)
		ns, err2 := strconv.ParseInt(at, 36, 64)
		if !ok || err1 != nil || err2 != nil || time.Unix(0, ns).Before(started) {
			continue
		}
		if syscall.Kill(n, 0) == syscall.ESRCH {
			_ = os.RemoveAll(d)
		}
	}
}
