package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/relayfmt"
)

// listFlag is a flag that may repeat and takes comma-separated lists.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// sizeFlag takes a byte count with an optional K, M or G suffix (powers of
// 1024): 4K, 256K, 1M.
type sizeFlag int

func (s *sizeFlag) String() string { return strconv.Itoa(int(*s)) }

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func parseSize(v string) (int, error) {
	mult := 1
	t := strings.ToUpper(strings.TrimSpace(v))
	t = strings.TrimSuffix(t, "IB")
	t = strings.TrimSuffix(t, "B")
	switch {
	case strings.HasSuffix(t, "K"):
		mult, t = 1<<10, t[:len(t)-1]
	case strings.HasSuffix(t, "M"):
		mult, t = 1<<20, t[:len(t)-1]
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<30, t[:len(t)-1]
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("size %q: want a positive number with an optional K, M or G suffix (4K, 256K, 1M)", v)
	}
	return n * mult, nil
}

const recordSynopsis = `record -o DIR -e EVENT[,EVENT...] [flags] [-- COMMAND ARGS...]

Records tracepoints into DIR until Ctrl-C/SIGTERM, --duration, or the
COMMAND's exit (kconsume then exits with its status). EVENT is
system:name, a glob (sched:*) or a bare name; see kconsume list.`

func record(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("record", recordSynopsis, "kconsume record -o /tmp/t -e sched:sched_switch,syscalls:sys_enter_getpid --duration 5s", stderr)
	var (
		events, comms listFlag
		pids          listFlag
		prof          profileFlag
		objects       listFlag
		out           = fs.String("o", "", "output `directory` (created; must be empty unless --force)")
		cgroup        = fs.String("cgroup", "", "record only tasks in this cgroup v2 `directory` and below")
		subbuf        = sizeFlag(consumer.DefaultSubbufSize)
		nsub          = fs.Int("n-subbufs", consumer.DefaultNSubbufs, "sub-buffers per CPU, at least 2")
		mode          = fs.String("mode", "discard", "when sub-buffers are full: discard new records, or overwrite the oldest (flight recorder)")
		global        = fs.Bool("global", false, "one buffer and one stream file for all CPUs")
		transport     = fs.String("transport", "auto", "auto, ringbuf (Linux 5.8+) or perf")
		clock         = fs.String("clock", "mono", "mono, boot (5.8+) or tai (6.1+)")
		syscalls      = fs.String("syscalls", "auto", "how syscalls:* events are recorded: raw (from sys_enter/sys_exit: cheaper per event, but runs on every syscall), tracepoint (each event's own), or auto (raw where the kernel allows)")
		duration      = fs.Duration("duration", 0, "stop after this long (0: until Ctrl-C or the command's exit)")
		ring          = sizeFlag(consumer.DefaultRingSize)
		latency       = fs.Duration("latency", consumer.DefaultLatency, "longest a record waits in a ring before the consumer picks it up")
		force         = fs.Bool("force", false, "replace a trace already in the output directory")
		session       = fs.String("session", "", "session `name` for kconsume ctl (default: the output directory's name)")
		quiet         = fs.Bool("q", false, "no live status line")
		synthFile     = fs.String("synth", "", "also define the synthetic events in this `file` (one definition per line)")
		metrics       = fs.String("metrics", "", "serve the per-CPU counters in Prometheus text format at http://`addr`/metrics")
	)
	fs.Var(&events, "e", "`event`s to record (repeat or separate with commas)")
	fs.Var(&pids, "pid", "record only these thread or process `id`s (repeat or commas)")
	fs.Var(&objects, "bpf", "also load this BPF object `file` built on bpf/kc_synth.h and record the synthetic events it declares (repeat or commas)")
	fs.Var(&comms, "comm", "record only tasks with this command `name` (repeat or commas)")
	fs.Var(&subbuf, "subbuf-size", "sub-buffer `size` (a multiple of 4K)")
	fs.Var(&ring, "ring-size", "BPF ring buffer `size` per CPU (a power of two)")
	fs.Var(&prof, "profile", "`name` of the event and field naming: ftrace (tracefs names) or lttng (lttng-modules names and a statedump, for LTTng's analyses and Trace Compass)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	cfg := consumer.Config{
		Events:     events,
		Cgroup:     *cgroup,
		Comms:      comms,
		SubbufSize: int(subbuf),
		NSubbufs:   *nsub,
		Global:     *global,
		RingSize:   int(ring),
		Latency:    *latency,
	}
	if *out == "" {
		return usageError{errors.New("-o DIR is required")}
	}
	if len(events) == 0 && len(objects) == 0 {
		return usageError{errors.New("-e EVENT or --bpf FILE is required (see kconsume list)")}
	}
	for _, p := range pids {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return usageError{fmt.Errorf("--pid %q: not a process id", p)}
		}
		cfg.PIDs = append(cfg.PIDs, n)
	}
	var err error
	if cfg.Mode, err = parseMode(*mode); err != nil {
		return usageError{err}
	}
	if cfg.Transport, err = parseTransport(*transport); err != nil {
		return usageError{err}
	}
	if cfg.Clock, err = parseClock(*clock); err != nil {
		return usageError{err}
	}
	if cfg.Syscalls, err = parseSyscalls(*syscalls); err != nil {
		return usageError{err}
	}
	if *duration < 0 {
		return usageError{fmt.Errorf("--duration %v is negative", *duration)}
	}
	for _, o := range objects {
		spec, err := consumer.LoadObject(o)
		if err != nil {
			return usageError{err}
		}
		cfg.Objects = append(cfg.Objects, spec)
	}
	if *synthFile != "" || len(objects) > 0 || slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, consumer.SynthSystem+":") }) {
		if cfg.Synth, err = synthDefs(*synthFile); err != nil {
			return err
		}
	}
	cfg.Dir = *out
	if err := cfg.Check(); err != nil {
		return usageError{err}
	}
	if err := checkPrivileges(); err != nil {
		return err
	}
	name := *session
	if name == "" {
		name = filepath.Base(filepath.Clean(*out))
	}
	if err := control.CheckName(name); err != nil {
		return usageError{err}
	}
	// The session's name is taken first: a second record with the same
	// name must not touch the first one's output.
	h := &handler{}
	srv, err := control.Serve(controlRoot, name, h)
	if err != nil {
		if errors.Is(err, control.ErrRunning) {
			return usageError{fmt.Errorf("%w: stop it first or pick another --session", err)}
		}
		return err
	}
	defer srv.Close()
	if err := prepareDir(*out, *force); err != nil {
		return err
	}
	cfg.Dir = *out
	cfg.Env = map[string]string{"session": name}
	if err := prof.configure(&cfg, name); err != nil {
		return err
	}

	s, err := consumer.New(cfg)
	if err != nil {
		if errors.Is(err, consumer.ErrConfig) || errors.Is(err, consumer.ErrUnknownEvent) {
			return usageError{err}
		}
		return err
	}
	h.set(s)
	if _, why := s.RawSyscalls(); why != nil && cfg.Syscalls == consumer.SyscallsAuto {
		fmt.Fprintf(stderr, "kconsume record: syscall events through their tracepoints: raw syscall path: %v\n", why)
	}
	if *metrics != "" {
		addr, stopMetrics, err := serveMetrics(*metrics, h)
		if err != nil {
			s.Close()
			return usageError{err}
		}
		defer stopMetrics()
		fmt.Fprintf(stderr, "kconsume record: metrics at http://%s/metrics\n", addr)
	}
	if err := prof.begin(s, stderr); err != nil {
		s.Close()
		return err
	}
	r := &recorder{s: s, srv: srv, stdout: stdout, stderr: stderr, start: time.Now(), live: !*quiet && isTerminal(os.Stderr)}
	return r.run(fs.Args(), *duration)
}

func parseMode(m string) (relayfmt.Mode, error) {
	switch m {
	case "discard":
		return relayfmt.NoOverwrite, nil
	case "overwrite":
		return relayfmt.Overwrite, nil
	}
	return 0, fmt.Errorf("--mode %q: want discard or overwrite", m)
}

func parseTransport(t string) (consumer.Transport, error) {
	for _, v := range []consumer.Transport{consumer.Auto, consumer.Ringbuf, consumer.Perf} {
		if v.String() == t {
			return v, nil
		}
	}
	return 0, fmt.Errorf("--transport %q: want auto, ringbuf or perf", t)
}

func parseSyscalls(y string) (consumer.Syscalls, error) {
	for _, v := range []consumer.Syscalls{consumer.SyscallsAuto, consumer.SyscallsRaw, consumer.SyscallsTracepoint} {
		if v.String() == y {
			return v, nil
		}
	}
	return 0, fmt.Errorf("--syscalls %q: want auto, raw or tracepoint", y)
}

func parseClock(c string) (consumer.Clock, error) {
	for _, v := range []consumer.Clock{consumer.Mono, consumer.Boot, consumer.TAI} {
		if v.String() == c {
			return v, nil
		}
	}
	return 0, fmt.Errorf("--clock %q: want mono, boot or tai", c)
}

// Capability bits (include/uapi/linux/capability.h).
const (
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

// checkPrivileges fails with one line when the process can neither load
// BPF programs nor open tracepoints.
func checkPrivileges() error {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil // let the kernel say no
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return nil
			}
			has := func(c uint) bool { return caps&(1<<c) != 0 }
			if has(capSysAdmin) || has(capBPF) && has(capPerfmon) {
				return nil
			}
			return errors.New("needs root, or CAP_BPF and CAP_PERFMON, to load BPF programs and attach to tracepoints")
		}
	}
	return nil
}

// prepareDir creates dir, or accepts an empty one; a directory holding
// files is refused unless force, which removes a previous trace's files
// only. A symlink is refused: the trace would land elsewhere.
func prepareDir(dir string, force bool) error {
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("output directory: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("output directory: %w", err)
	case fi.Mode()&os.ModeSymlink != 0:
		return usageError{fmt.Errorf("output directory %s is a symlink: give the real path", dir)}
	case !fi.IsDir():
		return usageError{fmt.Errorf("output %s exists and is not a directory", dir)}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	if len(entries) == 0 {
		return nil
	}
	if !force {
		return usageError{fmt.Errorf("output directory %s is not empty (use --force to replace the trace in it)", dir)}
	}
	for _, e := range entries {
		n := e.Name()
		if n == "metadata" || n == ".metadata.tmp" || strings.HasPrefix(n, "trace") && isTraceName(n) {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("--force: %w", err)
			}
			continue
		}
		return usageError{fmt.Errorf("output directory %s holds %s, which is not part of a trace: not removing it", dir, n)}
	}
	return nil
}

func isTraceName(n string) bool {
	rest := strings.TrimPrefix(n, "trace")
	if rest == "" {
		return true
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// recorder runs a session to its end and reports on it.
type recorder struct {
	s              *consumer.Session
	srv            *control.Server
	stdout, stderr io.Writer
	start          time.Time
	live           bool
	lastRecords    uint64
	lastTick       time.Time
}

// run records until a signal, the duration, the command's exit or a
// channel failure (a full disk), then closes the session so every file is
// whole, and prints the summary. It returns the command's exit status as
// an exitError when the command failed.
func (r *recorder) run(command []string, duration time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	if err := r.s.Start(); err != nil {
		r.s.Close()
		return err
	}
	_ = r.srv.Refresh()
	var cmd *exec.Cmd
	cmdDone := make(chan error, 1)
	if len(command) > 0 {
		cmd = exec.Command(command[0], command[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			r.s.Close()
			return fmt.Errorf("starting %s: %w", command[0], err)
		}
		go func() { cmdDone <- cmd.Wait() }()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	r.lastTick = r.start
	var cmdErr, failure error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case cmdErr = <-cmdDone:
			cmd = nil
			break loop
		case <-tick.C:
			if err := r.s.Channel().Err(); err != nil {
				failure = err
				break loop
			}
			_ = r.srv.Refresh()
			if r.live {
				r.status()
			}
		}
	}
	if r.live {
		fmt.Fprint(r.stderr, "\r\033[K")
	}
	if cmd != nil {
		// Stopped by a signal or the duration: the command goes on.
		fmt.Fprintf(r.stderr, "kconsume record: stopped; %s (pid %d) keeps running\n", cmd.Path, cmd.Process.Pid)
	}
	closeErr := r.s.Close()
	stats, _ := r.s.Stats()
	r.summary(stats, r.s.Drainer())
	if failure == nil {
		failure = closeErr
	}
	if failure != nil {
		if errors.Is(failure, syscall.ENOSPC) {
			return fmt.Errorf("disk full: recording stopped; every file in the trace is whole and readable: %w", failure)
		}
		return fmt.Errorf("recording stopped: %w", failure)
	}
	var ee *exec.ExitError
	if errors.As(cmdErr, &ee) {
		return exitError{ee.ExitCode()}
	}
	return cmdErr
}

// exitError carries the traced command's exit status out of run.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }

func totals(stats []consumer.CPUStats) (records, bytes, discarded uint64) {
	for _, c := range stats {
		records += c.Channel.Records
		bytes += c.Channel.Bytes
		discarded += c.Discarded()
	}
	return
}

// status rewrites the live line on the terminal.
func (r *recorder) status() {
	stats, err := r.s.Stats()
	if err != nil {
		return
	}
	records, bytes, discarded := totals(stats)
	now := time.Now()
	rate := float64(records-r.lastRecords) / now.Sub(r.lastTick).Seconds()
	r.lastRecords, r.lastTick = records, now
	fmt.Fprintf(r.stderr, "\r\033[K%s  %s events/s  %s written  %d discarded", now.Sub(r.start).Truncate(time.Second), human(rate), humanBytes(bytes), discarded)
}

// summary prints per-CPU counts, losses by layer and advice.
func (r *recorder) summary(stats []consumer.CPUStats, d consumer.DrainerStats) {
	w := r.stdout
	records, bytes, discarded := totals(stats)
	fmt.Fprintf(w, "%d events recorded (%s) in %s, %d discarded\n", records, humanBytes(bytes), time.Since(r.start).Truncate(time.Millisecond), discarded)
	fmt.Fprintf(w, "%-5s %12s %12s %12s %12s %12s %12s %10s\n", "cpu", "events", "ring-lost", "missed", "dropped", "overwritten", "invalid", "reordered")
	var kernel, missed, dropped, over uint64
	for _, c := range stats {
		if c.Emitted == 0 && c.Channel.Records == 0 && c.Discarded() == 0 && c.Missed == 0 {
			continue
		}
		fmt.Fprintf(w, "%-5d %12d %12d %12d %12d %12d %12d %10d\n", c.CPU, c.Channel.Records, c.KernelLost, c.Missed, c.Channel.Dropped, c.Channel.Overwritten, c.Channel.Invalid+c.Channel.TooLarge+c.Undecodable, c.Reordered)
		kernel += c.KernelLost
		missed += c.Missed
		dropped += c.Channel.Dropped
		over += c.Channel.Overwritten
	}
	if missed > 0 {
		fmt.Fprintf(w, "note: the kernel skipped the recorder %d times because another BPF program was running on the CPU: at most that many events lost; those known lost are in the discarded count\n", missed)
	}
	if kernel > 0 {
		fmt.Fprintf(w, "advice: %d events were lost in the kernel because the ring was full: raise --ring-size or lower --latency\n", kernel)
		if d.Late > 0 {
			// No drain speed saves records produced while the consumer
			// does not run: only room in the ring does.
			fmt.Fprintf(w, "note: %d times the consumer ran more than --latency after it asked to, once %s late: its CPU was busy or, on a VM, not run by the host; a ring that holds that long is what keeps such records\n", d.Late, d.LongestOverrun.Round(10*time.Microsecond))
		}
	}
	if dropped > 0 {
		fmt.Fprintf(w, "advice: %d events were dropped because every sub-buffer was full: raise --subbuf-size or --n-subbufs, or write to a faster disk\n", dropped)
	}
	if over > 0 {
		fmt.Fprintf(w, "note: overwrite mode kept the newest data; %d older events were overwritten\n", over)
	}
}

func human(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.1fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func humanBytes(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
