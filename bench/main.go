// Command bench is `make bench`: it builds the benchmark binaries once,
// runs every benchmark family in rounds (each round one invocation per
// family, so kconsume and its baseline alternate A/B/A/B on the noisy
// machine), and prints one Markdown table of medians with min–max and
// per-round ratios against the baselines, also written to -o.
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
	{"./relayd", "^BenchmarkStream$", "4000000x"},
	{"./relayd", "^BenchmarkStream(Paced|Lossless)$", "4000000x"},
	{"./statedump", "^BenchmarkStatedump1000$", "3x"},
}

func main() {
	rounds := flag.Int("rounds", 5, "rounds of every benchmark (at least 5 for the table's medians)")
	out := flag.String("o", "bench/results.md", "also write the table to this `file`")
	flag.Parse()
	if err := run(*rounds, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(rounds int, out string) error {
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
	for _, f := range families {
		if _, ok := tests[f.pkg]; ok {
			continue
		}
		t := filepath.Join(tmp, filepath.Base(f.pkg)+".test")
		if err := sh(os.Stderr, "go", "test", "-c", "-o", t, f.pkg); err != nil {
			return err
		}
		tests[f.pkg] = t
	}
	res := results{}
	start := time.Now()
	for r := 0; r < rounds; r++ {
		for _, f := range families {
			fmt.Fprintf(os.Stderr, "bench: round %d/%d: %s %s\n", r+1, rounds, f.pkg, f.bench)
			var buf bytes.Buffer
			// -test.v puts a skipped benchmark's reason (trace-cmd missing...)
			// in the log that the table's "not measured" points to.
			cmd := exec.Command(tests[f.pkg], "-test.v", "-test.run", "^$", "-test.bench", f.bench, "-test.benchtime", f.benchtime, "-test.count", "1")
			cmd.Dir = f.pkg
			cmd.Env = append(os.Environ(), "KCONSUME_BIN="+bin, "KCONSUME_BENCH_ROUNDS=1")
			cmd.Stdout = io.MultiWriter(&buf, os.Stderr)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s %s: %w", f.pkg, f.bench, err)
			}
			res.parse(r, &buf)
		}
	}
	table := render(res, rounds, time.Since(start))
	fmt.Print(table)
	if out != "" {
		if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
			return err
		}
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
func header(rounds int, took time.Duration) string {
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
	b.WriteString("Where a target is missed the last column says so; BENCHMARKS.md says where the time goes.\n\n")
	return b.String()
}
