// Command bench is `make bench`: it builds the benchmark binaries once,
// runs every benchmark family in rounds (each round one invocation per
// family, so kconsume and its baseline alternate A/B/A/B on the noisy
// machine), and prints one Markdown table of medians with min–max and
// per-round ratios against the baselines, also written to -o. The
// families the host's kernel cannot run go into one vmtest guest of the
// -guest kernel after the host's (guest.go).
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kconsume/kconsume/internal/kcbuild"
)

// family is one benchmark invocation of a round.
type family struct {
	pkg       string // package directory
	bench     string // -test.bench
	benchtime string
}

var families = []family{
	{"./relayfmt", "^BenchmarkWrite$", "1s"},
	{"./relayfmt", "^BenchmarkReadMerge$", "3x"},
	{"./relayfmt", "^BenchmarkVsBabeltrace2$", "1x"},
	{"./consumer", "^BenchmarkDrain(Perf)?$", "100x"},
	{"./consumer", "^BenchmarkDrainPackets$", "20x"},
	{"./consumer", "^BenchmarkConcurrent$", "1000x"},
	{"./consumer", "^BenchmarkTracepointCost$", "2000000x"},
	{"./consumer", "^BenchmarkEventCost$", "200000x"},
	{"./consumer", "^BenchmarkRecorderFloor$", "200000x"},
	{"./cmd/kconsume", "^BenchmarkPeakRSS$", "1x"},
	{"./cmd/kconsume", "^BenchmarkStartStop$", "1x"},
	{"./cmd/kconsume", "^BenchmarkIdle$", "1x"},
	{"./cmd/kconsume", "^BenchmarkSaturation$", "1x"},
	{"./cmd/kconsume", "^BenchmarkSaturationRelayd$", "1x"},
	{"./relayd", "^BenchmarkStream$", "4000000x"},
	{"./relayd", "^BenchmarkStream(Paced|Lossless)$", "4000000x"},
	{"./statedump", "^BenchmarkStatedump1000$", "3x"},
}

func main() {
	rounds := flag.Int("rounds", 5, "rounds of every benchmark (at least 5 for the table's medians)")
	out := flag.String("o", "bench/results.md", "also write the table to this `file`")
	guest := flag.String("guest", "newest", "run the guest rows in a vmtest guest of this `kernel` (newest, 6.1, a release); empty: skip them")
	only := flag.String("only", "", "run only the `host` or the guest families")
	flag.Parse()
	if *only != "" && *only != "host" && *only != "guest" {
		fmt.Fprintf(os.Stderr, "bench: -only %q: host or guest\n", *only)
		os.Exit(2)
	}
	if *only == "host" {
		*guest = ""
	}
	if *only == "guest" && *guest == "" {
		fmt.Fprintln(os.Stderr, "bench: -only guest needs a -guest kernel")
		os.Exit(2)
	}
	if err := run(*rounds, *out, *guest, *only != "guest"); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run runs the host's families (unless !host) and then those of a guest
// of kernel guest (unless guest is ""), rounds times each, and prints and
// writes the table; a guest that measured nothing has its rows say why.
// It fails when a build or a host benchmark fails, or, after the table
// is written, when a benchmark failed in the guest.
func run(rounds int, out, guest string, host bool) error {
	tmp, err := os.MkdirTemp("", "kconsume-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "kconsume")
	if err := kcbuild.Build(context.Background(), bin); err != nil {
		return err
	}
	tests := map[string]string{}
	var hostFams []family
	if host {
		hostFams = families
	}
	for _, f := range hostFams {
		if _, ok := tests[f.pkg]; ok {
			continue
		}
		t := filepath.Join(tmp, filepath.Base(f.pkg)+".test")
		if err := sh(os.Stderr, "go", "test", "-c", "-o", t, f.pkg); err != nil {
			return err
		}
		tests[f.pkg] = t
	}
	if guest != "" {
		for _, f := range guestFamilies {
			if _, ok := tests[f.pkg]; ok {
				continue
			}
			t := filepath.Join(tmp, filepath.Base(f.pkg)+".test")
			if err := sh(os.Stderr, "go", "test", "-c", "-o", t, f.pkg); err != nil {
				return err
			}
			tests[f.pkg] = t
		}
	}
	res := results{}
	start := time.Now()
	for r := 0; r < rounds; r++ {
		for _, f := range hostFams {
			fmt.Fprintf(os.Stderr, "bench: round %d/%d: %s %s\n", r+1, rounds, f.pkg, f.bench)
			var buf bytes.Buffer
			// -test.v puts a skipped benchmark's reason (trace-cmd missing...)
			// in the log that the table's "not measured" points to.
			cmd := exec.Command(tests[f.pkg], "-test.v", "-test.run", "^$", "-test.bench", f.bench, "-test.benchtime", f.benchtime, "-test.count", "1")
			cmd.Dir = f.pkg
			cmd.Env = append(os.Environ(), "KCONSUME_BIN="+bin, "KCONSUME_BENCH_ROUNDS=1", fmt.Sprintf("KCONSUME_BENCH_TURN=%d", r))
			cmd.Stdout = io.MultiWriter(&buf, os.Stderr)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s %s: %w", f.pkg, f.bench, err)
			}
			res.parse(r, &buf, "")
		}
	}
	var g *guestRun
	if guest != "" {
		// After the host's rounds: an emulated guest takes a host CPU.
		g = runGuest(context.Background(), guest, rounds, tests, bin, res)
		if g.err != nil && g.accel == "" {
			fmt.Fprintln(os.Stderr, "bench: no guest:", g.err)
		}
	}
	table := render(res, rounds, time.Since(start), host, g)
	fmt.Print(table)
	if out != "" {
		if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
			return err
		}
	}
	if g != nil && g.err != nil && g.accel != "" {
		// The guest booted: a benchmark failed in it.
		return g.err
	}
	return nil
}

func sh(log io.Writer, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// header describes the machine and the run.
func header(rounds int, took time.Duration, g *guestRun) string {
	var b strings.Builder
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	model := ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	fmt.Fprintf(&b, "# kconsume benchmarks\n\n")
	fmt.Fprintf(&b, "`make bench` (`go run ./bench`), %s, commit %s: %d CPUs (%s), Linux %s, %s; %d rounds in %s.\n",
		time.Now().UTC().Format("2006-01-02"), strings.TrimSpace(string(commit)), runtime.NumCPU(), model,
		strings.TrimSpace(string(rel)), runtime.Version(), rounds, took.Round(time.Second))
	b.WriteString("Each figure is the median of the rounds with min–max; each ratio is the median (min–max) of the\n")
	b.WriteString("rounds' own ratios, kconsume and its baseline measured back to back in the same invocation.\n")
	b.WriteString("Where a target is missed the last column says so; BENCHMARKS.md says where the time goes.\n")
	if g != nil && g.err == nil {
		fmt.Fprintf(&b, "The sections marked as measured in a guest ran in one vmtest guest of Linux %s (%d vCPUs, QEMU %s) after the host's rounds.\n",
			g.release, guestCPUs, g.accel)
	}
	b.WriteString("\n")
	return b.String()
}
