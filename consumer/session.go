// Package consumer is kconsume's engine: it loads the BPF recorder,
// attaches it to tracepoints, maps the per-CPU rings and drains them in
// place into a relayfmt channel, accounting for every lost record.
package consumer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/synth"
)

// recHdrLen is sizeof(struct kc_rec) (bpf/kconsume.h).
const recHdrLen = int(unsafe.Sizeof(gen.RingbufKcRec{}))

// cpuStateLen is sizeof(struct kc_cpu_state): one cache line.
const cpuStateLen = int(unsafe.Sizeof(gen.RingbufKcCpuState{}))

// Errors of the session API.
var (
	ErrClosed       = errors.New("session closed")
	ErrUnknownEvent = errors.New("no tracepoint matches")
	ErrNeedsPerCPU  = errors.New("operation needs per-CPU buffers, not global mode")
	ErrNotSupported = errors.New("not supported by this kernel")
	ErrNoSuchCPU    = errors.New("no such CPU")
)

// CPUStats counts what happened to one CPU's records.
type CPUStats struct {
	CPU int
	// Emitted records left the BPF program into the ring; KernelLost
	// failed to (ring full). PerfLost is the part of KernelLost that perf
	// also reported with lost records (perf transport).
	Emitted    uint64
	KernelLost uint64
	PerfLost   uint64
	// Channel is the CPU's relayfmt buffer (in global mode, the one
	// buffer is reported on CPU 0).
	Channel relayfmt.Stats
	// Undecodable records reached the consumer but could not be decoded
	// (a corrupt header or a dynamic field pointing outside its record);
	// they are written into the stream as discarded.
	Undecodable uint64
	// Missed counts tracepoint hits the kernel did not run the recorder
	// for because a BPF program was already running on that CPU
	// (bpf_prog_active in kernel/trace/bpf_trace.c:trace_call_bpf; for
	// the raw syscall path, the program itself, __bpf_trace_run; the
	// programs' recursion_misses). The kernel does not say on which CPU
	// nor for which task, so they are reported on CPU 0. Without filters
	// each miss of a tracepoint's recorder was an event lost, placed in
	// stream 0 and counted in Discarded. With filters some would have
	// been filtered out, and the raw syscall programs run for syscalls
	// that are not recorded too, so those misses are an upper bound and
	// stay out of the stream.
	Missed    uint64
	Reordered uint64 // records written before a record that reached the ring earlier
	Wakeups   uint64 // times the consumer was woken for this ring
	Disabled  bool   // recording stopped on this CPU alone
	// missedPlaced is the part of Missed placed in the stream.
	missedPlaced uint64
}

// Discarded returns the records of this CPU lost at any layer.
func (s CPUStats) Discarded() uint64 {
	return s.KernelLost + s.missedPlaced + s.Undecodable + s.Channel.Dropped + s.Channel.TooLarge + s.Channel.Invalid + s.Channel.Overwritten
}

// stream is one output stream and the state of draining into it.
type stream struct {
	idx         int    // buffer index in the channel (the CPU; 0 in global mode)
	data        []byte // the ring's data area, where entries point
	win         *window
	scratch     []byte
	wakeups     uint64
	undecodable uint64 // records the consumer could not decode
	cps         checkpoints
	rollbacks   int // times a late record sent the ring's walk back
	// replayEnd is just past the ring position of the late record that
	// last sent the walk back: until the walk passes it, every record
	// goes through the window, where the late one takes its place.
	replayEnd uint64
	rb        *ringbuf
	pr        *perfRing
}

// Session is a running recording: BPF programs attached, rings mapped, a
// drainer goroutine writing into a relayfmt channel. Its methods are safe
// for concurrent use.
type Session struct {
	cfg        Config
	transport  Transport
	ncpu       int
	ch         *relayfmt.Channel
	coll       *ebpf.Collection
	rings      []*ebpf.Map
	links      []link.Link
	running    *ebpf.Variable
	stateMem   []byte
	layouts    []*layout // by class id
	direct     []int32   // by class id: a direct layout's payload size, else -1
	synth      map[string]synthClass
	injectMu   sync.Mutex
	injectRec  *gen.RingbufKcInjectRec
	events     []*tracefs.Format
	streams    []*stream
	lostSeen   []uint64 // kernel losses already placed in the stream, per CPU
	missedSeen uint64   // recursion misses counted so far (Stats.Missed)
	lostMissed uint64   // the part of them placed in stream 0
	epfd       int
	evfd       int
	window     uint64 // reorder window in ns
	clockID    int32
	cmds       chan command
	done       chan struct{}
	loopErr    error
	closeOnce  sync.Once
	closeErr   error
	started    atomic.Bool
	looping    atomic.Bool
	online     []bool   // perf: CPUs online at the last hotplug check
	useCookie  bool     // event keys come from attach cookies
	tpProgs    []string // the recorder copy attached for each event key
	sysErr     error    // why syscall events are not on the raw syscall path
	switchKey  uint32   // wakeup_latency: sched_switch's key and info
	switchInfo gen.RingbufKcTpInfo
	objects    []*object  // users' programs (Config.Objects)
	synthMu    sync.Mutex // guards synth after New
	loopTID    atomic.Int32
	drainer    drainerCounts
	final      []CPUStats // counts at Close
	lastPlug   time.Time
	lastMissed time.Time
}

type command struct {
	fn    func() error
	reply chan error
}

// New loads and attaches the recorder for cfg and starts draining; the
// gate is closed until Start. It fails with ErrConfig for bad settings,
// ErrUnknownEvent (naming the pattern) when an event pattern matches no
// tracepoint, ErrNotSupported when the kernel lacks a needed feature, or
// the kernel's error when loading or attaching fails.
func New(cfg Config) (*Session, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if len(cfg.Events) == 0 && len(cfg.Objects) == 0 {
		return nil, fmt.Errorf("%w: no events", ErrConfig)
	}
	fs, err := tracefs.Find()
	if err != nil {
		return nil, err
	}
	tps, synths := splitSynth(cfg.Events)
	formats, err := resolveEvents(fs, tps)
	if err != nil {
		return nil, err
	}
	synthDefs, err := resolveSynth(cfg.Synth, synths)
	if err != nil {
		return nil, err
	}
	var hooks []*tracefs.Format
	wake := slices.ContainsFunc(synthDefs, func(e *synth.Event) bool { return e.Name == synth.WakeupLatency })
	if wake {
		if hooks, err = wakeupHooks(fs, formats); err != nil {
			return nil, err
		}
	}
	if cfg.Sink == nil {
		if _, err := os.Stat(filepath.Join(cfg.Dir, "metadata")); err == nil {
			return nil, fmt.Errorf("%w: %s already holds a trace", ErrConfig, cfg.Dir)
		}
	}
	opts := &loadOpts{hooks: wake, small: make([]uint32, len(formats))}
	for i, f := range formats {
		opts.small[i] = smallSize(f)
		if _, ok := sysShape(f); ok {
			opts.sys = true
		}
	}
	s, err := newSession(cfg, len(formats)+len(hooks), opts)
	if err != nil {
		return nil, err
	}
	err = s.addTracepoints(formats, hooks, wake)
	if err == nil {
		err = s.addSynth(synthDefs)
	}
	if err == nil && wake {
		err = s.linkWakeup()
	}
	if err == nil {
		err = s.addObjects(cfg.Objects)
	}
	if err != nil {
		s.Close()
		s.removeOutput()
		return nil, err
	}
	s.startLoop()
	return s, nil
}

// removeOutput removes what a session that failed to start wrote into its
// directory: the metadata (no stream file exists before the first record).
func (s *Session) removeOutput() {
	if s.cfg.Sink == nil {
		_ = os.Remove(filepath.Join(s.cfg.Dir, "metadata"))
	}
}

// resolveEvents expands the patterns into formats, each event once.
func resolveEvents(fs tracefs.FS, patterns []string) ([]*tracefs.Format, error) {
	var out []*tracefs.Format
	seen := map[tracefs.Event]bool{}
	for _, p := range patterns {
		evs, err := fs.Events(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if len(evs) == 0 {
			return nil, fmt.Errorf("%w: %q (see kconsume list)", ErrUnknownEvent, p)
		}
		for _, e := range evs {
			if seen[e] {
				continue
			}
			seen[e] = true
			f, err := fs.Format(e)
			if err != nil {
				return nil, err
			}
			out = append(out, f)
		}
	}
	return out, nil
}

// loadOpts replaces the recorder by another object built on kconsume.h
// (the bench producer), with values for its own variables, or turns on
// the recorder's hooks (synthetic:wakeup_latency).
type loadOpts struct {
	spec  *ebpf.CollectionSpec
	vars  map[string]any
	hooks bool
	small []uint32 // per event key: its record size when smallSize allows, or 0
	sys   bool     // some event may take the raw syscall path (sysShape)
}

// smallSize returns the record size of f when the recorder can copy it
// straight into the ring with a program copy of its own size
// (kc_record_small in bpf/kconsume.bpf.c): a multiple of 4 from 8 to
// smallMax bytes, without dynamic fields. Otherwise it returns 0.
func smallSize(f *tracefs.Format) uint32 {
	n := f.FixedSize()
	if n < 8 || n > smallMax || n%4 != 0 {
		return 0
	}
	for _, fl := range f.All() {
		if fl.Loc != tracefs.Inline {
			return 0
		}
	}
	return uint32(n)
}

// newSession loads the BPF objects for nevents event keys and maps the
// rings; no event is attached yet.
func newSession(cfg Config, nevents int, opts *loadOpts) (_ *Session, err error) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible CPUs: %w", err)
	}
	s := &Session{cfg: cfg, ncpu: ncpu, epfd: -1, evfd: -1, window: uint64(cfg.ReorderWindow), cmds: make(chan command, 1), done: make(chan struct{})}
	defer func() {
		if err != nil {
			if s.ch != nil {
				_ = s.ch.Close()
				s.removeOutput()
			}
			s.release()
		}
	}()
	if s.transport, err = chooseTransport(cfg.Transport); err != nil {
		return nil, err
	}
	if s.clockID, err = checkClock(cfg.Clock); err != nil {
		return nil, err
	}
	if err := s.load(nevents, opts); err != nil {
		return nil, err
	}
	if err := s.openRings(); err != nil {
		return nil, err
	}
	sink := cfg.Sink
	if sink == nil {
		if sink, err = relayfmt.NewDirSink(cfg.Dir); err != nil {
			return nil, err
		}
	}
	env := map[string]string{"transport": s.transport.String()}
	if u, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		env["kernel_release"] = strings.TrimSpace(string(u))
	}
	if h, err := os.Hostname(); err == nil {
		env["hostname"] = h
	}
	for k, v := range cfg.Env {
		env[k] = v
	}
	s.ch, err = relayfmt.NewChannel(relayfmt.Config{
		SubbufSize: cfg.SubbufSize,
		NSubbufs:   cfg.NSubbufs,
		CPUs:       ncpu,
		Global:     cfg.Global,
		Mode:       cfg.Mode,
		Clock:      clockDesc(cfg.Clock, s.clockID),
		Env:        env,
	}, sink)
	if err != nil {
		if cfg.Sink == nil {
			_ = sink.Close()
		}
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return s, nil
}

func chooseTransport(t Transport) (Transport, error) {
	rbErr := features.HaveMapType(ebpf.RingBuf)
	switch t {
	case Auto:
		if rbErr == nil {
			return Ringbuf, nil
		}
		return Perf, nil
	case Ringbuf:
		if rbErr != nil {
			return 0, fmt.Errorf("%w: BPF ring buffers (Linux 5.8): %w", ErrNotSupported, rbErr)
		}
	}
	return t, nil
}

// checkClock returns the clock_gettime id of c, or ErrNotSupported when
// the kernel has no BPF helper for it.
func checkClock(c Clock) (int32, error) {
	switch c {
	case Boot:
		if err := features.HaveProgramHelper(ebpf.TracePoint, asm.FnKtimeGetBootNs); err != nil {
			return 0, fmt.Errorf("%w: clock boot (bpf_ktime_get_boot_ns, Linux 5.8): %w", ErrNotSupported, err)
		}
		return unix.CLOCK_BOOTTIME, nil
	case TAI:
		if err := features.HaveProgramHelper(ebpf.TracePoint, asm.FnKtimeGetTaiNs); err != nil {
			return 0, fmt.Errorf("%w: clock tai (bpf_ktime_get_tai_ns, Linux 6.1): %w", ErrNotSupported, err)
		}
		return unix.CLOCK_TAI, nil
	}
	return unix.CLOCK_MONOTONIC, nil
}

// clockDesc describes the clock for the metadata, with its zero as wall
// time: the realtime-minus-clock difference from the closest of a few
// paired reads.
func clockDesc(c Clock, id int32) relayfmt.Clock {
	best, off := int64(-1), int64(0)
	for i := 0; i < 5; i++ {
		var a, b, r unix.Timespec
		_ = unix.ClockGettime(id, &a)
		_ = unix.ClockGettime(unix.CLOCK_REALTIME, &r)
		_ = unix.ClockGettime(id, &b)
		if d := b.Nano() - a.Nano(); best < 0 || d < best {
			best, off = d, r.Nano()-(a.Nano()+d/2)
		}
	}
	names := map[Clock]string{Mono: "monotonic", Boot: "boottime", TAI: "tai"}
	return relayfmt.Clock{Name: names[c], Description: "kernel " + names[c] + " clock", Offset: off}
}

// noCookie makes the loader patch a program copy per event even where the
// kernel has attach cookies, so tests exercise both ways on one kernel.
var noCookie = false

// keyPlaceholder and sizePlaceholder are KC_KEY_PLACEHOLDER and
// KC_SIZE_PLACEHOLDER of bpf/kconsume.bpf.c; smallMax is KC_SMALL_MAX.
const (
	keyPlaceholder  = 0x6b634b4559
	sizePlaceholder = 0x6b6353495a
	smallMax        = 128
)

// load creates the maps and the programs of the chosen transport for
// nevents events: one program told each event's key by the attach cookie,
// or on kernels before 5.15 one program copy per event with its key
// patched in.
func (s *Session) load(nevents int, opts *loadOpts) error {
	// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK (64 KiB by
	// default), which a few rings exceed; later ones use memcg
	// accounting and this does nothing.
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("raising RLIMIT_MEMLOCK for BPF maps: %w", err)
	}
	var spec *ebpf.CollectionSpec
	var err error
	set := map[string]any{}
	switch {
	case opts != nil && opts.spec != nil:
		spec = opts.spec
		maps.Copy(set, opts.vars)
	case s.transport == Perf:
		spec, err = gen.LoadPerf()
	default:
		spec, err = gen.LoadRingbuf()
	}
	if err != nil {
		return err
	}
	cfg := s.cfg
	spec.Maps[gen.RingbufMapKcState].MaxEntries = uint32(2 * s.ncpu)
	if m := spec.Maps[gen.RingbufMapKcTpInfoMap]; m != nil {
		m.MaxEntries = uint32(max(nevents, 1))
		s.useCookie = !noCookie && features.HaveProgramHelper(ebpf.TracePoint, asm.FnGetAttachCookie) == nil
		set[gen.RingbufVarKcUseCookie] = boolU32(s.useCookie)
		set[gen.RingbufVarKcFilterPid] = boolU32(len(cfg.PIDs) > 0)
		set[gen.RingbufVarKcFilterCgroup] = boolU32(cfg.Cgroup != "")
		set[gen.RingbufVarKcFilterComm] = boolU32(len(cfg.Comms) > 0)
		set[gen.RingbufVarKcHooks] = boolU32(opts != nil && opts.hooks)
	}
	if m := spec.Maps[gen.RingbufMapKcTpInfoMap]; m != nil {
		if err := s.recorderCopies(spec, nevents, opts); err != nil {
			return err
		}
	}
	if s.transport == Ringbuf {
		rings := spec.Maps[gen.RingbufMapKcRings]
		rings.MaxEntries = uint32(s.ncpu)
		rings.InnerMap.MaxEntries = uint32(cfg.RingSize)
	} else {
		spec.Maps[gen.PerfMapKcPerf].MaxEntries = uint32(s.ncpu)
	}
	set[gen.RingbufVarKcClock] = uint32(cfg.Clock)
	set[gen.RingbufVarKcGlobal] = boolU32(cfg.Global)
	if s.transport == Ringbuf {
		set[gen.RingbufVarKcWakeupBytes] = uint64(cfg.Watermark)
		set[gen.RingbufVarKcWakeupMask] = wakeupMask(cfg, s.ncpu)
	}
	raw := opts != nil && opts.sys
	if raw {
		if s.sysErr = s.rawSysPossible(); s.sysErr != nil && s.cfg.Syscalls == SyscallsRaw {
			return fmt.Errorf("raw syscall path: %w", s.sysErr)
		}
	}
	if spec.Programs[gen.RingbufProgKcSysEnter] != nil {
		if !raw || s.sysErr != nil {
			dropRawSys(spec)
		} else {
			set[gen.RingbufVarKcTaskBtf] = boolU32(taskBTF())
		}
	}
	for name, v := range set {
		vs := spec.Variables[name]
		if vs == nil {
			return fmt.Errorf("BPF object has no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("setting %s: %w", name, err)
		}
	}
	s.coll, err = ebpf.NewCollection(spec)
	if err != nil && spec.Programs[gen.RingbufProgKcSysEnter] != nil && s.cfg.Syscalls != SyscallsRaw {
		// The raw syscall path is an optimisation: a kernel that refuses
		// it records syscall events through their tracepoints.
		s.sysErr = fmt.Errorf("loading: %w", err)
		dropRawSys(spec)
		s.coll, err = ebpf.NewCollection(spec)
	}
	if err != nil {
		return fmt.Errorf("loading the BPF recorder: %w", err)
	}
	s.running = s.coll.Variables[gen.RingbufVarKcRunning]
	state := s.coll.Maps[gen.RingbufMapKcState]
	s.stateMem, err = unix.Mmap(state.FD(), 0, roundPage(2*s.ncpu*cpuStateLen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mapping kc_state: %w", err)
	}
	s.lostSeen = make([]uint64, s.ncpu)
	s.arm() // the drainer starts asleep
	if opts != nil && opts.spec != nil {
		return nil
	}
	return s.setFilters()
}

// recorderCopies makes the recorder's program copies in spec. With
// attach cookies: kc_tracepoint for every event, plus kc_tp_sN for the
// events of small record size N (kc_record_small). Without: kc_tp_I for
// event key I, with I patched in, on the general path only (a copy that
// perf refused to attach would have no general copy to fall back to).
func (s *Session) recorderCopies(spec *ebpf.CollectionSpec, nevents int, opts *loadOpts) error {
	orig := spec.Programs[gen.RingbufProgKcTracepoint]
	base := orig
	if s.transport == Ringbuf { // the perf object has no kc_record_small
		var err error
		if base, err = patchImm(base, base.Name, sizePlaceholder, 0); err != nil {
			return err
		}
		spec.Programs[base.Name] = base
	}
	if !s.useCookie {
		delete(spec.Programs, gen.RingbufProgKcTracepoint)
		for i := 0; i < nevents; i++ {
			ps, err := patchImm(base, "kc_tp_"+strconv.Itoa(i), keyPlaceholder, uint32(i))
			if err != nil {
				return err
			}
			spec.Programs[ps.Name] = ps
		}
		return nil
	}
	if s.transport != Ringbuf || opts == nil {
		return nil
	}
	for _, n := range opts.small {
		if n == 0 || spec.Programs[smallProg(n)] != nil {
			continue
		}
		ps, err := patchImm(orig, smallProg(n), sizePlaceholder, n)
		if err != nil {
			return err
		}
		spec.Programs[ps.Name] = ps
	}
	return nil
}

// smallProg names the recorder copy for records of n bytes.
func smallProg(n uint32) string { return "kc_tp_s" + strconv.Itoa(int(n)) }

// patchImm returns a copy of program base named name with v in place of
// its one 64-bit immediate placeholder.
func patchImm(base *ebpf.ProgramSpec, name string, placeholder int64, v uint32) (*ebpf.ProgramSpec, error) {
	ps := base.Copy()
	ps.Name = name
	n := 0
	for i := range ps.Instructions {
		ins := &ps.Instructions[i]
		if ins.OpCode.IsDWordLoad() && ins.Constant == placeholder && ins.Reference() == "" {
			ins.Constant = int64(v)
			n++
		}
	}
	if n != 1 {
		return nil, fmt.Errorf("recorder program has %d placeholders %#x, want 1", n, placeholder)
	}
	return ps, nil
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

func roundPage(n int) int {
	p := os.Getpagesize()
	return (n + p - 1) / p * p
}

func (s *Session) setFilters() error {
	for _, p := range s.cfg.PIDs {
		if err := s.coll.Maps[gen.RingbufMapKcPids].Put(uint32(p), uint8(1)); err != nil {
			return fmt.Errorf("pid filter %d: %w", p, err)
		}
	}
	for _, c := range s.cfg.Comms {
		var key gen.RingbufKcComm
		for i := 0; i < len(c); i++ {
			key.Comm[i] = int8(c[i])
		}
		if err := s.coll.Maps[gen.RingbufMapKcComms].Put(key, uint8(1)); err != nil {
			return fmt.Errorf("comm filter %q: %w", c, err)
		}
	}
	if s.cfg.Cgroup != "" {
		fd, err := unix.Open(s.cfg.Cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: cgroup %s: %w", ErrConfig, s.cfg.Cgroup, err)
		}
		defer unix.Close(fd)
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			return fmt.Errorf("%w: %s is not a cgroup v2 directory", ErrConfig, s.cfg.Cgroup)
		}
		if err := s.coll.Maps[gen.RingbufMapKcCgroup].Put(uint32(0), uint32(fd)); err != nil {
			return fmt.Errorf("cgroup filter %s: %w", s.cfg.Cgroup, err)
		}
	}
	return nil
}

// cpuState returns CPU cpu's slot of the mapped kc_state array; the
// slots from s.ncpu on count the records of users' programs.
func (s *Session) cpuState(cpu int) *gen.RingbufKcCpuState {
	return (*gen.RingbufKcCpuState)(unsafe.Pointer(&s.stateMem[cpu*cpuStateLen]))
}

// wakeupMask returns kc_wakeup_mask for cfg: one less than how many
// records of at most sampledMax bytes a writer may put into a ring between
// two looks at its fill (bpf/kconsume.h:kc_wakeup_flags). All the CPUs'
// writers together may pass over no more than half the ring's room above
// the watermark, so a late look still wakes the consumer well before the
// ring is full; tiny rings get a look at every record.
func wakeupMask(cfg Config, ncpu int) uint64 {
	writers := 1
	if cfg.Global {
		writers = ncpu
	}
	room := (cfg.RingSize - cfg.Watermark) / 2
	n := 1
	for n < maxWakeupStride && 2*n*sampledMax*writers <= room {
		n *= 2
	}
	return uint64(n - 1)
}

const (
	// sampledMax mirrors KC_SAMPLED_MAX in bpf/kconsume.h, the largest
	// ring record a sampled wakeup check may pass over.
	sampledMax = 256
	// maxWakeupStride caps the records between two looks at a ring's fill.
	maxWakeupStride = 64
)

// arm tells the writers into the rings that the drainer is about to
// sleep: their next look at a ring's fill over the watermark wakes it. A
// drainer that goes round again at once is not armed, or a ring kept
// over the watermark would wake it on every pass. The store is skipped
// when a slot is armed already, so the writers' cache line is not taken
// away for nothing.
func (s *Session) arm() {
	if s.transport != Ringbuf {
		return
	}
	for slot := range 2 * s.ncpu {
		if cs := s.cpuState(slot); atomic.LoadUint32(&cs.Armed) == 0 {
			atomic.StoreUint32(&cs.Armed, 1)
		}
	}
}

// emitted returns the records the kernel side put into cpu's ring.
func (s *Session) emitted(cpu int) uint64 {
	return atomic.LoadUint64(&s.cpuState(cpu).Emitted) + atomic.LoadUint64(&s.cpuState(s.ncpu+cpu).Emitted)
}

// kernelLost returns the records the kernel side failed to put into
// cpu's ring.
func (s *Session) kernelLost(cpu int) uint64 {
	return atomic.LoadUint64(&s.cpuState(cpu).Lost) + atomic.LoadUint64(&s.cpuState(s.ncpu+cpu).Lost)
}

// openRings creates and maps the rings and the epoll set.
func (s *Session) openRings() error {
	var err error
	if s.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	if s.evfd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	if err := s.watch(s.evfd, -1); err != nil {
		return err
	}
	nstreams := s.ncpu
	if s.cfg.Global {
		nstreams = 1
	}
	for i := 0; i < nstreams; i++ {
		s.streams = append(s.streams, &stream{idx: i, win: newWindow(s.cfg.ReorderMax), cps: newCheckpoints(s.cfg.ReorderMax), scratch: make([]byte, 0, tracefs.MaxRecordSize*2)})
	}
	if s.transport == Perf {
		return s.openPerf()
	}
	outer := s.coll.Maps[gen.RingbufMapKcRings]
	for i, st := range s.streams {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Name: fmt.Sprintf("kc_ring%d", i), Type: ebpf.RingBuf, MaxEntries: uint32(s.cfg.RingSize)})
		if err != nil {
			return fmt.Errorf("ring buffer %d: %w", i, err)
		}
		s.rings = append(s.rings, m)
		if err := outer.Put(uint32(i), m); err != nil {
			return fmt.Errorf("ring buffer %d: %w", i, err)
		}
		if st.rb, err = newRingbuf(m.FD(), s.cfg.RingSize); err != nil {
			return err
		}
		st.data = st.rb.data
		if err := s.watch(m.FD(), i); err != nil {
			return err
		}
	}
	return nil
}

// watch adds fd to the epoll set, edge-triggered: a ring stays readable
// while records wait in a reorder window, and the drainer must not spin
// on that; it waits for the producer's next wakeup or its latency tick.
func (s *Session) watch(fd, stream int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(stream)}
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	return nil
}

// addTracepoints defines a class per recorded event, tells the recorder
// each event's layout and attaches it; event i gets key i, its class id.
// The hooks (tracepoints wakeup_latency needs but the trace does not
// record) take the keys after them. With wake set, the sched_waking and
// sched_switch keys carry the wakeup_latency hooks.
func (s *Session) addTracepoints(formats, hooks []*tracefs.Format, wake bool) error {
	info := s.coll.Maps[gen.RingbufMapKcTpInfoMap]
	raw, err := s.rawSyscalls(formats)
	if err != nil {
		return err
	}
	for i, f := range append(slices.Clip(formats), hooks...) {
		var ti gen.RingbufKcTpInfo
		if i < len(formats) {
			l, err := newLayout(f)
			if err != nil {
				return err
			}
			cls, err := s.ch.AddEventClass(f.FullName(), l.fields)
			if err != nil {
				return fmt.Errorf("event %s: %w", f.FullName(), err)
			}
			if cls.ID != uint32(i) {
				return fmt.Errorf("event %s: class id %d, want %d", f.FullName(), cls.ID, i)
			}
			s.setLayout(cls.ID, l)
			ti = gen.RingbufKcTpInfo{Id: uint16(f.ID), Size: uint16(l.fixed), Ndyn: uint16(len(l.dyn)), Flags: tpRecord}
			copy(ti.Dyn[:], l.dyn)
		}
		if wake {
			if err := s.wakeupInfo(f, uint32(i), &ti); err != nil {
				return err
			}
		}
		if err := info.Put(uint32(i), ti); err != nil {
			return fmt.Errorf("event %s: %w", f.FullName(), err)
		}
		if i < len(formats) && raw[i] != "" {
			s.tpProgs = append(s.tpProgs, raw[i])
			s.events = append(s.events, f)
			continue
		}
		name, opts := "kc_tp_"+strconv.Itoa(i), (*link.TracepointOptions)(nil)
		if s.useCookie {
			name, opts = gen.RingbufProgKcTracepoint, &link.TracepointOptions{Cookie: uint64(i)}
			if small := smallProg(smallSize(f)); i < len(formats) && s.coll.Programs[small] != nil {
				name = small
			}
		}
		lk, err := link.Tracepoint(f.System, f.Name, s.coll.Programs[name], opts)
		if errors.Is(err, unix.EACCES) && name != gen.RingbufProgKcTracepoint && s.useCookie {
			// perf checks a copy's loads against the event's last field
			// (max_ctx_offset); where that is not its largest, record the
			// event the general way.
			name = gen.RingbufProgKcTracepoint
			lk, err = link.Tracepoint(f.System, f.Name, s.coll.Programs[name], opts)
		}
		if err != nil {
			return fmt.Errorf("attaching to %s: %w", f.FullName(), err)
		}
		s.links = append(s.links, lk)
		s.tpProgs = append(s.tpProgs, name)
		if i < len(formats) {
			s.events = append(s.events, f)
		}
	}
	return nil
}

func (s *Session) setLayout(id uint32, l *layout) {
	for uint32(len(s.layouts)) <= id {
		s.layouts = append(s.layouts, nil)
		s.direct = append(s.direct, -1)
	}
	s.layouts[id] = l
	s.direct[id] = -1
	if l != nil && l.direct {
		s.direct[id] = int32(l.fixed)
	}
}

// RawSyscalls returns the syscall events recorded through the raw
// syscall path (Config.Syscalls) and, when the raw path could have
// recorded some of the session's events but did not run, why.
func (s *Session) RawSyscalls() (events []string, why error) {
	for i, p := range s.tpProgs[:len(s.events)] {
		if p == gen.RingbufProgKcSysEnter || p == gen.RingbufProgKcSysExit {
			events = append(events, s.events[i].FullName())
		}
	}
	return events, s.sysErr
}

// Events returns the formats of the recorded tracepoints.
func (s *Session) Events() []*tracefs.Format { return s.events }

// Channel returns the relayfmt channel the session writes into.
func (s *Session) Channel() *relayfmt.Channel { return s.ch }

// Transport returns the transport in use.
func (s *Session) Transport() Transport { return s.transport }

// CPUs returns the number of possible CPUs, the per-CPU stream count.
func (s *Session) CPUs() int { return s.ncpu }

// Start opens the gate: the programs record from now on.
func (s *Session) Start() error {
	if err := s.running.Set(uint32(1)); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	s.started.Store(true)
	return nil
}

// Stop closes the gate: each event then costs the programs one branch.
// Records already in the rings are still drained.
func (s *Session) Stop() error {
	if err := s.running.Set(uint32(0)); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	s.started.Store(false)
	return nil
}

// Running reports whether the gate is open.
func (s *Session) Running() bool { return s.started.Load() }

// StopCPU stops recording on one CPU alone (the ftrace ring buffer's
// record_disable_cpu); StartCPU resumes it.
func (s *Session) StopCPU(cpu int) error { return s.setCPU(cpu, 1) }

// StartCPU resumes recording on cpu after StopCPU.
func (s *Session) StartCPU(cpu int) error { return s.setCPU(cpu, 0) }

// checkCPU fails for a CPU that does not exist, or, when perStream is
// set, in global mode, where CPUs share one buffer.
func (s *Session) checkCPU(cpu int, perStream bool) error {
	if perStream && s.cfg.Global {
		return ErrNeedsPerCPU
	}
	if cpu < 0 || cpu >= s.ncpu {
		return fmt.Errorf("cpu %d: %w", cpu, ErrNoSuchCPU)
	}
	return nil
}

func (s *Session) setCPU(cpu int, disabled uint32) error {
	if err := s.checkCPU(cpu, false); err != nil {
		return err
	}
	atomic.StoreUint32(&s.cpuState(cpu).Disabled, disabled)
	return nil
}

// Flush writes out everything recorded so far: drains the rings, writes
// the records waiting for reordering and finishes the open sub-buffers.
func (s *Session) Flush() error {
	return s.do(func() error {
		s.placeMissed()
		s.drainAll(^uint64(0))
		return s.ch.Flush()
	})
}

// FlushCPU is Flush for one CPU's buffer.
func (s *Session) FlushCPU(cpu int) error {
	if err := s.checkCPU(cpu, true); err != nil {
		return err
	}
	return s.do(func() error {
		st := s.streams[cpu]
		if st.rb != nil {
			s.drainRingbuf(st, ^uint64(0))
		} else if st.pr != nil {
			s.drainPerf(st, ^uint64(0))
		}
		return s.ch.FlushCPU(cpu)
	})
}

// Config returns the session's configuration with defaults filled in.
func (s *Session) Config() Config { return s.cfg }

// Reset drops everything not yet written: ring contents, waiting
// records, open and (overwrite mode) retained sub-buffers.
func (s *Session) Reset() error {
	return s.do(func() error {
		for _, st := range s.streams {
			s.resetStream(st)
		}
		s.ch.Reset()
		return nil
	})
}

// ResetCPU is Reset for one CPU's buffer (ftrace's reset_cpu).
func (s *Session) ResetCPU(cpu int) error {
	if err := s.checkCPU(cpu, true); err != nil {
		return err
	}
	return s.do(func() error {
		s.resetStream(s.streams[cpu])
		return s.ch.ResetCPU(cpu)
	})
}

func (s *Session) resetStream(st *stream) {
	for st.win.n > 0 {
		st.win.pop()
	}
	st.cps.clear()
	if st.rb != nil {
		st.rb.skipAll()
	}
	if st.pr != nil {
		st.pr.skipAll()
	}
}

// Snapshot (overwrite mode) drains the rings and writes the retained
// sub-buffers, the newest records, to the output.
func (s *Session) Snapshot() error {
	return s.do(func() error {
		s.drainAll(^uint64(0))
		return s.ch.Snapshot()
	})
}

// Rewind (overwrite mode) drains the rings and writes every sub-buffer
// the channel still holds, from the oldest, into dir as a complete trace
// of its own (metadata and streams): the relay channel's "read again from
// the oldest data", including what a Snapshot already wrote. dir must not
// exist; cpu selects one CPU's stream, or all when negative. It fails
// with ErrConfig in discard mode or when dir exists, and leaves no partial
// directory behind on error.
func (s *Session) Rewind(dir string, cpu int) error {
	if s.cfg.Mode != relayfmt.Overwrite {
		return fmt.Errorf("%w: rewind needs overwrite mode", ErrConfig)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: rewind: %s exists", ErrConfig, dir)
		}
		return fmt.Errorf("rewind: %w", err)
	}
	sink, err := relayfmt.NewDirSink(dir)
	if err == nil {
		err = s.do(func() error {
			s.drainAll(^uint64(0))
			return s.ch.RewindTo(sink, cpu)
		})
		err = errors.Join(err, sink.Close())
	}
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	return nil
}

// Stats returns per-CPU counters.
// After Close it returns the final counts.
func (s *Session) Stats() ([]CPUStats, error) {
	var out []CPUStats
	err := s.do(func() error {
		out = s.stats()
		return nil
	})
	if errors.Is(err, ErrClosed) && s.final != nil {
		return s.final, nil
	}
	return out, err
}

func (s *Session) stats() []CPUStats {
	out := make([]CPUStats, s.ncpu)
	for cpu := range out {
		cs := s.cpuState(cpu)
		out[cpu] = CPUStats{
			CPU:        cpu,
			Emitted:    s.emitted(cpu),
			KernelLost: s.kernelLost(cpu),
			Disabled:   atomic.LoadUint32(&cs.Disabled) != 0,
		}
	}
	out[0].Missed = s.missedSeen
	out[0].missedPlaced = s.lostMissed
	for _, st := range s.streams {
		o := &out[st.idx]
		o.Channel, _ = s.ch.StatsCPU(st.idx)
		o.Undecodable = st.undecodable
		o.Reordered = st.win.reordered
		o.Wakeups = st.wakeups
		if st.pr != nil {
			o.PerfLost = st.pr.lost
		}
	}
	return out
}

// do runs fn on the drainer goroutine, where the channel's writer state
// lives, and returns its error.
func (s *Session) do(fn func() error) error {
	c := command{fn: fn, reply: make(chan error, 1)}
	// s.cmds holds one command, so the send completes while the drainer
	// sleeps and the eventfd below wakes it; unbuffered, the send would
	// wait for the drainer's next latency tick.
	select {
	case s.cmds <- c:
	case <-s.done:
		return ErrClosed
	}
	// The drainer may be asleep in epoll_wait: the eventfd wakes it.
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(s.evfd, one[:])
	// The buffered send also succeeds after the drainer has returned,
	// which then never replies.
	select {
	case err := <-c.reply:
		return err
	case <-s.done:
		select {
		case err := <-c.reply:
			return err
		default:
			return ErrClosed
		}
	}
}

func (s *Session) startLoop() {
	s.looping.Store(true)
	go s.loop()
}

// loop is the drainer: it sleeps in epoll until a producer crosses the
// watermark, a command arrives or the latency tick passes, then drains
// every ring.
func (s *Session) loop() {
	defer close(s.done)
	// One thread keeps the rings' cache lines and gives the drainer's CPU
	// time an owner to measure.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s.loopTID.Store(int32(unix.Gettid()))
	events := make([]unix.EpollEvent, len(s.streams)+1)
	latency := int(s.cfg.Latency / time.Millisecond)
	timeout := latency
	var buf [8]byte
	for {
		t0 := time.Now()
		n, err := unix.EpollWait(s.epfd, events, timeout)
		s.drainer.wait(time.Since(t0), time.Duration(timeout)*time.Millisecond, s.cfg.Latency)
		if err != nil && !errors.Is(err, unix.EINTR) {
			s.loopErr = fmt.Errorf("epoll_wait: %w", err)
			return
		}
		for _, ev := range events[:max(n, 0)] {
			if ev.Fd < 0 {
				_, _ = unix.Read(s.evfd, buf[:])
			} else if int(ev.Fd) < len(s.streams) {
				s.streams[ev.Fd].wakeups++
			}
		}
		if s.transport == Perf && time.Since(s.lastPlug) > hotplugPeriod {
			s.lastPlug = time.Now()
			if err := s.checkHotplug(); err != nil {
				s.loopErr = err
			}
		}
		if time.Since(s.lastMissed) > missedPeriod {
			s.lastMissed = time.Now()
			s.placeMissed()
		}
		// A ring still holding a good part of a watermark is drained again
		// at once: no new crossing would wake us for it.
		timeout = latency
		if s.drainAll(s.cutoff()) {
			timeout = 0
		} else {
			s.arm()
		}
		for {
			select {
			case c := <-s.cmds:
				if c.fn == nil {
					c.reply <- nil
					return
				}
				c.reply <- c.fn()
				continue
			default:
			}
			break
		}
	}
}

// DrainerStats tells how promptly the drainer ran. Records reach the
// rings whether or not it runs, so a drainer not run for longer than a
// ring holds loses records however fast it drains: these counts tell that
// loss apart from one a faster drain would have avoided.
type DrainerStats struct {
	// Waits counts the drainer's sleeps between passes over the rings.
	Waits uint64
	// Late counts the sleeps that outlasted their timeout by more than
	// Config.Latency: the drainer ran that much later than it asked to,
	// its CPU busy with other work or, on a virtual machine, not run by
	// the host.
	Late uint64
	// LongestOverrun is the most a sleep outlasted its timeout.
	LongestOverrun time.Duration
}

// drainerCounts are DrainerStats as the drainer keeps them: atomic, so
// they can be read while it is late.
type drainerCounts struct {
	waits, late atomic.Uint64
	longest     atomic.Int64
}

// wait counts a sleep of d given timeout, late past it by more than latency.
func (c *drainerCounts) wait(d, timeout, latency time.Duration) {
	c.waits.Add(1)
	over := d - timeout
	if over > time.Duration(c.longest.Load()) {
		c.longest.Store(int64(over)) // the drainer is the only writer
	}
	if over > latency {
		c.late.Add(1)
	}
}

// Drainer returns how promptly the drainer ran, so far. It does not wait
// for the drainer, and works after Close.
func (s *Session) Drainer() DrainerStats {
	return DrainerStats{
		Waits:          s.drainer.waits.Load(),
		Late:           s.drainer.late.Load(),
		LongestOverrun: time.Duration(s.drainer.longest.Load()),
	}
}

// hotplugPeriod is how often the perf transport looks for CPUs that came
// online. BPF ring buffers exist for every possible CPU and need no check.
const hotplugPeriod = 100 * time.Millisecond

// missedPeriod is how often the recorder programs' recursion misses are
// read: one syscall per program, and before 5.15 there is a program per
// event. Flush and Close read them too.
const missedPeriod = time.Second

// cutoff returns the time before which waiting records are written: now
// minus the reorder window, on the records' clock.
func (s *Session) cutoff() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(s.clockID, &ts); err != nil {
		return 0
	}
	now := uint64(ts.Nano())
	if now < s.window {
		return 0
	}
	return now - s.window
}

// drainAll drains every ring and writes out the waiting records stamped
// before cutoff. It reports whether a ring still holds a quarter of the
// wakeup watermark or more.
func (s *Session) drainAll(cutoff uint64) (more bool) {
	for _, st := range s.streams {
		var left uint64
		if st.rb != nil {
			s.drainRingbuf(st, cutoff)
			left = st.rb.producer() - atomic.LoadUint64(st.rb.consPos)
		} else if st.pr != nil {
			s.drainPerf(st, cutoff)
			left = st.pr.head() - st.pr.tail
		} else if st.win != nil {
			// A perf CPU without a ring (offline when the session
			// opened, and not yet reopened): outputs there fail and the
			// recorder counts them; they are placed all the same.
			s.placeLossesOf(st)
			for st.win.n > 0 && st.win.front().ts <= cutoff {
				s.emit(st, st.win.pop())
			}
		}
		if left >= uint64(s.cfg.Watermark)/8 {
			more = true
		}
	}
	return more
}

// drainRingbuf walks st's ring in place, at most one lap. While no record
// waits in the stream's reorder window, records are written straight from
// the ring into the open sub-buffer as they are walked (walkOnce), every
// record read once; a record stamped before one already written sends the
// walk back to a checkpoint (rollback) and the window takes over. In the
// window, each record waits; when the window is full its oldest records
// are written, a sixteenth of it at a time, and once what waits is in
// ring order again it is all written out (catchUp) and the straight walk
// resumes. Ring space is released once per batch of a sixteenth of the
// ring, up to the oldest record still waiting or that a checkpoint may
// walk again.
func (s *Session) drainRingbuf(st *stream, cutoff uint64) {
	r, w := st.rb, st.win
	limit := r.cons + r.size // one lap per call, so other rings get their turn
	// Release space every sixteenth of the ring: a producer writing while
	// we drain sees the consumer position and must not find the ring full
	// because a whole lap was read before the first release.
	batch := r.size / 16
	room := max(1, len(w.buf)/16)
	for r.cons < limit {
		prod := min(r.producer(), r.cons+batch)
		if r.cons >= prod {
			break
		}
	walk:
		for {
			if r.cons >= st.replayEnd && (w.n == 0 || s.catchUp(st)) {
				switch why, ts := s.walkOnce(st, prod); why {
				case onceDone:
					break walk
				case onceLate:
					s.rollback(st, ts, r.cons)
				}
			}
			switch why, e := fillWindow(r, w, prod); why {
			case fillDone:
				break walk
			case fillFull:
				for range room {
					s.emit(st, w.pop())
				}
			case fillBad:
				s.undecodable(st)
			case fillLate:
				if e.ts >= s.ch.LastTS(st.idx) || !s.rollback(st, e.ts, e.pos) {
					w.insert(e)
				}
			}
		}
		r.release(st.cps.releasePos(w.releasePos(r.cons)))
		if r.cons < prod {
			break // stopped at a record still being written
		}
	}
	s.placeLossesOf(st)
	for w.n > 0 && w.front().ts <= cutoff {
		s.emit(st, w.pop())
	}
	s.catchUp(st)
	st.cps.dropFinal(cutoff, s.ch.LastTS(st.idx))
	r.release(st.cps.releasePos(w.releasePos(r.cons)))
}

// Why walkOnce returned.
const (
	onceDone  = iota // no finished record left before prod
	onceLate         // the record at r.cons is stamped before one written
	onceOther        // the record at r.cons goes through the window
)

// walkOnce writes the finished records of st's ring before prod straight
// into the channel, in ring order, while each is stamped no earlier than
// the newest written and fits the open sub-buffer; st's window must be
// empty. Every cps.every records it takes a checkpoint. It returns at the
// first record it cannot write so, with the ring's walk at that record
// (and its timestamp when it is late): a late one, one that needs a new
// sub-buffer (which makes everything before it final, so it waits in the
// window past the reorder bound), or one too short or long to be a record
// (which the window counts). A record it cannot decode is counted and
// placed as discarded, as emit does.
//
// A record of a class whose payload is the record as it is goes through a
// relayfmt.Run, inline; any other, or one the Run refuses, through write,
// with the Run synced around it. A global channel's Run takes nothing (its
// events carry their CPU), so walkWrite walks a global ring: a test for
// it in this loop cost the per-CPU drain a tenth of its speed.
func (s *Session) walkOnce(st *stream, prod uint64) (why int, late uint64) {
	if s.cfg.Global {
		return s.walkWrite(st, prod)
	}
	r, cps := st.rb, &st.cps
	data := r.data
	run := s.ch.Run(st.idx)
	defer run.Sync()
	cc := classCache{key: ^uint32(0)}
	for {
		pos := r.cons
		off, n, skip, ok := r.next(prod)
		if !ok {
			return onceDone, 0
		}
		if skip {
			continue
		}
		if n < uint32(recHdrLen) || uint64(n) > r.size {
			r.cons = pos
			return onceOther, 0
		}
		rec := data[off : off+n : off+n]
		ts := binary.LittleEndian.Uint64(rec)
		if ts < run.LastTS() {
			r.cons = pos
			return onceLate, ts
		}
		if cps.left <= 0 {
			run.Sync()
			cps.push(checkpoint{mark: s.ch.Mark(st.idx), pos: pos, reordered: st.win.reordered})
		}
		if key, payload := s.directPayload(rec, &cc); (payload == nil || !run.Put(ts, key, payload)) && !s.write(st, entry{ts: ts, pos: pos, off: off, n: n}, false, &run) {
			r.cons = pos
			return onceOther, 0
		}
		cps.left--
	}
}

// walkWrite is walkOnce writing every record through write.
func (s *Session) walkWrite(st *stream, prod uint64) (why int, late uint64) {
	r, cps := st.rb, &st.cps
	data := r.data
	last := s.ch.LastTS(st.idx)
	for {
		pos := r.cons
		off, n, skip, ok := r.next(prod)
		if !ok {
			return onceDone, 0
		}
		if skip {
			continue
		}
		if n < uint32(recHdrLen) || uint64(n) > r.size {
			r.cons = pos
			return onceOther, 0
		}
		ts := binary.LittleEndian.Uint64(data[off:])
		if ts < last {
			r.cons = pos
			return onceLate, ts
		}
		if cps.left <= 0 {
			cps.push(checkpoint{mark: s.ch.Mark(st.idx), pos: pos, reordered: st.win.reordered})
		}
		if !s.write(st, entry{ts: ts, pos: pos, off: off, n: n}, false, nil) {
			r.cons = pos
			return onceOther, 0
		}
		last = ts
		cps.left--
	}
}

// directPayload returns the class id of rec, a record of at least
// recHdrLen bytes, and its payload when its class's layout is the record's
// bytes as they are (layout.direct, the usual case, decoded here inline);
// a nil payload otherwise. c remembers the last class it looked up.
func (s *Session) directPayload(rec []byte, c *classCache) (uint32, []byte) {
	key := binary.LittleEndian.Uint32(rec[8:])
	n := int(binary.LittleEndian.Uint16(rec[12:]))
	if key != c.key {
		c.lookup(s, key)
	}
	if uint(c.size) > uint(n) || recHdrLen+n > len(rec) { // a size of -1 is above any n
		return key, nil
	}
	return key, rec[recHdrLen : recHdrLen+c.size]
}

// classCache is the last class a drain loop met and its payload size
// when its layout is direct (else -1): a run of records of one class
// reads no table.
type classCache struct {
	key  uint32
	size int
}

func (c *classCache) lookup(s *Session, key uint32) {
	c.key, c.size = key, -1
	if uint64(key) < uint64(len(s.direct)) {
		c.size = int(s.direct[key])
	}
}

// rollback is called for a record stamped late, before the newest one
// written, at ring position pos. It undoes the channel's writes back to
// the newest checkpoint before which nothing is stamped later (or, when
// none is, the oldest that can still be undone), empties the window (its
// records come after the checkpoint) and moves the ring's walk back
// there, so that the window takes the records again and inserts the late
// one in its place. It reports false when no checkpoint can be undone,
// having only forgotten them: the late record is then written with its
// timestamp raised (Stats.Clamped), as when it comes after its place
// left the window.
func (s *Session) rollback(st *stream, late, pos uint64) bool {
	cps, w := &st.cps, st.win
	i := cps.n - 1
	for i > 0 && cps.at(i).mark.TS() > late {
		i--
	}
	for ; i >= 0 && i < cps.n; i++ {
		cp := cps.at(i)
		if !s.ch.Undo(cp.mark) {
			continue
		}
		for w.n > 0 {
			if e := w.pop(); e.n == 0 {
				s.emit(st, e) // a loss notice: not in the ring to walk again
			}
		}
		st.rb.cons, st.replayEnd = cp.pos, pos+1
		w.newest, w.reordered = cp.mark.TS(), cp.reordered
		cps.truncate(i)
		st.rollbacks++
		return true
	}
	// A checkpoint that cannot be undone was taken in a sub-buffer that
	// is finished now, as were all the older ones.
	cps.clear()
	return false
}

// catchUp writes out every record waiting in st's window when they wait
// in ring order (no late record among them), behind a checkpoint at the
// first, and reports whether the window is empty then. It stops at a
// record that needs a new sub-buffer: that one waits until the window
// writes it, past the reorder bound.
func (s *Session) catchUp(st *stream) bool {
	w := st.win
	if w.unsorted != 0 {
		return false
	}
	var cp checkpoint
	marked := false
	// As in walkOnce; a global channel's Run takes nothing, and starting
	// it again is not free.
	fast := !s.cfg.Global
	var run relayfmt.Run
	if fast {
		run = s.ch.Run(st.idx)
	}
	defer run.Sync()
	cc := classCache{key: ^uint32(0)}
	for w.n > 0 {
		e := w.front()
		if e.n == 0 {
			run.Sync()
			s.emit(st, w.pop())
			if fast {
				run = s.ch.Run(st.idx)
			}
			continue
		}
		if !marked {
			run.Sync()
			cp = checkpoint{mark: s.ch.Mark(st.idx), pos: e.pos, reordered: w.reordered}
		}
		if fast {
			rec := st.record(*e)
			if key, payload := s.directPayload(rec, &cc); (payload == nil || !run.Put(e.ts, key, payload)) && !s.write(st, *e, false, &run) {
				return false
			}
		} else if !s.write(st, *e, false, nil) {
			return false
		}
		if !marked {
			st.cps.push(cp)
			marked = true
		}
		st.cps.left--
		w.pop()
	}
	return true
}

// Why fillWindow returned.
const (
	fillDone = iota // no finished record left before prod
	fillFull        // the window is full
	fillBad         // a record too short or too long to decode was skipped
	fillLate        // the returned record is older than the newest waiting
)

// fillWindow moves the finished records of r before prod into w, in ring
// order, while each is stamped no earlier than the newest waiting and w
// has room; it skips discarded records. It returns at the first record it
// cannot append, with the reason, so that the loop over the records calls
// nothing: Go spills every live register around a call, and a write
// between two records' walks made the walk reload its state each time.
func fillWindow(r *ringbuf, w *window, prod uint64) (why int, late entry) {
	data := r.data
	for w.n < len(w.buf) {
		pos := r.cons
		off, n, skip, ok := r.next(prod)
		if !ok {
			return fillDone, entry{}
		}
		if skip {
			continue
		}
		if n < uint32(recHdrLen) || uint64(n) > r.size {
			return fillBad, entry{}
		}
		e := entry{ts: binary.LittleEndian.Uint64(data[off:]), pos: pos, off: off, n: n}
		if e.ts < w.newest {
			return fillLate, e
		}
		w.append(e)
	}
	return fillFull, entry{}
}

// filtered reports whether the recorder filters tasks in the kernel.
func (s *Session) filtered() bool {
	return len(s.cfg.PIDs) > 0 || len(s.cfg.Comms) > 0 || s.cfg.Cgroup != ""
}

// placeMissed counts the recorder runs the kernel skipped since the last
// call and places in stream 0 (their CPU is unknown) those that were
// events lost: when nothing is filtered, the misses of the tracepoint
// recorders. The raw syscall programs run for every syscall, recorded or
// not, so their misses only count.
func (s *Session) placeMissed() {
	var all, lost uint64
	for name, p := range s.coll.Programs {
		raw := name == gen.RingbufProgKcSysEnter || name == gen.RingbufProgKcSysExit
		if !raw && name != gen.RingbufProgKcTracepoint && !strings.HasPrefix(name, "kc_tp_") {
			continue
		}
		st, err := p.Stats()
		if err != nil {
			continue
		}
		all += st.RecursionMisses
		if !raw {
			lost += st.RecursionMisses
		}
	}
	s.missedSeen = max(s.missedSeen, all)
	if !s.filtered() && lost > s.lostMissed {
		s.pushLoss(s.streams[0], lost-s.lostMissed)
		s.lostMissed = lost
	}
}

// placeLossesOf puts the kernel-side losses of st's CPUs into its window
// after the newest record there, so they land where they happened.
func (s *Session) placeLossesOf(st *stream) {
	first, last := st.idx, st.idx
	if s.cfg.Global {
		first, last = 0, s.ncpu-1
	}
	for cpu := first; cpu <= last; cpu++ {
		lost := s.kernelLost(cpu)
		if d := lost - s.lostSeen[cpu]; d > 0 {
			s.lostSeen[cpu] = lost
			s.pushLoss(st, d)
		}
	}
}

func (s *Session) pushLoss(st *stream, n uint64) {
	if st.win.full() {
		s.emit(st, st.win.pop())
	}
	st.win.push(entry{ts: st.win.last(), pos: n})
}

// undecodable counts a record the consumer cannot decode and writes it
// into the stream as discarded at this place.
func (s *Session) undecodable(st *stream) {
	// Walked again after a rollback, it would be counted twice.
	st.cps.clear()
	st.undecodable++
	_ = s.ch.Discard(st.idx, 1)
}

// record returns the bytes of a waiting entry's record.
func (st *stream) record(e entry) []byte {
	if e.off&wrapBit != 0 {
		b := st.pr.wrap[(e.off/wrapIdx)&1]
		o := e.off &^ (wrapBit | wrapIdx)
		return b[o : o+e.n]
	}
	return st.data[e.off : e.off+e.n : e.off+e.n]
}

// emit writes one waiting entry into the channel. Records the channel
// cannot take are counted there (dropped, invalid) and reported in the
// stream; a record this consumer cannot decode counts as undecodable.
func (s *Session) emit(st *stream, e entry) { s.write(st, e, true, nil) }

// write is emit, and with open false what the channel's Append does: it
// returns false, having written nothing, when the record needs a new
// sub-buffer. With run set (a Run on st's buffer) it writes through the
// Run, open false: the drain's path for a record its inline path does
// not take, which may still fit the Run once decoded (a transcoded one).
// The record is decoded here, not in a function of its own: a second
// call per record cost the perf drain 5 %.
func (s *Session) write(st *stream, e entry, open bool, run *relayfmt.Run) bool {
	if e.n == 0 {
		_ = s.ch.Discard(st.idx, e.pos)
		return true
	}
	rec := st.record(e)
	key := binary.LittleEndian.Uint32(rec[8:])
	n := int(binary.LittleEndian.Uint16(rec[12:]))
	cpu := st.idx
	if s.cfg.Global {
		cpu = int(binary.LittleEndian.Uint16(rec[14:]))
	}
	if recHdrLen+n > len(rec) || uint64(key) >= uint64(len(s.layouts)) || s.layouts[key] == nil {
		s.undecodableRun(st, run)
		return true
	}
	raw := rec[recHdrLen : recHdrLen+n]
	l := s.layouts[key]
	var payload []byte
	if l.asIs {
		payload = raw
	} else if l.direct {
		if n < l.fixed {
			s.undecodableRun(st, run)
			return true
		}
		payload = raw[:l.fixed]
	} else {
		var ok bool
		if st.scratch, ok = l.transcode(st.scratch[:0], raw); !ok {
			s.undecodableRun(st, run)
			return true
		}
		payload = st.scratch
	}
	// A record the channel rejects is counted there.
	if run != nil {
		if run.Put(e.ts, key, payload) {
			return true
		}
		written, _ := run.Append(e.ts, key, payload)
		return written
	}
	if open {
		_ = s.ch.Write(cpu, e.ts, key, payload)
		return true
	}
	written, _ := s.ch.Append(cpu, e.ts, key, payload)
	return written
}

// undecodableRun is undecodable for write, with st's Run (when not nil)
// synced before and started again after.
func (s *Session) undecodableRun(st *stream, run *relayfmt.Run) {
	if run == nil {
		s.undecodable(st)
		return
	}
	run.Sync()
	s.undecodable(st)
	*run = s.ch.Run(st.idx)
}

// Close stops recording, detaches every program, drains and writes out
// what the rings hold, and closes the channel (in overwrite mode writing
// the retained sub-buffers). It is idempotent; later calls return the
// first call's result.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.running != nil {
			if err := s.running.Set(uint32(0)); err != nil {
				errs = append(errs, err)
			}
		}
		for _, l := range s.links {
			if err := l.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		s.links = nil
		for _, o := range s.objects {
			o.close()
		}
		s.objects = nil
		if s.cmds != nil && s.epfd >= 0 && s.isLooping() {
			errs = append(errs, s.do(func() error {
				s.placeMissed()
				s.drainAll(^uint64(0))
				return nil
			}))
			_ = s.do(nil)
		}
		if s.loopErr != nil {
			errs = append(errs, s.loopErr)
		}
		if s.ch != nil {
			errs = append(errs, s.ch.Close())
			if s.stateMem != nil {
				s.final = s.stats()
			}
		}
		s.release()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

func (s *Session) isLooping() bool {
	select {
	case <-s.done:
		return false
	default:
		return s.looping.Load()
	}
}

// release frees kernel objects and mappings.
func (s *Session) release() {
	for _, l := range s.links {
		_ = l.Close()
	}
	s.links = nil
	for _, o := range s.objects {
		o.close()
	}
	s.objects = nil
	for _, st := range s.streams {
		if st.rb != nil {
			st.rb.close()
		}
		if st.pr != nil {
			st.pr.close()
		}
	}
	for _, m := range s.rings {
		_ = m.Close()
	}
	s.rings = nil
	if s.stateMem != nil {
		_ = unix.Munmap(s.stateMem)
		s.stateMem = nil
	}
	if s.coll != nil {
		s.coll.Close()
		s.coll = nil
	}
	if s.epfd >= 0 {
		_ = unix.Close(s.epfd)
		s.epfd = -1
	}
	if s.evfd >= 0 {
		_ = unix.Close(s.evfd)
		s.evfd = -1
	}
}
