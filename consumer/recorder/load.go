package recorder

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/gen"
)

// loading is the state of Load's steps: the spec being made and
// the values its variables get.
type loading struct {
	r       *Recorder
	spec    *ebpf.CollectionSpec
	set     map[string]any
	opts    *Options
	nevents int
	raw     bool // some event may take the raw syscall path
}

// Load creates the maps and the programs of transport for
// nevents events: one program told each event's key by the attach
// cookie, or on kernels before 5.15 one program copy per event with its
// key patched in. It returns the recorder with its gate closed and its
// wakeups armed, or the error of the step that failed, having released
// what it made.
func Load(cfg Config, ncpu int, transport Transport, nevents int, opts *Options) (_ *Recorder, err error) {
	r := &Recorder{cfg: cfg, ncpu: ncpu, transport: transport, btf: btfPath{keys: map[int]string{}}, fentry: fentryPath{progs: map[int]string{}, fn: map[int]string{}, exit: map[int]bool{}}}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK (64 KiB by
	// default), which a few rings exceed; later ones use memcg
	// accounting and this does nothing.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("raising RLIMIT_MEMLOCK for BPF maps: %w", err)
	}
	if opts != nil && opts.trigs != nil && transport != Ringbuf {
		return nil, fmt.Errorf("%w: triggers need BPF ring buffers (Linux 5.8+), not the %s transport", ErrNotSupported, transport)
	}
	l := &loading{r: r, set: map[string]any{}, opts: opts, nevents: nevents, raw: opts != nil && opts.sys}
	if opts != nil {
		r.stacks, r.ctxs, r.trigs = opts.stacks, opts.ctxs, opts.trigs
	}
	steps := []func() error{l.baseSpec, l.decide, l.setupRings, l.setupSyscalls, l.setupRest, l.load}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if err := r.openPerfContexts(r.ctxs); err != nil {
		return nil, err
	}
	if r.plan[PathOwnRings].on {
		if r.areaMem, err = mapArea(r.coll, ncpu, cfg.RingSize); err != nil {
			return nil, err
		}
	}
	r.running = r.coll.Variables[gen.RingbufVarKcRunning]
	state := r.coll.Maps[gen.RingbufMapKcState]
	r.stateMem, err = unix.Mmap(state.FD(), 0, roundPage(2*ncpu*cpuStateLen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping kc_state: %w", err)
	}
	r.Arm(cfg.Latency > 0) // the drainer starts asleep
	if opts != nil && opts.Spec != nil {
		return r, nil
	}
	if err := r.setTriggers(); err != nil {
		return nil, err
	}
	return r, r.setFilters()
}

// EventOptions returns what the load needs to know of the recorded
// events formats, with users their user-space fields (sysUsers), filters
// their field filters (nil for none), synths the count of synthetic
// events and wake set when wakeup_latency is recorded: their record
// sizes, the syscall events and BTF programs that may record them, and
// whether packet mode may write them.
func EventOptions(cfg Config, formats []*tracefs.Format, users []*SysUser, filters []*filter.Filter, stacks []layout.Stack, ctxs []layout.Context, synths int, wake bool) *Options {
	opts := &Options{hooks: wake, small: make([]uint32, len(formats)), btf: map[string]btfUse{}, filters: filters, formats: formats, stacks: stacks, ctxs: ctxs}
	opts.user = slices.ContainsFunc(users, func(u *SysUser) bool { return u != nil })
	for i, u := range users {
		opts.userTail = opts.userTail || u != nil && opts.tail(i)
	}
	for i, u := range users {
		if u != nil && i < len(filters) && filters[i] != nil && len(filters[i].Prog) > 0 {
			opts.userFiltered = append(opts.userFiltered, i)
		}
	}
	opts.userNr = true
	for i, u := range users {
		if _, known := sysNr(formats[i]); u != nil && !known {
			opts.userNr = false
		}
	}
	opts.pktTP = pktEligible(cfg, formats, synths, wake, false)
	opts.pktRaw = pktEligible(cfg, formats, synths, wake, true)
	if slices.ContainsFunc(stacks, func(s layout.Stack) bool { return s != 0 }) || len(ctxs) > 0 {
		// kc_tail writes them behind the record; the trace holds an
		// event's context before its payload, and the consumer moves it.
		opts.pktTP = errors.New("call chains and contexts are moved before the payload by the consumer")
		opts.pktRaw = opts.pktTP
	}
	for i, f := range formats {
		filtered := i < len(filters) && filters[i] != nil && len(filters[i].Prog) > 0
		if opts.tail(i) {
			// Only the tracepoints' general program records call
			// chains and contexts (kc_tail).
			continue
		}
		if exit, ok := SysShape(f); ok {
			// The syscall programs evaluate the filters of their
			// events (kc_sys_field_filter).
			opts.sys = true
			if nr, known := sysNr(f); known {
				opts.sysEvents = append(opts.sysEvents, sysEvent{key: i, exit: exit, nr: nr, name: f.Syscall(), filtered: filtered})
			}
		}
		if !filtered {
			// A filtered tracepoint's copy has the filter compiled
			// in (filtercode.go) and its own size.
			opts.small[i] = smallSize(f)
		}
		// wakeup_latency's hooks ride on the tracepoint programs. A
		// BTF program compiles in its event's filter.
		if e, l := btfShape(f); e != nil && !wake && !Testing.NoBTF && !(filtered && e.strings(l)) {
			opts.btf[e.prog] = btfUse{key: i, id: int(f.ID), layout: l}
		}
	}
	if opts.pktTP == nil || opts.pktRaw == nil {
		// In packet mode a record to transcode goes through the
		// scratch record, where its program builds the payload.
		for i, f := range formats {
			if l, err := layout.New(f, nil); err != nil || !l.Direct {
				opts.small[i] = 0
			}
		}
	}
	return opts
}

// tail reports whether event key i records call chains or contexts.
func (o *Options) tail(i int) bool {
	return o != nil && (i < len(o.stacks) && o.stacks[i] != 0 || len(o.ctxs) > 0)
}

// baseSpec takes the object of the transport (or the one opts gives),
// sizes its per-CPU state and its events' table, and makes the program
// copies of the events.
func (l *loading) baseSpec() error {
	r := l.r
	var err error
	switch {
	case l.opts != nil && l.opts.Spec != nil:
		l.spec = l.opts.Spec
		maps.Copy(l.set, l.opts.Vars)
	case r.transport == Perf:
		l.spec, err = gen.LoadPerf()
	default:
		l.spec, err = gen.LoadRingbuf()
	}
	if err != nil {
		return err
	}
	cfg, set := r.cfg, l.set
	l.spec.Maps[gen.RingbufMapKcState].MaxEntries = uint32(2 * r.ncpu)
	m := l.spec.Maps[gen.RingbufMapKcTpInfoMap]
	if m == nil {
		return nil
	}
	m.MaxEntries = uint32(max(l.nevents, 1))
	if k := l.spec.Maps[gen.RingbufMapKcFilterKept]; k != nil {
		k.MaxEntries = m.MaxEntries
	}
	if t := l.spec.Maps[gen.RingbufMapKcTrigMap]; t != nil && l.opts != nil && l.opts.trigs != nil {
		t.MaxEntries = uint32(max(len(l.opts.trigs.Defs), 1))
	}
	if p := l.spec.Maps[gen.RingbufMapKcCtxPerf]; p != nil {
		p.MaxEntries = uint32(layout.MaxPerf * r.ncpu)
		set[gen.RingbufVarKcCtxNcpu] = uint32(r.ncpu)
	}
	r.tp.cookie = !Testing.NoCookie && features.HaveProgramHelper(ebpf.TracePoint, asm.FnGetAttachCookie) == nil
	set[gen.RingbufVarKcUseCookie] = boolU32(r.tp.cookie)
	set[gen.RingbufVarKcFilterPid] = boolU32(len(cfg.PIDs) > 0)
	set[gen.RingbufVarKcPidBits] = PidBits(cfg.PIDs)
	set[gen.RingbufVarKcFilterCgroup] = boolU32(cfg.Cgroup != "")
	set[gen.RingbufVarKcFilterComm] = boolU32(len(cfg.Comms) > 0)
	set[gen.RingbufVarKcHooks] = boolU32(l.opts != nil && l.opts.hooks)
	return r.tp.copies(l.spec, r.transport, l.nevents, l.opts)
}

// decide fills the plan of the paths this kernel and configuration
// allow before the load: the own rings, the raw syscall path, packet
// mode, and whether tracing programs run preemptibly here.
func (l *loading) decide() error {
	r := l.r
	cfg, opts := r.cfg, l.opts
	if opts != nil && opts.Spec != nil {
		r.plan.off(PathOwnRings, errors.New("another producer writes the BPF ring buffers"))
	} else {
		r.plan[PathOwnRings] = decided(areaUsable(cfg, r.ncpu, r.transport, cfg.Objects))
	}
	if l.raw {
		if r.plan[PathRawSys].why = rawSysPossible(cfg, r.transport); r.plan[PathRawSys].why != nil && cfg.Syscalls == SyscallsRaw {
			return fmt.Errorf("raw syscall path: %w", r.plan[PathRawSys].why)
		}
	}
	r.preempt = Preemptibility()
	if Testing.RawFromPerf {
		r.preempt = Preemptible{On: true, Why: "forced by a test"}
	}
	pkt := errors.New("no events given")
	if opts != nil && opts.Spec == nil {
		// A kernel that refuses the raw syscall programs' load refuses
		// packet mode's first: the fallbacks drop it before them.
		pkt = opts.pktTP
		if l.raw && r.plan[PathRawSys].why == nil {
			pkt = opts.pktRaw
		}
	}
	if !r.plan[PathOwnRings].on {
		pkt = fmt.Errorf("no kc_area rings: %w", r.plan[PathOwnRings].why)
	}
	r.plan[PathPackets] = decided(pkt)
	return nil
}

// setupRings shapes the rings the writers write: kc_area's (with packet
// mode's elements) or none, and the transport's maps and wakeups.
func (l *loading) setupRings() error {
	r := l.r
	cfg, spec, set := r.cfg, l.spec, l.set
	pkt := r.plan[PathPackets].on
	if r.plan[PathOwnRings].on {
		setupArea(spec, set, cfg, r.ncpu, gen.RingbufMapKcArea, pkt)
		if pkt {
			r.pktElem, _ = pktShape(cfg)
		}
	} else {
		stripArea(spec)
	}
	if r.transport != Ringbuf {
		spec.Maps[gen.PerfMapKcPerf].MaxEntries = uint32(r.ncpu)
		return nil
	}
	rings := spec.Maps[gen.RingbufMapKcRings]
	rings.MaxEntries = uint32(r.ncpu)
	rings.InnerMap.MaxEntries = uint32(r.RingSize())
	set[gen.RingbufVarKcWakeupBytes] = uint64(cfg.Watermark)
	if pkt {
		// A packet is what the drainer takes: waking it for less
		// would wake it for nothing.
		set[gen.RingbufVarKcWakeupBytes] = uint64(max(cfg.Watermark, r.pktElem))
	}
	set[gen.RingbufVarKcWakeupMask] = WakeupMask(cfg, r.ncpu)
	return nil
}

// setupSyscalls keeps the raw syscall programs (on the perf tracepoints
// where tracing programs run preemptibly) or drops them, and makes the
// function path's program copies.
func (l *loading) setupSyscalls() error {
	r := l.r
	spec, set := l.spec, l.set
	var evs []sysEvent
	if l.opts != nil {
		evs = l.opts.sysEvents
		var keys []int
		for _, e := range evs {
			if e.filtered {
				keys = append(keys, e.key)
			}
		}
		if err := sysFilters(spec, keys, l.opts.userFiltered, l.opts.filters, l.opts.formats); err != nil {
			return err
		}
		start, err := sysTriggers(spec, l.opts.trigs, evs, l.opts.formats)
		if err != nil {
			return err
		}
		if spec.Variables[gen.RingbufVarKcSysTrigStart] != nil {
			set[gen.RingbufVarKcSysTrigStart] = boolU32(start)
		}
		// The function path does not evaluate triggers.
		evs = slices.DeleteFunc(slices.Clone(evs), func(e sysEvent) bool { return e.trig })
	}
	if spec.Programs[gen.RingbufProgKcSysEnter] != nil {
		if !l.raw || r.plan[PathRawSys].why != nil {
			dropRawSys(spec)
		} else {
			r.plan[PathRawSys].on = true
			r.raw.perf = r.preempt.On && !Testing.RawFromBTF
			rawFromPerf(spec, r.raw.perf)
			set[gen.RingbufVarKcTaskBtf] = boolU32(taskBTF())
		}
	}
	if spec.Programs[gen.RingbufProgKcSysFentry] == nil {
		return nil
	}
	if err := r.fentry.copies(r, spec, evs); err != nil {
		return err
	}
	r.plan[PathFentry].on = len(r.fentry.progs) > 0
	if !r.plan[PathFentry].on {
		l.tracepointsRather(spec)
	}
	if len(r.fentry.progs) > 0 {
		set[gen.RingbufVarKcTaskBtf] = boolU32(taskBTF())
	}
	return nil
}

// tracepointsRather drops the raw syscall path from spec, under
// SyscallsAuto, where the function path does not take the syscall
// events and they are few (FentryMax at most): on the raw path every
// syscall of the machine runs a program, recorded or not, where each
// event's own tracepoint leaves the others alone, and costs about as
// much a recorded call for so few (BENCHMARKS.md, issue 54). It keeps
// the raw path for a syscall event with a trigger (the raw programs
// evaluate those) and where programs run preemptibly, whose syscall
// tracepoints lose events (preempt.go).
func (l *loading) tracepointsRather(spec *ebpf.CollectionSpec) {
	r := l.r
	if r.cfg.Syscalls != SyscallsAuto || l.opts == nil || spec.Programs[gen.RingbufProgKcSysEnter] == nil || r.preempt.On {
		return
	}
	evs := l.opts.sysEvents
	if len(evs) == 0 || len(evs) > FentryMax || slices.ContainsFunc(evs, func(e sysEvent) bool { return e.trig }) {
		return
	}
	dropRawSys(spec)
	r.plan.off(PathRawSys, fmt.Errorf("%d syscall events, %d at most for auto, and no function path (%v): their tracepoints leave the other syscalls alone", len(evs), FentryMax, r.plan[PathFentry].why))
}

// setupRest sets the BTF and user-fault programs up and the variables
// the steps before chose.
func (l *loading) setupRest() error {
	r := l.r
	spec, set, opts := l.spec, l.set, l.opts
	set[gen.RingbufVarKcClock] = uint32(r.cfg.Clock)
	set[gen.RingbufVarKcGlobal] = boolU32(r.cfg.Global)
	if spec.Variables[gen.RingbufVarKcSelfTgid] != nil {
		set[gen.RingbufVarKcSelfTgid] = uint32(os.Getpid())
	}
	var uses map[string]btfUse
	if opts != nil {
		uses = opts.btf
	}
	r.btf.setup(r, spec, set, uses)
	r.plan[PathBTF].on = len(r.btf.keys) > 0
	r.user.setup(r, spec, opts != nil && opts.user, opts != nil && opts.userNr, opts != nil && opts.userTail)
	if err := r.probe.setup(r, spec, set, opts, l.nevents); err != nil {
		return err
	}
	return setVars(spec, set)
}

// setVars gives spec's variables the values of set. It fails for a
// variable spec does not have.
func setVars(spec *ebpf.CollectionSpec, set map[string]any) error {
	for name, v := range set {
		vs := spec.Variables[name]
		if vs == nil {
			return fmt.Errorf("BPF object has no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("setting %s: %w", name, err)
		}
	}
	return nil
}

// load creates the collection; while the kernel refuses it, it drops the
// optional paths of fallbacks in their order, newest first, each saying
// in the plan why it went, and tries again. It fails with the kernel's
// error when nothing is left to drop, or when the user asked for the
// path that would go.
func (l *loading) load() error {
	r := l.r
	if err := globTables(l.spec); err != nil {
		return err
	}
	var err error
	r.coll, err = Testing.NewCollection(l.spec)
	for err != nil && r.btf.dropRefused(r, l.spec, err) {
		r.coll, err = Testing.NewCollection(l.spec)
	}
	for _, f := range fallbacks {
		if err == nil {
			break
		}
		if !f.in(l) {
			continue
		}
		if f.asked != nil {
			if ferr := f.asked(l, err); ferr != nil {
				return ferr
			}
		}
		r.plan.off(f.path, fmt.Errorf("loading: %w", err))
		if derr := f.drop(l); derr != nil {
			return derr
		}
		r.coll, err = Testing.NewCollection(l.spec)
	}
	if err != nil {
		return fmt.Errorf("loading the BPF recorder%s: %w", r.probe.blame(err), err)
	}
	r.spec = l.spec
	return nil
}

// fallbacks are the optional paths load drops, in order: the newest code
// first.
var fallbacks = []fallback{
	{
		// Paging user memory in is the newest part: the first to go.
		path: PathUserFault,
		in:   func(l *loading) bool { return l.spec.Programs[gen.RingbufProgKcSysUserFault] != nil },
		drop: func(l *loading) error {
			delete(l.spec.Programs, gen.RingbufProgKcSysUserFault)
			u := &l.r.user
			u.rec, u.tp = false, u.on
			u.setVars(l.spec)
			return nil
		},
	},
	{
		// Packet mode is the newest writer of all.
		path: PathPackets,
		in:   func(l *loading) bool { return l.r.plan[PathPackets].on },
		drop: func(l *loading) error {
			l.r.pktElem = 0
			elem, count := AreaShape(l.r.cfg.RingSize)
			l.spec.Maps[gen.RingbufMapKcArea].ValueSize = uint32(elem)
			l.spec.Maps[gen.RingbufMapKcArea].MaxEntries = uint32(l.r.ncpu * count)
			return setVars(l.spec, map[string]any{gen.RingbufVarKcPktOn: uint32(0), gen.RingbufVarKcWakeupBytes: uint64(l.r.cfg.Watermark), gen.RingbufVarKcAreaEsize: uint64(elem),
				gen.RingbufVarKcAreaEshift: uint32(bits.TrailingZeros(uint(elem))), gen.RingbufVarKcAreaKmask: uint32(count - 1)})
		},
	},
	{
		// The own rings are an optimisation, and newer code than the
		// rest.
		path: PathOwnRings,
		in:   func(l *loading) bool { return l.r.plan[PathOwnRings].on },
		drop: func(l *loading) error {
			l.r.plan.off(PathPackets, fmt.Errorf("no kc_area rings: %w", l.r.plan[PathOwnRings].why))
			l.spec.Maps[gen.RingbufMapKcRings].InnerMap.MaxEntries = uint32(l.r.cfg.RingSize)
			if err := setVars(l.spec, map[string]any{gen.RingbufVarKcAreaOn: uint32(0)}); err != nil {
				return err
			}
			stripArea(l.spec)
			return nil
		},
	},
	{
		// The function path is an optimisation too, unless asked for.
		path: PathFentry,
		in:   func(l *loading) bool { return len(l.r.fentry.progs) > 0 },
		asked: func(l *loading, err error) error {
			if l.r.cfg.Syscalls == SyscallsFentry {
				return fmt.Errorf("fentry syscall path: loading the BPF recorder: %w", err)
			}
			return nil
		},
		drop: func(l *loading) error {
			l.r.fentry.drop(l.spec)
			l.tracepointsRather(l.spec)
			return nil
		},
	},
	{
		// The raw syscall path is an optimisation: a kernel that
		// refuses it records syscall events through their
		// tracepoints. Asked for by name, it is not dropped, and the
		// next path goes instead.
		path: PathRawSys,
		in: func(l *loading) bool {
			return l.spec.Programs[gen.RingbufProgKcSysEnter] != nil && l.r.cfg.Syscalls != SyscallsRaw
		},
		drop: func(l *loading) error { dropRawSys(l.spec); return nil },
	},
	{
		// So is the BTF event path.
		path: PathBTF,
		in:   func(l *loading) bool { return len(l.r.btf.keys) > 0 },
		drop: func(l *loading) error { l.r.btf.drop(l.spec); return nil },
	},
}
