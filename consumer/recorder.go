package consumer

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
)

// cpuStateLen is sizeof(struct kc_cpu_state): one cache line.
const cpuStateLen = int(unsafe.Sizeof(gen.RingbufKcCpuState{}))

// recorder is the BPF side of a session: the loaded recorder object, its
// gate and per-CPU counters (kc_state, mapped), the kernel-side filters,
// the links that attach it, the ring maps it writes into and the users'
// objects loaded onto the same rings. Setup (load, attach) happens
// before the drainer runs; afterwards its methods are safe for
// concurrent use.
type recorder struct {
	cfg        Config
	ncpu       int
	transport  Transport
	coll       *ebpf.Collection
	rings      []*ebpf.Map // the inner BPF ring buffers, by stream
	links      []link.Link
	running    *ebpf.Variable
	stateMem   []byte
	useCookie  bool           // event keys come from attach cookies
	preempt    Preemptible    // whether tracing programs run preemptibly here (preempt.go)
	rawPerf    bool           // the raw syscall path rides on the perf tracepoints (preempt.go)
	tpProgs    []string       // the recorder copy attached for each event key
	sysErr     error          // why syscall events are not on the raw syscall path
	btfErr     error          // why an event is not on the BTF path
	fentry     map[int]string // event key → its fentry or fexit program copy
	fentryErr  error          // why syscall events are not on the function path
	btfKeys    map[int]string // event key → the BTF program loaded for it
	switchKey  uint32         // wakeup_latency: sched_switch's key and info
	switchInfo gen.RingbufKcTpInfo
	objects    []*object // users' programs (Config.Objects)
	// objMu guards objects against detach while the drainer reads their
	// programs' misses; objMissed keeps those of the objects detached.
	objMu     sync.Mutex
	objMissed uint64
	area      bool   // the programs write into kc_area rings (area.go)
	areaErr   error  // why they do not
	areaMem   []byte // kc_area, mapped
	pkt       bool   // its elements are packets the writers fill (packet.go)
	pktErr    error  // why they are not
	pktElem   int    // their size
	// userFault is set when kc_sys_user_fault pages in the user memory
	// of syscall events' user-space fields (sysuser.go); userFaultErr
	// says why not, where some event has them.
	userFault    bool
	userFaultErr error
	userOn       bool // kc_sys_user is on: some event has user-space fields
	// userRec is set when kc_sys_user_fault, once attached, records the
	// events it pages memory in for, which then need no tracepoint;
	// userTP when kc_tracepoint fills user-space fields, for the others.
	userRec   bool
	userTP    bool
	injectMu  sync.Mutex
	injectRec *gen.RingbufKcInjectRec
	// keep is what the recording keeps for a recover after a kill
	// (crash.go), nil when it keeps nothing.
	keep *crashKeep
}

// loadOpts replaces the recorder by another object built on kconsume.h
// (the bench producer), with values for its own variables, or turns on
// the recorder's hooks (synthetic:wakeup_latency).
type loadOpts struct {
	spec   *ebpf.CollectionSpec
	vars   map[string]any
	hooks  bool
	small  []uint32          // per event key: its record size when smallSize allows, or 0
	sys    bool              // some event may take the raw syscall path (sysShape)
	user   bool              // some event has user-space fields (sysUserOf)
	userNr bool              // each such event has a number kc_sys_user_fault dispatches by
	btf    map[string]btfUse // by BTF program: the event it records (btfShape)
	// sysEvents are the syscall events the syscall programs can build.
	sysEvents []sysEvent
	// pktRaw and pktTP are nil when the events can be written in packet
	// mode, else why not (pktEligible): with syscall events on the raw
	// syscall path, and through their tracepoints.
	pktRaw, pktTP error
}

// smallSize returns the record size of f when the recorder can copy it
// straight into the ring with a program copy of its own size
// (kc_record_small in bpf/kconsume.bpf.c): a multiple of 2 from 8 to
// smallMax bytes, without dynamic fields. Otherwise it returns 0.
func smallSize(f *tracefs.Format) uint32 {
	n := f.FixedSize()
	if n < 8 || n > smallMax || n%2 != 0 {
		return 0
	}
	for _, fl := range f.All() {
		if fl.Loc != tracefs.Inline {
			return 0
		}
	}
	return uint32(n)
}

// noCookie makes the loader patch a program copy per event even where the
// kernel has attach cookies, so tests exercise both ways on one kernel.
var noCookie = false

// keyPlaceholder, sizePlaceholder and nrPlaceholder are
// KC_KEY_PLACEHOLDER, KC_SIZE_PLACEHOLDER and KC_NR_PLACEHOLDER of
// bpf/kc/; smallMax is KC_SMALL_MAX (TestMirrorsC checks them).
const (
	keyPlaceholder  = 0x6b634b4559
	sizePlaceholder = 0x6b6353495a
	nrPlaceholder   = 0x6b634e5253
	smallMax        = 128
)

// loadRecorder creates the maps and the programs of transport for
// nevents events: one program told each event's key by the attach
// cookie, or on kernels before 5.15 one program copy per event with its
// key patched in. It returns the recorder with its gate closed and its
// wakeups armed, or the error of the step that failed, having released
// what it made.
func loadRecorder(cfg Config, ncpu int, transport Transport, nevents int, opts *loadOpts) (_ *recorder, err error) {
	r := &recorder{cfg: cfg, ncpu: ncpu, transport: transport, btfKeys: map[int]string{}, fentry: map[int]string{}}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK (64 KiB by
	// default), which a few rings exceed; later ones use memcg
	// accounting and this does nothing.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("raising RLIMIT_MEMLOCK for BPF maps: %w", err)
	}
	var spec *ebpf.CollectionSpec
	set := map[string]any{}
	switch {
	case opts != nil && opts.spec != nil:
		spec = opts.spec
		maps.Copy(set, opts.vars)
	case transport == Perf:
		spec, err = gen.LoadPerf()
	default:
		spec, err = gen.LoadRingbuf()
	}
	if err != nil {
		return nil, err
	}
	spec.Maps[gen.RingbufMapKcState].MaxEntries = uint32(2 * ncpu)
	if m := spec.Maps[gen.RingbufMapKcTpInfoMap]; m != nil {
		m.MaxEntries = uint32(max(nevents, 1))
		r.useCookie = !noCookie && features.HaveProgramHelper(ebpf.TracePoint, asm.FnGetAttachCookie) == nil
		set[gen.RingbufVarKcUseCookie] = boolU32(r.useCookie)
		set[gen.RingbufVarKcFilterPid] = boolU32(len(cfg.PIDs) > 0)
		set[gen.RingbufVarKcPidBits] = pidBits(cfg.PIDs)
		set[gen.RingbufVarKcFilterCgroup] = boolU32(cfg.Cgroup != "")
		set[gen.RingbufVarKcFilterComm] = boolU32(len(cfg.Comms) > 0)
		set[gen.RingbufVarKcHooks] = boolU32(opts != nil && opts.hooks)
		if err := r.copies(spec, nevents, opts); err != nil {
			return nil, err
		}
	}
	if opts != nil && opts.spec != nil {
		r.areaErr = errors.New("another producer writes the BPF ring buffers")
	} else {
		r.areaErr = areaUsable(cfg, ncpu, transport, cfg.Objects)
		r.area = r.areaErr == nil
	}
	raw := opts != nil && opts.sys
	if raw {
		if r.sysErr = r.rawSysPossible(); r.sysErr != nil && cfg.Syscalls == SyscallsRaw {
			return nil, fmt.Errorf("raw syscall path: %w", r.sysErr)
		}
	}
	r.preempt = preemptible()
	if forcePreemptible {
		r.preempt = Preemptible{On: true, Why: "forced by a test"}
	}
	r.pktErr = errors.New("no events given")
	if opts != nil && opts.spec == nil {
		// A kernel that refuses the raw syscall programs' load refuses
		// packet mode's first: the fallbacks below drop it before them.
		r.pktErr = opts.pktTP
		if raw && r.sysErr == nil {
			r.pktErr = opts.pktRaw
		}
	}
	if !r.area {
		r.pktErr = fmt.Errorf("no kc_area rings: %w", r.areaErr)
	}
	r.pkt = r.pktErr == nil
	if r.area {
		setupArea(spec, set, cfg, ncpu, gen.RingbufMapKcArea, r.pkt)
		if r.pkt {
			r.pktElem, _ = pktShape(cfg)
		}
	} else {
		stripArea(spec)
	}
	if transport == Ringbuf {
		rings := spec.Maps[gen.RingbufMapKcRings]
		rings.MaxEntries = uint32(ncpu)
		rings.InnerMap.MaxEntries = uint32(r.ringSize())
		set[gen.RingbufVarKcWakeupBytes] = uint64(cfg.Watermark)
		if r.pkt {
			// A packet is what the drainer takes: waking it for less
			// would wake it for nothing.
			set[gen.RingbufVarKcWakeupBytes] = uint64(max(cfg.Watermark, r.pktElem))
		}
		set[gen.RingbufVarKcWakeupMask] = wakeupMask(cfg, ncpu)
	} else {
		spec.Maps[gen.PerfMapKcPerf].MaxEntries = uint32(ncpu)
	}
	if spec.Variables[gen.RingbufVarKcSelfTgid] != nil {
		set[gen.RingbufVarKcSelfTgid] = uint32(os.Getpid())
	}
	set[gen.RingbufVarKcClock] = uint32(cfg.Clock)
	set[gen.RingbufVarKcGlobal] = boolU32(cfg.Global)
	if spec.Programs[gen.RingbufProgKcSysEnter] != nil {
		if !raw || r.sysErr != nil {
			dropRawSys(spec)
		} else {
			r.rawPerf = r.preempt.On
			rawFromPerf(spec, r.rawPerf)
			set[gen.RingbufVarKcTaskBtf] = boolU32(taskBTF())
		}
	}
	if spec.Programs[gen.RingbufProgKcSysFentry] != nil {
		var evs []sysEvent
		if opts != nil {
			evs = opts.sysEvents
		}
		if err := r.fentryCopies(spec, evs); err != nil {
			return nil, err
		}
		if len(r.fentry) > 0 {
			set[gen.RingbufVarKcTaskBtf] = boolU32(taskBTF())
		}
	}
	var uses map[string]btfUse
	if opts != nil {
		uses = opts.btf
	}
	r.setupBTF(spec, set, uses)
	r.setupUserFault(spec, opts != nil && opts.user, opts != nil && opts.userNr)
	for name, v := range set {
		vs := spec.Variables[name]
		if vs == nil {
			return nil, fmt.Errorf("BPF object has no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return nil, fmt.Errorf("setting %s: %w", name, err)
		}
	}
	r.coll, err = ebpf.NewCollection(spec)
	if err != nil && spec.Programs[gen.RingbufProgKcSysUserFault] != nil {
		// Paging user memory in is the newest part: the first to go.
		r.userFaultErr = fmt.Errorf("loading: %w", err)
		delete(spec.Programs, gen.RingbufProgKcSysUserFault)
		r.userRec, r.userTP = false, r.userOn
		r.setUserVars(spec)
		r.coll, err = ebpf.NewCollection(spec)
	}
	if err != nil && r.pkt {
		// Packet mode is the newest writer of all.
		r.pkt, r.pktErr = false, fmt.Errorf("loading: %w", err)
		elem, count := areaShape(cfg.RingSize)
		r.pktElem = 0
		for name, v := range map[string]any{gen.RingbufVarKcPktOn: uint32(0), gen.RingbufVarKcWakeupBytes: uint64(cfg.Watermark), gen.RingbufVarKcAreaEsize: uint64(elem),
			gen.RingbufVarKcAreaEshift: uint32(bits.TrailingZeros(uint(elem))), gen.RingbufVarKcAreaKmask: uint32(count - 1)} {
			if err := spec.Variables[name].Set(v); err != nil {
				return nil, fmt.Errorf("setting %s: %w", name, err)
			}
		}
		spec.Maps[gen.RingbufMapKcArea].ValueSize = uint32(elem)
		spec.Maps[gen.RingbufMapKcArea].MaxEntries = uint32(ncpu * count)
		r.coll, err = ebpf.NewCollection(spec)
	}
	if err != nil && r.area {
		// The own rings are an optimisation, and the newest code: the
		// first to go when the kernel refuses the recorder.
		r.area, r.areaErr = false, fmt.Errorf("loading: %w", err)
		r.pkt, r.pktErr = false, fmt.Errorf("no kc_area rings: %w", r.areaErr)
		spec.Maps[gen.RingbufMapKcRings].InnerMap.MaxEntries = uint32(cfg.RingSize)
		if err := spec.Variables[gen.RingbufVarKcAreaOn].Set(uint32(0)); err != nil {
			return nil, fmt.Errorf("setting %s: %w", gen.RingbufVarKcAreaOn, err)
		}
		stripArea(spec)
		r.coll, err = ebpf.NewCollection(spec)
	}
	if err != nil && len(r.fentry) > 0 && cfg.Syscalls == SyscallsFentry {
		return nil, fmt.Errorf("fentry syscall path: loading the BPF recorder: %w", err)
	}
	if err != nil && len(r.fentry) > 0 {
		// The function path is an optimisation too.
		r.fentryErr = fmt.Errorf("loading: %w", err)
		r.dropFentry(spec)
		r.coll, err = ebpf.NewCollection(spec)
	}
	if err != nil && spec.Programs[gen.RingbufProgKcSysEnter] != nil && cfg.Syscalls != SyscallsRaw {
		// The raw syscall path is an optimisation: a kernel that refuses
		// it records syscall events through their tracepoints.
		r.sysErr = fmt.Errorf("loading: %w", err)
		dropRawSys(spec)
		r.coll, err = ebpf.NewCollection(spec)
	}
	if err != nil && len(r.btfKeys) > 0 {
		// So is the BTF event path.
		r.btfErr = fmt.Errorf("loading: %w", err)
		r.dropBTF(spec)
		r.coll, err = ebpf.NewCollection(spec)
	}
	if err != nil {
		return nil, fmt.Errorf("loading the BPF recorder: %w", err)
	}
	if r.area {
		if err := r.mapArea(); err != nil {
			return nil, err
		}
	}
	r.running = r.coll.Variables[gen.RingbufVarKcRunning]
	state := r.coll.Maps[gen.RingbufMapKcState]
	r.stateMem, err = unix.Mmap(state.FD(), 0, roundPage(2*ncpu*cpuStateLen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping kc_state: %w", err)
	}
	r.arm(cfg.Latency > 0) // the drainer starts asleep
	if opts != nil && opts.spec != nil {
		return r, nil
	}
	return r, r.setFilters()
}

// copies makes the recorder's program copies in spec. With attach
// cookies: kc_tracepoint for every event, plus kc_tp_sN for the events
// of small record size N (kc_record_small). Without: kc_tp_I for event
// key I, with I patched in, on the general path only (a copy that perf
// refused to attach would have no general copy to fall back to).
func (r *recorder) copies(spec *ebpf.CollectionSpec, nevents int, opts *loadOpts) error {
	orig := spec.Programs[gen.RingbufProgKcTracepoint]
	base := orig
	if r.transport == Ringbuf { // the perf object has no kc_record_small
		var err error
		if base, err = patchImm(base, base.Name, sizePlaceholder, 0); err != nil {
			return err
		}
		spec.Programs[base.Name] = base
	}
	if !r.useCookie {
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
	if r.transport != Ringbuf || opts == nil {
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

// pidBits returns kc_pid_bits of bpf/filter.h for the ids pids: bit
// id % (64 × len) set for each.
func pidBits(pids []int) [1024]uint64 {
	var bits [1024]uint64
	for _, p := range pids {
		i := uint32(p) % (64 * uint32(len(bits)))
		bits[i/64] |= 1 << (i % 64)
	}
	return bits
}

// setFilters fills the kernel-side filter maps from the configuration.
func (r *recorder) setFilters() error {
	for _, p := range r.cfg.PIDs {
		if err := r.coll.Maps[gen.RingbufMapKcPids].Put(uint32(p), uint8(1)); err != nil {
			return fmt.Errorf("pid filter %d: %w", p, err)
		}
	}
	for _, c := range r.cfg.Comms {
		var key gen.RingbufKcComm
		for i := 0; i < len(c); i++ {
			key.Comm[i] = int8(c[i])
		}
		if err := r.coll.Maps[gen.RingbufMapKcComms].Put(key, uint8(1)); err != nil {
			return fmt.Errorf("comm filter %q: %w", c, err)
		}
	}
	if r.cfg.Cgroup != "" {
		fd, err := unix.Open(r.cfg.Cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: cgroup %s: %w", ErrConfig, r.cfg.Cgroup, err)
		}
		defer unix.Close(fd)
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			return fmt.Errorf("%w: %s is not a cgroup v2 directory", ErrConfig, r.cfg.Cgroup)
		}
		if err := r.coll.Maps[gen.RingbufMapKcCgroup].Put(uint32(0), uint32(fd)); err != nil {
			return fmt.Errorf("cgroup filter %s: %w", r.cfg.Cgroup, err)
		}
	}
	return nil
}

// filtered reports whether the recorder filters tasks in the kernel.
func (r *recorder) filtered() bool {
	return len(r.cfg.PIDs) > 0 || len(r.cfg.Comms) > 0 || r.cfg.Cgroup != ""
}

// cpuState returns CPU cpu's slot of the mapped kc_state array; the
// slots from ncpu on count the records of users' programs.
func (r *recorder) cpuState(cpu int) *gen.RingbufKcCpuState {
	return (*gen.RingbufKcCpuState)(unsafe.Pointer(&r.stateMem[cpu*cpuStateLen]))
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
	// sampledMax mirrors KC_SAMPLED_MAX (bpf/kc/core.h), the largest
	// ring record a sampled wakeup check may pass over.
	sampledMax = 256
	// maxWakeupStride caps the records between two looks at a ring's fill.
	maxWakeupStride = 64
)

// Bits of kc_cpu_state.armed (bpf/kc/core.h: KC_ARM_*).
const (
	armFill = 1 // wake at the watermark
	armData = 2 // wake at the first record of another process
)

// arm tells the writers into the rings that the drainer is about to
// sleep: their next look at a ring's fill over the watermark wakes it,
// and with data set so does the first record of a process other than
// this one. A drainer that goes round again at once is not armed, or a
// ring kept over the watermark would wake it on every pass. The store
// is skipped when a slot is armed so already, so the writers' cache line
// is not taken away for nothing.
func (r *recorder) arm(data bool) {
	if r.transport != Ringbuf {
		return
	}
	want := uint32(armFill)
	if data {
		want |= armData
	}
	for slot := range 2 * r.ncpu {
		if cs := r.cpuState(slot); atomic.LoadUint32(&cs.Armed) != want {
			atomic.StoreUint32(&cs.Armed, want)
		}
	}
}

// disarm takes back what arm asked for, so that a drainer awake for
// another reason (its timer, a command) is not woken again for nothing.
func (r *recorder) disarm() {
	if r.transport != Ringbuf {
		return
	}
	for slot := range 2 * r.ncpu {
		if cs := r.cpuState(slot); atomic.LoadUint32(&cs.Armed) != 0 {
			atomic.StoreUint32(&cs.Armed, 0)
		}
	}
}

// wokeAt returns when the writers of slot last woke the drainer, on
// CLOCK_MONOTONIC, or 0.
func (r *recorder) wokeAt(slot int) uint64 {
	return atomic.LoadUint64(&r.cpuState(slot).WokeAt)
}

// emitted returns the records the kernel side put into cpu's ring.
func (r *recorder) emitted(cpu int) uint64 {
	return atomic.LoadUint64(&r.cpuState(cpu).Emitted) + atomic.LoadUint64(&r.cpuState(r.ncpu+cpu).Emitted)
}

// kernelLost returns the records the kernel side failed to put into
// cpu's ring.
func (r *recorder) kernelLost(cpu int) uint64 {
	return atomic.LoadUint64(&r.cpuState(cpu).Lost) + atomic.LoadUint64(&r.cpuState(r.ncpu+cpu).Lost)
}

// setRunning opens or closes the gate every program checks first.
func (r *recorder) setRunning(on bool) error {
	return r.running.Set(boolU32(on))
}

// setCPUDisabled closes (or reopens) the gate of cpu alone.
func (r *recorder) setCPUDisabled(cpu int, disabled bool) {
	atomic.StoreUint32(&r.cpuState(cpu).Disabled, boolU32(disabled))
}

// cpuDisabled reports whether cpu's own gate is closed.
func (r *recorder) cpuDisabled(cpu int) bool {
	return atomic.LoadUint32(&r.cpuState(cpu).Disabled) != 0
}

// missed returns the recorder runs the kernel skipped so far because a
// BPF program already ran on the CPU (the programs' recursion_misses):
// all of them, and those of the tracepoint recorders alone, each of
// which was an event lost. The raw syscall programs run for every
// syscall, recorded or not, and users' programs (Config.Objects) may
// write any number of events a run, so theirs count in all alone. A
// program of a BTF tracepoint misses whenever another run of it is on
// the CPU: one preempted on a faultable syscall tracepoint (6.13+)
// leaves every run on that CPU missed until it resumes.
func (r *recorder) missed() (all, lost uint64) {
	r.objMu.Lock()
	all = r.objMissed + objectsMissed(r.objects)
	r.objMu.Unlock()
	for name, p := range r.coll.Programs {
		raw := name == gen.RingbufProgKcSysEnter || name == gen.RingbufProgKcSysExit
		if !raw && name != gen.RingbufProgKcTracepoint && !strings.HasPrefix(name, "kc_tp_") && !strings.HasPrefix(name, fentryPrefix) && !isBTFProg(name) {
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
	return all, lost
}

// ringSize returns the size of the BPF ring buffers: the rings, or with
// kc_area the doorbells.
func (r *recorder) ringSize() int {
	if r.area {
		return bellSize
	}
	return r.cfg.RingSize
}

// newRing creates the BPF ring buffer of stream i and puts it in the
// recorder's array of rings; it returns the map.
func (r *recorder) newRing(i int) (*ebpf.Map, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: fmt.Sprintf("kc_ring%d", i), Type: ebpf.RingBuf, MaxEntries: uint32(r.ringSize())})
	if err != nil {
		return nil, fmt.Errorf("ring buffer %d: %w", i, err)
	}
	r.rings = append(r.rings, m)
	if err := r.coll.Maps[gen.RingbufMapKcRings].Put(uint32(i), m); err != nil {
		return nil, fmt.Errorf("ring buffer %d: %w", i, err)
	}
	return m, nil
}

// setPerf points cpu's slot of the perf event array at the perf event fd.
func (r *recorder) setPerf(cpu, fd int) error {
	if err := r.coll.Maps[gen.PerfMapKcPerf].Put(uint32(cpu), uint32(fd)); err != nil {
		return fmt.Errorf("perf event array slot %d: %w", cpu, err)
	}
	return nil
}

// attachTracepoint attaches the recorder copy for event key i to the
// tracepoint f, with its size-specialised copy when there is one and the
// record goes into the ring as it is (asIs: not built by steps in packet
// mode).
func (r *recorder) attachTracepoint(f *tracefs.Format, i int, recorded, asIs bool) error {
	name, opts := "kc_tp_"+strconv.Itoa(i), (*link.TracepointOptions)(nil)
	if r.useCookie {
		name, opts = gen.RingbufProgKcTracepoint, &link.TracepointOptions{Cookie: uint64(i)}
		// A record whose program builds its payload (packet mode's
		// steps) goes through the scratch record, never a small copy.
		if small := smallProg(smallSize(f)); recorded && asIs && r.coll.Programs[small] != nil {
			name = small
		}
	}
	lk, err := link.Tracepoint(f.System, f.Name, r.coll.Programs[name], opts)
	if errors.Is(err, unix.EACCES) && name != gen.RingbufProgKcTracepoint && r.useCookie {
		// perf checks a copy's loads against the event's last field
		// (max_ctx_offset); where that is not its largest, record the
		// event the general way.
		name = gen.RingbufProgKcTracepoint
		lk, err = link.Tracepoint(f.System, f.Name, r.coll.Programs[name], opts)
	}
	if err != nil {
		return fmt.Errorf("attaching to %s: %w", f.FullName(), err)
	}
	r.links = append(r.links, lk)
	r.tpProgs = append(r.tpProgs, name)
	return nil
}

// inject runs the injector on cpu with one record of key. It fails with
// ErrStopped when the gate is closed and ErrInjectLost when the ring was
// full.
func (r *recorder) inject(cpu int, key uint32, payload []byte) error {
	prog := r.coll.Programs[gen.RingbufProgKcInject]
	buf := r.coll.Maps[gen.RingbufMapKcInjectBuf]
	if prog == nil || buf == nil {
		return errors.New("inject: this session's recorder has no injector")
	}
	if cpu < 0 || cpu >= r.ncpu {
		return fmt.Errorf("%w: inject: no CPU %d (0..%d)", ErrConfig, cpu, r.ncpu-1)
	}
	r.injectMu.Lock()
	defer r.injectMu.Unlock()
	if r.injectRec == nil {
		r.injectRec = new(gen.RingbufKcInjectRec)
	}
	rec := r.injectRec
	if len(payload) > len(rec.Data)-1 {
		return fmt.Errorf("inject: payload of %d bytes, at most %d", len(payload), len(rec.Data)-1)
	}
	rec.Key, rec.Len = key, uint32(len(payload))
	copy(rec.Data[:], payload)
	if err := buf.Put(uint32(0), rec); err != nil {
		return fmt.Errorf("inject: %w", err)
	}
	ret, err := prog.Run(&ebpf.RunOptions{CPU: uint32(cpu), Flags: unix.BPF_F_TEST_RUN_ON_CPU})
	if err != nil {
		return fmt.Errorf("inject on CPU %d: %w", cpu, err)
	}
	switch ret {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("inject on CPU %d: %w", cpu, ErrStopped)
	case 3:
		return fmt.Errorf("inject on CPU %d: %w", cpu, ErrInjectLost)
	}
	return fmt.Errorf("inject on CPU %d: injector returned %d", cpu, ret)
}

// detach detaches every program, the users' too, so that nothing more
// enters the rings; it returns what failed.
func (r *recorder) detach() []error {
	// The links close in parallel: closing a perf-event tracepoint link
	// waits for an RCU grace period (perf_trace_event_unreg ->
	// tracepoint_synchronize_unregister, kernel/trace/trace_event_perf.c),
	// tens of milliseconds each, which concurrent closes partly share.
	failed := make([]error, len(r.links))
	var wg sync.WaitGroup
	for i, l := range r.links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failed[i] = l.Close()
		}()
	}
	wg.Wait()
	var errs []error
	for _, err := range failed {
		if err != nil {
			errs = append(errs, err)
		}
	}
	r.links = nil
	r.objMu.Lock()
	r.objMissed += objectsMissed(r.objects)
	for _, o := range r.objects {
		o.close()
	}
	r.objects = nil
	r.objMu.Unlock()
	return errs
}

// objectsMissed returns the recursion misses of the programs of objs.
func objectsMissed(objs []*object) (n uint64) {
	for _, o := range objs {
		for _, p := range o.coll.Programs {
			if st, err := p.Stats(); err == nil {
				n += st.RecursionMisses
			}
		}
	}
	return n
}

// close detaches and frees every kernel object and mapping; it is
// idempotent.
func (r *recorder) close() {
	_ = r.detach()
	r.keep.release()
	r.keep = nil
	for _, m := range r.rings {
		_ = m.Close()
	}
	r.rings = nil
	if r.stateMem != nil {
		_ = unix.Munmap(r.stateMem)
		r.stateMem = nil
	}
	if r.areaMem != nil {
		_ = unix.Munmap(r.areaMem)
		r.areaMem = nil
	}
	if r.coll != nil {
		r.coll.Close()
		r.coll, r.running = nil, nil
	}
}
