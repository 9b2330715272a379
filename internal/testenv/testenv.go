// Package testenv holds what tests of several packages need from the
// machine: root with BPF, tracefs, and babeltrace2 as the independent
// reader of our traces. Without KCONSUME_STRICT (set by make test) a
// missing requirement skips the test; with it, it fails.
package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/kcbuild"
	"github.com/kconsume/kconsume/internal/mounts"
)

// Strict reports whether missing requirements fail tests (make test).
func Strict() bool { return os.Getenv("KCONSUME_STRICT") != "" }

// Missing skips t, or fails it in strict mode, with the reason.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Strict() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

var (
	mountOnce sync.Once
	mountErr  error
)

// RequireRoot skips or fails t unless it runs as root with tracefs,
// which it mounts (once per test binary, saying so) when it is missing,
// as the commands do.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root (BPF, tracefs): run make test as root")
	}
	mountOnce.Do(func() {
		var did string
		if _, did, mountErr = mounts.Tracefs(); did != "" {
			fmt.Fprintf(os.Stderr, "testenv: mounted %s\n", did)
		}
	})
	if mountErr != nil {
		Missing(t, "%v", mountErr)
	}
}

// BT2 returns babeltrace2's path, skipping or failing t without it.
func BT2(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("babeltrace2")
	if err != nil {
		Missing(t, "babeltrace2 is required (apt-get install babeltrace2): %v", err)
	}
	return p
}

var bt2Discard = regexp.MustCompile(`discarded (\d+) (events?|packets?) between \[([0-9:.]+)\] and \[([0-9:.]+)\] .*within stream "([^"]+)"`)

// Discard is one "discarded N events/packets" warning of babeltrace2.
type Discard struct {
	Count      int
	Kind       string // "events" or "packets"
	Begin, End string // time of day, UTC
	Stream     string // file name
}

// RunBT2 runs babeltrace2 on dir (cycles, no delta, UTC) and returns its
// event lines and its discard warnings. A babeltrace2 error fails t.
func RunBT2(t testing.TB, dir string) (lines []string, discards []Discard) {
	t.Helper()
	cmd := exec.Command(BT2(t), "--clock-cycles", "--no-delta", "--clock-gmt", dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("babeltrace2 %s: %v\n%s", dir, err, stderr.String())
	}
	for _, m := range bt2Discard.FindAllStringSubmatch(stderr.String(), -1) {
		var n int
		fmt.Sscan(m[1], &n)
		discards = append(discards, Discard{Count: n, Kind: strings.TrimSuffix(m[2], "s") + "s", Begin: m[3], End: m[4], Stream: filepath.Base(m[5])})
	}
	lines = strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		lines = nil
	}
	return lines, discards
}

// KernelRelease returns the running kernel's major and minor version.
func KernelRelease() (major, minor int, release string) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return 0, 0, ""
	}
	release = unix.ByteSliceToString(u.Release[:])
	fmt.Sscanf(release, "%d.%d", &major, &minor)
	return major, minor, release
}

// RequireKernel skips t, even in strict mode, when the running kernel is
// older than major.minor, the first with feature: only an honestly older
// kernel may skip. On a newer kernel the test runs and a missing feature
// fails it.
func RequireKernel(t testing.TB, major, minor int, feature string) {
	t.Helper()
	ma, mi, rel := KernelRelease()
	if ma < major || ma == major && mi < minor {
		t.Skipf("%s needs Linux %d.%d; this kernel is %s", feature, major, minor, rel)
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// KconsumeBin returns $KCONSUME_BIN (vmtest builds the command on the
// host: a guest under TCG links slowly), or builds cmd/kconsume once per
// test binary, as a user would run it.
func KconsumeBin(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("KCONSUME_BIN"); p != "" {
		return p
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kconsume-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "kconsume")
		binErr = kcbuild.Build(context.Background(), binPath)
	})
	if binErr != nil {
		tb.Fatalf("building kconsume: %v", binErr)
	}
	return binPath
}

// RemoveBin removes the command KconsumeBin built, if any; TestMain calls
// it after the tests.
func RemoveBin() {
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
}

// LTTngAnalysis returns the path of one of LTTng's analyses (lttng-cputop,
// lttng-syscallstats...), skipping or failing t when it, or the
// babeltrace 1 command it runs on the trace, is missing.
func LTTngAnalysis(t testing.TB, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		Missing(t, "%s is required (apt-get install python3-lttnganalyses): %v", tool, err)
	}
	if _, err := exec.LookPath("babeltrace"); err != nil {
		Missing(t, "babeltrace (1.x), which LTTng's analyses run, is required (apt-get install babeltrace python3-babeltrace): %v", err)
	}
	return p
}

// InGuest reports whether the test runs inside a vmtest guest: the suite
// sets KCONSUME_VMTEST and the guest's kernel command line carries the
// run's nonce. Both must hold before a test may change the machine's
// kernel settings, such as offlining a CPU.
func InGuest() bool {
	cmdline, _ := os.ReadFile("/proc/cmdline")
	return os.Getenv("KCONSUME_VMTEST") != "" && strings.Contains(string(cmdline), "vmtest.nonce=")
}

// SetCPUOnline takes cpu offline or brings it back, in a vmtest guest
// only: anywhere else it fails t, as the machine's own kernel settings
// are not a test's to change.
func SetCPUOnline(t testing.TB, cpu int, on bool) {
	t.Helper()
	if !InGuest() {
		t.Fatalf("cpu%d online=%v: only inside a vmtest guest", cpu, on)
	}
	v := "0"
	if on {
		v = "1"
	}
	p := fmt.Sprintf("/sys/devices/system/cpu/cpu%d/online", cpu)
	if b, _ := os.ReadFile(p); strings.TrimSpace(string(b)) == v {
		return
	}
	if err := os.WriteFile(p, []byte(v), 0); err != nil {
		t.Fatalf("cpu%d online=%s: %v", cpu, v, err)
	}
}

// FaultRuns returns the runs and the first seed of a seeded fault suite:
// KC_FAULT_RUNS (else runs) and KC_FAULT_SEED (else the time), and logs
// how to repeat one run.
func FaultRuns(t testing.TB, runs int) (int, int64) {
	t.Helper()
	if v := os.Getenv("KC_FAULT_RUNS"); v != "" {
		var err error
		if runs, err = strconv.Atoi(v); err != nil || runs < 1 {
			t.Fatalf("KC_FAULT_RUNS=%q: want a positive number", v)
		}
	}
	seed := time.Now().UnixNano() % 1e9
	if v := os.Getenv("KC_FAULT_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("KC_FAULT_SEED=%q: want a number", v)
		}
	}
	t.Logf("%d runs from seed %d; KC_FAULT_SEED=S KC_FAULT_RUNS=1 repeats the run of seed S", runs, seed)
	return runs, seed
}

// BuildC compiles the C file src with cc and flags into t's temporary
// directory and returns the program's path, named as src without .c. It
// skips t without a C compiler (fails it in strict mode) and fails it
// when the compiler does.
func BuildC(t testing.TB, src string, flags ...string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		Missing(t, "a C compiler is required for the workload (apt-get install gcc): %v", err)
	}
	bin := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c"))
	if out, err := exec.Command(cc, append(append([]string(nil), flags...), "-o", bin, src)...).CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", src, err, out)
	}
	return bin
}

// RequireSDT skips t, or fails it in strict mode, without systemtap's
// sys/sdt.h, which the USDT workloads include.
func RequireSDT(t testing.TB) {
	t.Helper()
	for _, h := range []string{"/usr/include/x86_64-linux-gnu/sys/sdt.h", "/usr/include/aarch64-linux-gnu/sys/sdt.h", "/usr/include/sys/sdt.h"} {
		if _, err := os.Stat(h); err == nil {
			return
		}
	}
	Missing(t, "sys/sdt.h is required for the USDT workload (apt-get install systemtap-sdt-dev)")
}
