package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kconsume/kconsume/vmtest"
)

// guestFamily is a benchmark family that runs inside a vmtest guest:
// what the host's kernel cannot run (kprobes, fentry, programs that run
// preemptibly). Its rows' benchmark names carry guestSuffix.
type guestFamily struct {
	family
	env []string // the benchmark's environment in the guest
}

var guestFamilies = []guestFamily{
	{family{"./consumer", "^BenchmarkEventCost$", "200000x"}, []string{"KCONSUME_BENCH_SESSIONS=kprobe,fentry,rawperf,funckprobe"}},
	{family{"./consumer", "^BenchmarkPreemptKept$", "20000x"}, nil},
}

// guestSuffix ends the names of the benchmarks measured in the guest,
// so that they do not mix with the host's of the same name.
const guestSuffix = "@guest"

// guestCPUs is the guest's vCPUs: the host's two, as vmtest.toml's.
const guestCPUs = 2

// guestRun is how the guest's rounds went: the kernel it booted, under
// which accelerator, or why it measured nothing (err).
type guestRun struct {
	kernel, release, accel string
	err                    error
}

// note is the one line that a guest section's rows are replaced with
// where the guest measured nothing, "" where it did.
func (g *guestRun) note() string {
	switch {
	case g == nil:
		return "not measured: the guest rows were not asked for (`-guest ''`, `make bench BENCH_GUEST=`)"
	case g.err != nil:
		return "not measured: no guest of kernel " + g.kernel + " here: " + strings.ReplaceAll(g.err.Error(), "\n", " ")
	}
	return ""
}

// heading is what a guest section's title adds: where it was measured.
func (g *guestRun) heading() string {
	if g == nil || g.err != nil {
		return " (in a vmtest guest)"
	}
	if g.accel == "tcg" {
		return fmt.Sprintf(" — measured in a QEMU TCG guest, Linux %s, %d vCPUs: ratios only, its ns are emulated time", g.release, guestCPUs)
	}
	return fmt.Sprintf(" — measured in a QEMU %s guest, Linux %s, %d vCPUs", g.accel, g.release, guestCPUs)
}

// runGuest boots one guest of kernel spec (a vmtest kernel: newest, 6.1,
// a release) and runs the guest families' test binaries (tests, built on
// the host) in it, rounds times each, one invocation a round as on the
// host, with kconsume bin; their results go into res under guestSuffix.
// A host that cannot boot the guest (no QEMU, no kernel to fetch) gives
// a guestRun whose err says why; a benchmark failing in the guest is an
// error too, with the rounds before it kept.
func runGuest(ctx context.Context, spec string, rounds int, tests map[string]string, bin string, res results) *guestRun {
	g := &guestRun{kernel: spec}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		g.err = fmt.Errorf("no qemu-system-x86_64 (apt-get install qemu-system-x86)")
		return g
	}
	c := &vmtest.Cache{Dir: vmtest.DefaultCacheDir(), Log: os.Stderr}
	k, err := c.Kernel(ctx, spec)
	if err != nil {
		g.err = err
		return g
	}
	g.release = k.Release
	o := vmtest.Options{Kernel: k, CPUs: guestCPUs, MemoryMB: 2048, Accel: "auto", Timeout: 4 * time.Hour,
		Env: append(os.Environ(), "KCONSUME_BIN="+bin, "KCONSUME_BENCH_ROUNDS=1", "KCONSUME_VMTEST=1")}
	g.accel = vmtest.Accel(ctx, o)
	o.Accel = g.accel
	var script strings.Builder
	for r := range rounds {
		for i, f := range guestFamilies {
			dir, err := filepath.Abs(f.pkg)
			if err != nil {
				g.err = err
				return g
			}
			fmt.Fprintf(&script, "echo 'bench-guest: round %d family %d'\n", r, i)
			fmt.Fprintf(&script, "(cd %s && env KCONSUME_BENCH_TURN=%d %s %s -test.v -test.run '^$' -test.bench '%s' -test.benchtime %s -test.count 1)\n",
				dir, r, strings.Join(f.env, " "), tests[f.pkg], f.bench, f.benchtime)
			script.WriteString("echo \"bench-guest: status $?\"\n")
		}
	}
	con := &guestConsole{res: res}
	o.Console = con
	fmt.Fprintf(os.Stderr, "bench: guest %s (%s), %d rounds of %d families\n", k.Release, g.accel, rounds, len(guestFamilies))
	st, err := vmtest.Run(ctx, o, []string{"/bin/sh", "-c", script.String()})
	con.flush()
	switch {
	case err != nil:
		g.err = fmt.Errorf("guest of %s: %w", k.Release, err)
	case con.failed != "":
		g.err = fmt.Errorf("in the guest of %s, %s failed (see the log)", k.Release, con.failed)
	case st != 0:
		g.err = fmt.Errorf("guest of %s: exit status %d", k.Release, st)
	}
	return g
}

var (
	guestRound  = regexp.MustCompile(`^bench-guest: round (\d+) family (\d+)$`)
	guestStatus = regexp.MustCompile(`^bench-guest: status (\d+)$`)
)

// guestConsole takes the guest's console a line at a time (as
// vmtest.Run writes it), echoes it to stderr, and parses each family's
// output into res as its round's.
type guestConsole struct {
	res     results
	round   int
	family  int
	out     bytes.Buffer
	failed  string // the first family that failed, as "pkg bench"
	started bool
}

func (c *guestConsole) Write(p []byte) (int, error) {
	os.Stderr.Write(p)
	for _, line := range strings.SplitAfter(string(p), "\n") {
		text := strings.TrimSpace(line)
		if m := guestRound.FindStringSubmatch(text); m != nil {
			c.flush()
			c.round, _ = strconv.Atoi(m[1])
			c.family, _ = strconv.Atoi(m[2])
			c.started = true
			continue
		}
		if m := guestStatus.FindStringSubmatch(text); m != nil {
			if m[1] != "0" && c.failed == "" && c.family < len(guestFamilies) {
				f := guestFamilies[c.family]
				c.failed = f.pkg + " " + f.bench
			}
			c.flush()
			continue
		}
		if c.started {
			c.out.WriteString(line)
		}
	}
	return len(p), nil
}

// flush parses the output gathered since the last round marker.
func (c *guestConsole) flush() {
	if c.out.Len() > 0 {
		c.res.parse(c.round, &c.out, guestSuffix)
	}
	c.out.Reset()
	c.started = false
}
