// Command vmtest boots Debian kernels under QEMU and runs commands or the
// Go test suite inside them, with the host's root shared read-only.
//
//	vmtest fetch 5.10 6.1                      download and unpack kernels
//	vmtest run -kernel 6.1 -- CMD ARGS...      run a command in a guest
//	go test -exec 'vmtest run -kernel 6.1' ./consumer/
//	vmtest test [-kernels '5.10 6.1'] [PKGS]   the suite on a kernel matrix (vmtest.toml)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kconsume/kconsume/vmtest"
)

const usage = `usage: vmtest COMMAND [flags]

Commands:
  fetch KERNEL...          download and unpack Debian kernels (5.10, 6.1, 6.12, newest, a release)
  run [flags] CMD ARGS...  boot a guest and run CMD in the current directory; exits with its status
  test [flags] [PKGS]      build the packages' tests on the host and run them in a guest per kernel

Run 'vmtest COMMAND -h' for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var code int
	var err error
	switch os.Args[1] {
	case "fetch":
		err = fetch(ctx, os.Args[2:])
	case "run":
		code, err = run(ctx, os.Args[2:])
	case "test":
		code, err = test(ctx, os.Args[2:])
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "vmtest: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "vmtest:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "vmtest:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

type usageError struct{ error }

// guestFlags are the flags run and test share.
type guestFlags struct {
	cpus, mem  int
	accel      string
	timeout    time.Duration
	kernelArgs string
	cache      string
}

func (g *guestFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&g.cpus, "cpus", 2, "virtual CPUs")
	fs.IntVar(&g.mem, "mem", 2048, "guest memory in MiB")
	fs.StringVar(&g.accel, "accel", "auto", "tcg, kvm, or auto (KVM only if a probe boot works)")
	fs.DurationVar(&g.timeout, "timeout", 45*time.Minute, "limit for one guest, boot included")
	fs.StringVar(&g.kernelArgs, "append", "", "extra kernel command line arguments")
	fs.StringVar(&g.cache, "cache", vmtest.DefaultCacheDir(), "kernel cache directory")
}

func (g *guestFlags) options(k *vmtest.Kernel) vmtest.Options {
	return vmtest.Options{Kernel: k, CPUs: g.cpus, MemoryMB: g.mem, Accel: g.accel,
		Timeout: g.timeout, KernelArgs: g.kernelArgs, Console: os.Stdout, CacheDir: g.cache}
}

func fetch(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fetch", flag.ContinueOnError)
	cache := fs.String("cache", vmtest.DefaultCacheDir(), "kernel cache directory")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: vmtest fetch [-cache DIR] KERNEL...\n\nexample: vmtest fetch 5.10 6.1 6.12 newest")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() == 0 {
		return usageError{fmt.Errorf("fetch: name at least one kernel")}
	}
	c := &vmtest.Cache{Dir: *cache, Log: os.Stderr}
	for _, spec := range fs.Args() {
		k, err := c.Kernel(ctx, spec)
		if err != nil {
			return err
		}
		fmt.Printf("%s\t%s\t%s\n", spec, k.Release, k.Image)
	}
	return nil
}

func run(ctx context.Context, args []string) (int, error) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var g guestFlags
	g.register(fs)
	kernel := fs.String("kernel", "6.1", "Debian kernel series, release, newest, or a bzImage path")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: vmtest run [flags] [--] CMD ARGS...\n\nexample: vmtest run -kernel 5.10 -- uname -r\n         go test -exec 'vmtest run -kernel 6.1' ./consumer/")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 0, usageError{err}
	}
	if fs.NArg() == 0 {
		return 0, usageError{fmt.Errorf("run: no command")}
	}
	c := &vmtest.Cache{Dir: g.cache, Log: os.Stderr}
	k, err := c.Kernel(ctx, *kernel)
	if err != nil {
		return 0, err
	}
	return vmtest.Run(ctx, g.options(k), fs.Args())
}

// test builds the suite once and runs it in a guest per selected target.
func test(ctx context.Context, args []string) (int, error) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var g guestFlags
	g.register(fs)
	config := fs.String("config", "vmtest.toml", "kernel matrix")
	kernels := fs.String("kernels", "", "space-separated targets or kernels to run (default: every target)")
	runRe := fs.String("run", "", "run only tests matching this regular expression")
	verbose := fs.Bool("v", false, "verbose test output")
	parallel := fs.Int("parallel", 0, "guests at once (0: one per host CPU under TCG, whose guest runs in one host thread; host CPUs / -cpus under KVM)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: vmtest test [flags] [PACKAGES]\n\nexample: vmtest test -kernels '5.10 6.1' ./...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 0, usageError{err}
	}
	cfg, err := vmtest.LoadConfig(*config)
	if err != nil {
		return 0, err
	}
	targets := cfg.Select(strings.Fields(*kernels))
	if len(targets) == 0 {
		return 0, usageError{fmt.Errorf("test: %s has no targets", *config)}
	}
	pkgs := fs.Args()
	if len(pkgs) == 0 {
		pkgs = []string{"./..."}
	}
	var testArgs []string
	if *runRe != "" {
		testArgs = append(testArgs, "-test.run="+*runRe)
	}
	if *verbose {
		testArgs = append(testArgs, "-test.v")
	}
	// Kernels first: a download failure should not wait for the build.
	c := &vmtest.Cache{Dir: g.cache, Log: os.Stderr}
	ks := make([]*vmtest.Kernel, len(targets))
	for i, t := range targets {
		if ks[i], err = c.Kernel(ctx, t.Kernel); err != nil {
			return 0, fmt.Errorf("target %s: %w", t.Name, err)
		}
	}
	suite, err := vmtest.BuildSuite(ctx, "", pkgs, testArgs)
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(suite.Dir)

	results := runTargets(ctx, g, targets, ks, suite, *parallel)
	return report(results), nil
}

// runTargets runs suite in a guest per target, with kernels ks, at most
// parallel at once (0: as many as the host's CPUs take), and returns how
// each ended.
func runTargets(ctx context.Context, g guestFlags, targets []vmtest.Target, ks []*vmtest.Kernel, suite *vmtest.Suite, parallel int) []result {
	// One answer for every guest, so that parallel guests do not each
	// probe, and the default parallelism knows what a guest takes.
	g.accel = vmtest.Accel(ctx, g.options(ks[0]))
	n := parallel
	if n <= 0 {
		n = runtime.NumCPU()
		if g.accel == "kvm" {
			n = max(1, n/max(1, g.cpus))
		}
	}
	out := &consoleLog{w: os.Stdout}
	results := make([]result, len(targets))
	slots := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, t := range targets {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			results[i] = result{name: t.Name, release: ks[i].Release, outcome: "not run: " + ctx.Err().Error()}
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			results[i] = runTarget(ctx, g, t, ks[i], suite, out)
		}()
	}
	wg.Wait()
	return results
}

// report prints the failures and a line per target, and returns the
// exit code: 1 when a target did not pass.
func report(results []result) int {
	// The failures again, just above the summary: a CI log is often read
	// from its tail, where the guests' consoles have long scrolled by.
	for _, r := range results {
		if len(r.failures) == 0 {
			continue
		}
		fmt.Printf("\nvmtest %s failed:\n", r.name)
		for _, line := range r.failures {
			fmt.Printf("  %s\n", line)
		}
	}
	fmt.Println("\nvmtest summary:")
	failed := false
	for _, r := range results {
		fmt.Printf("  %-8s %-24s %-6s %s\n", r.name, r.release, r.took, r.outcome)
		failed = failed || r.outcome != "ok"
	}
	if failed {
		return 1
	}
	return 0
}

// result is how one target's guest ended.
type result struct {
	name, release, outcome string
	took                   time.Duration
	failures               []string // what the console said of failed tests
}

// runTarget runs the suite (or the target's command) in a guest on k,
// its console written to out under the target's name, and returns how
// it ended.
func runTarget(ctx context.Context, g guestFlags, t vmtest.Target, k *vmtest.Kernel, suite *vmtest.Suite, out *consoleLog) result {
	o := g.options(k)
	if t.VM.NumCPUs > 0 {
		o.CPUs = t.VM.NumCPUs
	}
	if mb, _ := t.MemoryMB(); mb > 0 {
		o.MemoryMB = mb
	}
	o.KernelArgs = strings.TrimSpace(t.KernelArgs + " " + g.kernelArgs)
	o.Env = append(os.Environ(), suite.Env...)
	if t.Run != "" {
		o.Env = append(o.Env, vmtest.RunEnv+"="+t.Run)
	}
	var fails failureLog
	o.Console = out.prefixed(t.Name, &fails)
	argv := []string{"/bin/sh", suite.Script}
	if t.Command != "" {
		argv = []string{"/bin/sh", "-c", t.Command}
	}
	out.printf("=== vmtest %s: %s (%d CPUs, %s)\n", t.Name, k.Release, o.CPUs, o.Accel)
	start := time.Now()
	st, err := vmtest.Run(ctx, o, argv)
	r := result{name: t.Name, release: k.Release, took: time.Since(start).Round(time.Second)}
	switch {
	case err != nil:
		r.outcome = "ERROR: " + err.Error()
	case st != 0:
		r.outcome = fmt.Sprintf("FAIL (exit %d)", st)
	default:
		r.outcome = "ok"
	}
	if r.outcome != "ok" {
		r.failures = fails.lines()
	}
	out.printf("=== vmtest %s: %s in %s\n", t.Name, r.outcome, r.took)
	return r
}

// consoleLog writes the consoles of guests running at once to one
// writer, a whole line at a time, each line under its guest's name.
type consoleLog struct {
	mu sync.Mutex
	w  io.Writer
}

func (c *consoleLog) printf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(c.w, format, args...)
}

// prefixed returns a writer for one guest's console, which vmtest.Run
// writes a line per call. Each line also goes to fails, when not nil.
func (c *consoleLog) prefixed(name string, fails *failureLog) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, line := range strings.SplitAfter(string(p), "\n") {
			if line != "" {
				fmt.Fprintf(c.w, "[%s] %s", name, line)
				if fails != nil {
					fails.add(line)
				}
			}
		}
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
