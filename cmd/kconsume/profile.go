package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/profile"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/statedump"
)

// profileFlag is record's --profile: a profile name, checked when parsed.
type profileFlag struct {
	p *profile.Profile
	// warn is what configure has to say once record can say it.
	warn []string
}

func (f *profileFlag) String() string {
	if f.p == nil {
		return profile.Ftrace.Name
	}
	return f.p.Name
}

// Set fails for an unknown name with the list of known ones.
func (f *profileFlag) Set(s string) error {
	p, err := profile.Lookup(s)
	if err != nil {
		return err
	}
	f.p = p
	return nil
}

func (f *profileFlag) lttng() bool { return f.p == profile.LTTng }

// configure prepares cfg for the profile: under lttng, the statedump's
// events are recorded, the scheduler priorities are written as
// lttng-modules writes them (Profile.Adjust), the contexts go into the
// stream's event context, and the trace is written
// through the profile's sink, which names the metadata's classes and env
// as lttng-modules does.
// It runs once the output directory exists. It fails when the profile
// cannot describe the session (lttng and --global: LTTng's readers take
// the CPU from each packet, which a global stream does not have).
func (f *profileFlag) configure(cfg *consumer.Config, session string) error {
	if !f.lttng() {
		return nil
	}
	if cfg.Global {
		return usageError{errors.New("--profile lttng needs per-CPU streams: LTTng's readers take each event's CPU from its packet; drop --global")}
	}
	env, err := profile.LTTngEnv(session, time.Now())
	if err != nil {
		return err
	}
	if err := f.build(cfg); err != nil {
		return err
	}
	cfg.Adjust = f.p.Adjust()
	// LTTng writes its contexts in the stream's event context.
	cfg.ContextsInStream = true
	cfg.Synth = append(cfg.Synth, statedump.Events()...)
	cfg.Events = append(cfg.Events, statedump.Patterns()...)
	inner := cfg.Sink // relayd's, when streaming
	if inner == nil {
		if inner, err = relayfmt.NewDirSink(cfg.Dir); err != nil {
			return err
		}
	}
	cfg.Sink = profile.LTTng.Sink(inner, env)
	return nil
}

// begin starts recording and, under lttng, writes the statedump first,
// as lttng-modules does when a session starts. It fails when the session
// cannot start or the statedump cannot read /proc.
func (f *profileFlag) begin(s *consumer.Session, stderr io.Writer) error {
	if !f.lttng() {
		return nil
	}
	for _, w := range f.warn {
		fmt.Fprintf(stderr, "kconsume record: %s\n", w)
	}
	if err := s.Start(); err != nil {
		return err
	}
	_, err := runStatedump(s, statedumps.Add(1), stderr)
	return err
}

// statedumps numbers the statedumps of this process's session.
var statedumps atomic.Uint32

// ctlStatedump runs kconsume ctl statedump: one more statedump into the
// stream of cpu (0 when cpu < 0). It fails for a session that does not
// record the statedump's events (not --profile lttng) or is stopped.
func ctlStatedump(s *consumer.Session, cpu int) (string, error) {
	if s.Synth(statedump.Start) == nil {
		return "", errors.New("statedump needs a session recording with --profile lttng")
	}
	if cpu < 0 {
		cpu = 0
	}
	if cpu >= s.CPUs() {
		return "", fmt.Errorf("--cpu %d: the session has CPUs 0..%d", cpu, s.CPUs()-1)
	}
	var warn strings.Builder
	seq := statedumps.Add(1)
	d := &statedump.Dumper{Seq: seq, CPU: cpu, Stopped: func(err error) bool { return errors.Is(err, consumer.ErrStopped) }}
	start := time.Now()
	c, err := d.Run(s)
	if err != nil {
		return "", err
	}
	if c.Lost > 0 {
		fmt.Fprintf(&warn, " (%d lost: ring full)", c.Lost)
	}
	return fmt.Sprintf("statedump %d: %d threads of %d processes, %d file descriptors, %d block devices, %d network interface addresses, %d interrupts, %d CPUs, %d cgroups: %d events in %v%s\n",
		seq, c.Threads, c.Processes, c.FDs, c.BlockDevices, c.NetInterfaces, c.Interrupts, c.CPUs, c.Cgroups, c.Emitted, time.Since(start).Round(time.Millisecond), warn.String()), nil
}

// runStatedump emits one statedump into s and warns about lost events.
func runStatedump(s *consumer.Session, seq uint32, stderr io.Writer) (statedump.Counts, error) {
	d := &statedump.Dumper{Seq: seq, Stopped: func(err error) bool { return errors.Is(err, consumer.ErrStopped) }}
	c, err := d.Run(s)
	if err != nil {
		return c, fmt.Errorf("statedump: %w", err)
	}
	if c.Lost > 0 {
		fmt.Fprintf(stderr, "kconsume record: statedump: %d of %d events lost (ring full): raise --ring-size\n", c.Lost, c.Lost+c.Emitted)
	}
	return c, nil
}

// build puts the profile's own program in place of the tracepoints of
// the events it builds (profile.Built) that cfg's patterns name. It fixes
// cfg's transport, as the session would choose it, since the program is
// built for one. Where the kernel cannot run the program (tp_btf: Linux
// 5.5 and kernel BTF) the tracepoints stay, under their ftrace names, and
// a warning says so. It fails when tracefs cannot be read or the built-in
// object cannot be read.
func (f *profileFlag) build(cfg *consumer.Config) error {
	fs, err := tracefs.Find()
	if err != nil {
		return err
	}
	events, named, err := profile.Replace(fs, cfg.Events, f.p.BuiltEvents())
	if err != nil || len(named) == 0 {
		return err
	}
	if why := tracingProgramsMissing(named); why != nil {
		for _, b := range named {
			f.warn = append(f.warn, fmt.Sprintf("%s keeps ftrace's fields and name: the lttng profile builds %s with a tp_btf program: %v", b.Ftrace, b.LTTng, why))
		}
		return nil
	}
	if cfg.Transport == consumer.Auto {
		cfg.Transport = consumer.Perf
		if features.HaveMapType(ebpf.RingBuf) == nil {
			cfg.Transport = consumer.Ringbuf
		}
	}
	load := gen.LoadLTTng
	if cfg.Transport == consumer.Perf {
		load = gen.LoadLTTngPerf
	}
	spec, err := load()
	if err != nil {
		return fmt.Errorf("profile lttng: built-in program: %w", err)
	}
	// Where tp_btf programs run preemptibly, a task preempted inside the
	// fork program would make the kernel skip it for the other tasks of
	// its CPU; its kprobe twin runs with preemption off.
	fork, twin := gen.LTTngProgLttngSchedProcessForkKprobe, gen.LTTngProgLttngSchedProcessFork
	if !recorder.Preemptibility().On || recorder.KprobeFuncs() != nil {
		fork, twin = twin, fork
	}
	if spec.Programs[fork] == nil {
		return fmt.Errorf("profile lttng: built-in program: no %s", fork)
	}
	delete(spec.Programs, twin)
	// Only the events asked for are recorded: the others' keys stay unset.
	for name := range spec.Variables {
		if ev, ok := strings.CutPrefix(name, "kc_key_"); ok && !slices.ContainsFunc(named, func(b profile.Built) bool { return b.Synth == ev }) {
			delete(spec.Variables, name)
		}
	}
	cfg.Events = events
	cfg.Objects = append(cfg.Objects, spec)
	return nil
}

// tracingProgramsMissing says why tp_btf programs on the tracepoints of
// built cannot run here, or nil: the kernel needs BTF, and the typedef
// btf_trace_NAME through which tp_btf finds a tracepoint's arguments
// (Linux 5.5, kernel/bpf/btf.c).
func tracingProgramsMissing(built []profile.Built) error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("no kernel BTF: %w", err)
	}
	for _, b := range built {
		_, name, _ := strings.Cut(b.Ftrace, ":")
		var td *btf.Typedef
		if err := spec.TypeByName("btf_trace_"+name, &td); err != nil {
			return fmt.Errorf("kernel BTF has no btf_trace_%s (tp_btf needs Linux 5.5): %w", name, err)
		}
	}
	return nil
}
