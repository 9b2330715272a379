package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/internal/control"
)

const recordSynopsis = `record -o DIR -e EVENT[,EVENT...] [flags] [-- COMMAND ARGS...]

Records tracepoints into DIR until Ctrl-C/SIGTERM, --duration, or the
COMMAND's exit (kconsume then exits with its status). EVENT is
system:name, a glob (sched:*) or a bare name; see kconsume list.
With --rotate-size or --rotate-interval the trace is cut into chunks,
each a complete trace closed into DIR/archives/BEGIN-END-ID/, the oldest
deleted first under --max-size or --max-chunks (docs/rotation.md).`

// recordOpts is what record's flags ask for.
type recordOpts struct {
	cfg       consumer.Config
	out       string
	session   string
	synthFile string
	metrics   string
	duration  time.Duration
	force     bool
	quiet     bool
	command   []string
	relay     *relaydOut
	rot       *rotateFlags
	prof      profileFlag
	// sessionDir is the -o directory when the trace went into its
	// kernel subdirectory (--profile lttng), or empty.
	sessionDir string
	nice       int
	niceSet    bool // --nice given
}

// recordFlags is what record's flags give the session's configuration,
// as parsed.
type recordFlags struct {
	events                           eventsFlag
	filters                          filterFlags
	triggers                         triggerFlags
	stacks                           stackFlags
	stackDepth                       int
	comms, pids, objects, contexts   listFlag
	subbuf, ring, memory             sizeFlag
	mode, transport, clock, syscalls string
	cgroup                           string
	nsub                             int
	global                           bool
	latency                          time.Duration
}

// defineRecordFlags declares record's flags, into o and f.
func defineRecordFlags(fs *flag.FlagSet, o *recordOpts, f *recordFlags) {
	fs.StringVar(&o.out, "o", "", "output `directory` (created; must be empty unless --force)")
	fs.StringVar(&f.cgroup, "cgroup", "", "record only tasks in this cgroup v2 `directory` and below")
	fs.IntVar(&f.nsub, "n-subbufs", consumer.DefaultNSubbufs, "sub-buffers per CPU, at least 2 (where the BPF programs write the packets, the ring holds them and this is not used)")
	fs.StringVar(&f.mode, "mode", "discard", "when sub-buffers are full: discard new records, or overwrite the oldest (flight recorder)")
	fs.BoolVar(&f.global, "global", false, "one buffer and one stream file for all CPUs")
	fs.StringVar(&f.transport, "transport", "auto", "auto, ringbuf (Linux 5.8+) or perf")
	fs.StringVar(&f.clock, "clock", "mono", "mono, boot (5.8+) or tai (6.1+)")
	fs.StringVar(&f.syscalls, "syscalls", "auto", "how syscalls:* events are recorded: fentry (on each recorded syscall's function: other syscalls pay nothing; for a few events), raw (from sys_enter/sys_exit: cheaper per event, but runs on every syscall), tracepoint (each event's own), or auto (fentry for up to 32 events, else raw, where the kernel allows)")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0: until Ctrl-C or the command's exit)")
	fs.DurationVar(&f.latency, "latency", 0, "longest a record of another process waits in a ring before the consumer picks it up (0: no bound, the consumer wakes when a quarter of a ring is full; each bound costs a wakeup per period while data arrives, and keeps the consumer reading records: the BPF programs then write no packets)")
	fs.BoolVar(&o.force, "force", false, "replace a trace already in the output directory")
	fs.StringVar(&o.session, "session", "", "session `name` for kconsume ctl (default: the output directory's name)")
	fs.BoolVar(&o.quiet, "q", false, "no live status line")
	fs.StringVar(&o.synthFile, "synth", "", "also define the synthetic events in this `file` (one definition per line)")
	fs.StringVar(&o.metrics, "metrics", "", "serve the per-CPU counters in Prometheus text format at http://`addr`/metrics")
	fs.Var(&f.events, "e", "`event`s to record (repeat or separate with commas); a probe and its fetch arguments in one quoted value: 'kprobe:FUNC ARGS', 'uprobe:PATH:SYMBOL ARGS' (docs/probes.md)")
	f.filters.events = &f.events
	fs.Var(&f.filters, "f", "keep only the events of the -e before it whose fields pass this `expression`, in ftrace's event filter language (docs/filters.md): -e sched:sched_switch -f 'prev_comm == \"nginx\"'")
	f.stacks.events = &f.events
	fs.Var(&f.stacks, "stack", "record the call chain of each event of the -e before it, or of every event when no -e comes before: `kernel`, user or both (docs/stacks.md)")
	fs.Var(&f.contexts, "context", "record these contexts with every event, LTTng's names: procname, pid, tid, ppid, prio, nice, vpid, vtid, vppid, cpu_id, cgroup, perf:cpu:COUNTER, and callstack-kernel and callstack-user (--stack kernel, --stack user) (repeat or commas; docs/stacks.md)")
	fs.IntVar(&f.stackDepth, "stack-depth", 0, "most `frames` of a call chain (default: the kernel's limit, kernel.perf_event_max_stack, 127)")
	fs.Var(filterFlag{&f.filters}, "filter", "keep only the events of `EVENT:EXPR` (EVENT as -e takes it, globs too) whose fields pass EXPR, in ftrace's event filter language (docs/filters.md)")
	fs.Var(&f.triggers, "trigger", "`'EVENT[ FILTER] : ACTION[, every DURATION]'`: on an event of EVENT whose fields pass FILTER (ftrace's filter language), the recorder itself takes ACTION: snapshot (--mode overwrite: save the flight recorder's buffers, the event and what came before it), stop or start recording, or rotate (close the trace's chunk, the event in it, and begin the next: docs/rotation.md); at most once per DURATION (default 1s); the event must be recorded (-e); repeatable (docs/triggers.md)")
	fs.Var(&f.pids, "pid", "record only these thread or process `id`s (repeat or commas)")
	fs.Var(&f.objects, "bpf", "also load this BPF object `file` built on bpf/kc_synth.h and record the synthetic events it declares (repeat or commas)")
	fs.Var(&f.comms, "comm", "record only tasks with this command `name` (repeat or commas)")
	fs.Var(&f.subbuf, "subbuf-size", "sub-buffer `size` (a multiple of 4K); where the BPF programs write the packets, a packet is the largest power of two up to it (16K at least)")
	fs.Var(&f.ring, "ring-size", "BPF ring buffer `size` per CPU (a power of two)")
	fs.IntVar(&o.nice, "nice", defaultNice, "nice `value` of kconsume's threads, -20..19: well below the workload's, the consumer gets the CPU before the rings fill under a saturating load (needs CAP_SYS_NICE; the COMMAND and the Go runtime's monitor thread keep kconsume's own value)")
	fs.Var(&f.memory, "memory", "buffer memory per CPU, ring and sub-buffers together, split by kconsume (a ring of the largest power of two up to 3/4, the rest in 8 sub-buffers); replaces --ring-size, --subbuf-size and --n-subbufs")
	o.relay = relaydFlags(fs)
	o.rot = defineRotateFlags(fs)
	fs.Var(&o.prof, "profile", "`name` of the event and field naming: ftrace (tracefs names) or lttng (lttng-modules names and a statedump, for LTTng's analyses and Trace Compass)")
}

// parseRecord parses record's arguments into options and a session
// configuration that passed Config.Check. It fails with a usageError
// naming the bad flag, or flag.ErrHelp.
func parseRecord(args []string, stderr io.Writer) (*recordOpts, error) {
	fs := newFlags("record", recordSynopsis, "kconsume record -o /tmp/t -e sched:sched_switch,syscalls:sys_enter_getpid --duration 5s", stderr)
	var o recordOpts
	f := recordFlags{subbuf: sizeFlag(consumer.DefaultSubbufSize), ring: sizeFlag(consumer.DefaultRingSize)}
	defineRecordFlags(fs, &o, &f)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	o.command = fs.Args()
	fs.Visit(func(fl *flag.Flag) { o.niceSet = o.niceSet || fl.Name == "nice" })
	if o.nice < -20 || o.nice > 19 {
		return nil, usageError{fmt.Errorf("--nice %d: want -20..19", o.nice)}
	}
	if err := applyMemory(fs, int(f.memory), (*int)(&f.ring), (*int)(&f.subbuf), &f.nsub); err != nil {
		return nil, usageError{err}
	}
	if o.out == "" && !o.relay.enabled() {
		return nil, usageError{errors.New("-o DIR is required (or --relayd URL)")}
	}
	if len(f.events.list) == 0 && len(f.objects) == 0 {
		return nil, usageError{errors.New("-e EVENT or --bpf FILE is required (see kconsume list)")}
	}
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	if o.duration < 0 {
		return nil, usageError{fmt.Errorf("--duration %v is negative", o.duration)}
	}
	if err := o.rot.check(fs, cfg, o.relay, o.out != ""); err != nil {
		return nil, usageError{err}
	}
	if err := f.addSynth(&cfg, o.synthFile); err != nil {
		return nil, err
	}
	o.session = sessionName(o.session, o.out)
	if o.prof.lttng() && o.out != "" && filepath.Base(filepath.Clean(o.out)) != "kernel" {
		// LTTng's analyses find the tracer's version only in a trace
		// whose directory is named kernel, as lttng lays out a session
		// (SESSION/kernel/): the directory the user named becomes the
		// session's, which the analyses and babeltrace2 both take.
		o.sessionDir = o.out
		o.out = filepath.Join(o.out, "kernel")
	}
	cfg.Dir = o.out
	if err := o.relay.check(cfg); err != nil {
		return nil, usageError{err}
	}
	if err := control.CheckName(o.session); err != nil {
		return nil, usageError{err}
	}
	o.cfg = cfg
	return &o, nil
}

// config returns the session's configuration the flags ask for, but its
// directory and synthetic events. It fails with a usageError naming the
// bad flag: a process id that is none, or an unknown mode, transport,
// clock or syscall path.
func (f *recordFlags) config() (consumer.Config, error) {
	cfg := consumer.Config{
		Events:     f.events.list,
		Filters:    f.filters.list,
		Triggers:   f.triggers.list,
		StackDepth: f.stackDepth,
		Cgroup:     f.cgroup,
		Comms:      f.comms,
		SubbufSize: int(f.subbuf),
		NSubbufs:   f.nsub,
		Global:     f.global,
		RingSize:   int(f.ring),
		Latency:    f.latency,
	}
	// LTTng's callstack contexts are call chains (--stack) for every
	// event, which LTTng users ask for by those names.
	cfg.Stacks = slices.Clone(f.stacks.list)
	for _, c := range f.contexts {
		switch c {
		case "callstack-kernel":
			cfg.Stacks = append(cfg.Stacks, consumer.EventStack{Stack: consumer.StackKernel})
		case "callstack-user":
			cfg.Stacks = append(cfg.Stacks, consumer.EventStack{Stack: consumer.StackUser})
		default:
			cfg.Contexts = append(cfg.Contexts, c)
		}
	}
	for _, p := range f.pids {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return cfg, usageError{fmt.Errorf("--pid %q: not a process id", p)}
		}
		// A thread id answers kill(2) as its process's id does; a task
		// that exits later ends its events, as perf's --pid does.
		if err := syscall.Kill(n, 0); errors.Is(err, syscall.ESRCH) {
			return cfg, usageError{fmt.Errorf("--pid %d: no such process or thread", n)}
		}
		cfg.PIDs = append(cfg.PIDs, n)
	}
	if f.stackDepth < 0 || f.stackDepth > consumer.MaxStack {
		return cfg, usageError{fmt.Errorf("--stack-depth %d: want 1 to %d frames", f.stackDepth, consumer.MaxStack)}
	}
	var err error
	if cfg.Mode, err = parseMode(f.mode); err != nil {
		return cfg, usageError{err}
	}
	if cfg.Transport, err = parseTransport(f.transport); err != nil {
		return cfg, usageError{err}
	}
	if cfg.Clock, err = parseClock(f.clock); err != nil {
		return cfg, usageError{err}
	}
	if cfg.Syscalls, err = parseSyscalls(f.syscalls); err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
}

// addSynth loads the --bpf objects into cfg, and the synthetic events'
// definitions (the stored ones and synthFile's) when anything
// asks for synthetic events. A bad object is a usageError.
func (f *recordFlags) addSynth(cfg *consumer.Config, synthFile string) error {
	for _, obj := range f.objects {
		spec, err := consumer.LoadObject(obj)
		if err != nil {
			return usageError{err}
		}
		cfg.Objects = append(cfg.Objects, spec)
	}
	if synthFile != "" || len(f.objects) > 0 || slices.ContainsFunc(f.events.list, func(e string) bool { return strings.HasPrefix(e, consumer.SynthSystem+":") }) {
		var err error
		if cfg.Synth, err = synthDefs(synthFile); err != nil {
			return err
		}
	}
	return nil
}

// record runs kconsume record: it takes the session's name, prepares the
// output, starts the session and runs it to its end.
func record(args []string, stdout, stderr io.Writer) error {
	o, err := parseRecord(args, stderr)
	if err != nil {
		return err
	}
	if err := checkPrivileges(); err != nil {
		return err
	}
	// A reader of the output that goes away (record ... | head -1) must
	// not kill the recorder between its last drain and its cleanup,
	// leaving the control directory behind: with SIGPIPE caught, a write
	// to a closed stdout or stderr fails with EPIPE instead (os/signal),
	// which the status line and the summary pass over. A caught signal is
	// the default again in the command record starts.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	// Before the session starts its threads, which take it from theirs.
	cmdNice, prio, err := raisePriority(o.nice, o.niceSet)
	if err != nil {
		if o.niceSet {
			return err
		}
		fmt.Fprintf(stderr, "kconsume record: runs at nice %d: %v: under a saturating load the consumer may run late and the rings fill\n", cmdNice, err)
	} else {
		// For callers in the same process (tests); best effort, as
		// kconsume exits next.
		defer func() { _ = setNice(cmdNice) }()
	}
	cfg := o.cfg
	host, err := prepareHost(&cfg, stderr)
	if err != nil {
		return err
	}
	h := &handler{relay: o.relay, rot: o.rot}
	srv, err := claimOutput(o, h, stderr)
	if err != nil {
		return err
	}
	defer srv.Close()
	s, err := newRecordSession(o, &cfg, stderr)
	if err != nil {
		return err
	}
	h.set(s)
	defer o.relay.startLive(s)()
	noteFallbacks(s, cfg, host, stderr)
	if o.metrics != "" {
		addr, stopMetrics, err := serveMetrics(o.metrics, h)
		if err != nil {
			s.Close()
			return usageError{err}
		}
		defer stopMetrics()
		fmt.Fprintf(stderr, "kconsume record: metrics at http://%s/metrics\n", addr)
	}
	if err := o.prof.begin(s, stderr); err != nil {
		s.Close()
		return err
	}
	r := &recordRun{s: s, srv: srv, h: h, stdout: stdout, stderr: stderr, start: time.Now(), live: !o.quiet && isTerminal(os.Stderr), relay: o.relay, rot: o.rot, cmdNice: cmdNice, prio: prio}
	return r.run(o.command, o.duration)
}

// claimOutput takes the session's name in the control directory, served
// by h, then prepares the output directory. The name is taken first: a
// second record with the same name must not touch the first one's
// output. The caller closes the server.
func claimOutput(o *recordOpts, h *handler, stderr io.Writer) (*control.Server, error) {
	srv, err := control.Serve(controlRoot, o.session, h)
	if err != nil {
		if errors.Is(err, control.ErrRunning) {
			return nil, usageError{fmt.Errorf("%w: stop it first or pick another --session", err)}
		}
		return nil, err
	}
	if o.out != "" {
		if err := prepareDir(o.out, o.force); err != nil {
			srv.Close()
			return nil, err
		}
	}
	if o.sessionDir != "" {
		fmt.Fprintf(stderr, "kconsume record: the trace goes into %s, laid out as an LTTng session: give %s to LTTng's analyses and babeltrace2, as to kconsume report\n", o.out, o.sessionDir)
	}
	return srv, nil
}

// newRecordSession connects the relayd stream, lets the profile
// configure cfg and creates the session; on failure the stream is
// aborted, and a configuration the consumer refuses is a usageError.
func newRecordSession(o *recordOpts, cfg *consumer.Config, stderr io.Writer) (*consumer.Session, error) {
	cfg.Env = map[string]string{"session": o.session}
	if err := o.rot.open(o, cfg, stderr); err != nil {
		return nil, err
	}
	if err := o.relay.connect(cfg, o.session, stderr); err != nil {
		return nil, err
	}
	if err := o.prof.configure(cfg, o.session); err != nil {
		o.relay.abort(*cfg)
		return nil, err
	}
	s, err := consumer.New(*cfg)
	if err != nil {
		o.relay.abort(*cfg)
		if errors.Is(err, consumer.ErrConfig) || errors.Is(err, consumer.ErrUnknownEvent) {
			return nil, usageError{err}
		}
		return nil, err
	}
	return s, nil
}

// noteFallbacks tells on stderr which of the session's faster paths the
// kernel refused, and why.
func noteFallbacks(s *consumer.Session, cfg consumer.Config, host kernel, stderr io.Writer) {
	if _, why := s.RawSyscalls(); why != nil && cfg.Syscalls == consumer.SyscallsAuto {
		fmt.Fprintf(stderr, "kconsume record: syscall events through their tracepoints: raw syscall path: %v\n", host.explain(why))
	}
	if p, evs := s.Preemptible(); len(evs) > 0 {
		var sys, fprobes []string
		for _, e := range evs {
			if strings.HasPrefix(e, probe.SystemFprobes+":") {
				fprobes = append(fprobes, e)
			} else {
				sys = append(sys, e)
			}
		}
		if len(sys) > 0 {
			keep := "--syscalls raw keeps them"
			if recorder.KprobeFuncs() == nil {
				keep = "--syscalls fentry (on kprobes here) or raw keeps them"
			}
			fmt.Fprintf(stderr, "kconsume record: %s: %s recorded by programs that run preemptibly here; a task preempted inside one makes the kernel skip the other tasks' events on its CPU (counted as missed): %s\n", p.Why, listSome(sys, 3), keep)
		}
		if len(fprobes) > 0 {
			fmt.Fprintf(stderr, "kconsume record: %s: fentry and fexit probes (%s) are trampolines that run preemptibly here; a task preempted inside one makes the kernel skip the other tasks' hits on its CPU (counted as missed): kprobe: and kretprobe: probes on the same functions keep them\n", p.Why, listSome(fprobes, 3))
		}
	}
	if why := s.OwnRings(); why != nil && s.Transport() == consumer.Ringbuf && !cfg.Global {
		fmt.Fprintf(stderr, "kconsume record: records through BPF ring buffers: own rings: %v\n", host.explain(why))
	}
	if _, why := s.BTFEvents(); why != nil {
		fmt.Fprintf(stderr, "kconsume record: events through their tracepoints: BTF path: %v\n", host.explain(why))
	}
	unknown := s.BTFUnknown()
	for _, e := range slices.Sorted(maps.Keys(unknown)) {
		fmt.Fprintf(stderr, "kconsume record: %s through its tracepoint, not built from its arguments (BTF path): %s\n", e, unknown[e])
	}
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
		if n == "metadata" || n == ".metadata.tmp" || n == consumer.KernelSymbols || n == consumer.UserSymbols || strings.HasPrefix(n, "trace") && isTraceName(n) {
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

// listSome returns the first n of names joined by commas, and how many
// more there are.
func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
