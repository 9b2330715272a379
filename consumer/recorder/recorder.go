// Package recorder is kconsume's BPF side: it decides what this kernel
// and configuration allow (a plan of optional paths, each on or off with
// the reason, plan.go), loads the recorder object with its fallbacks
// (load.go) and attaches each kind of event, each kind a file with its
// own state: tracepoints (tracepoint.go), the raw syscall path
// (syscall.go), the function path (fentry.go), syscall events' user-space
// fields (sysuser.go), BTF sched events (btfevent.go), the
// wakeup_latency hooks (wakeup.go) and users' objects (object.go);
// attach.go walks the events. It keeps the gate and the per-CPU counters
// the writers share with the drainer (recorder.go), kconsume's own rings
// (area.go) and packet mode (packet.go). The consumer package drains
// what it writes.
package recorder

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/gen"
)

// cpuStateLen is sizeof(struct kc_cpu_state): one cache line.
const cpuStateLen = int(unsafe.Sizeof(gen.RingbufKcCpuState{}))

// Recorder is the BPF side of a session: the loaded Recorder object, its
// gate and per-CPU counters (kc_state, mapped), the kernel-side filters,
// the links that attach it, the ring maps it writes into and the users'
// objects loaded onto the same rings. Setup (load, attach) happens
// before the drainer runs; afterwards its methods are safe for
// concurrent use.
type Recorder struct {
	cfg       Config
	ncpu      int
	transport Transport
	coll      *ebpf.Collection
	rings     []*ebpf.Map // the inner BPF ring buffers, by stream
	links     []link.Link
	running   *ebpf.Variable
	stateMem  []byte
	tp        tracepoints          // the tracepoints' programs (tracepoint.go)
	spec      *ebpf.CollectionSpec // what was loaded, for the copies loaded later (ReplaceFilter)
	plan      Plan                 // each optional path: whether taken, and why not (plan.go)
	preempt   Preemptible          // whether tracing programs run preemptibly here (preempt.go)
	raw       rawPath              // syscall events on the raw syscall programs (syscall.go)
	tpProgs   []string             // the recorder copy attached for each event key
	probe     probes
	sysProgs  []string         // the syscall program that records each event, or ""
	fentry    fentryPath       // syscall events on fentry/fexit programs (fentry.go)
	btf       btfPath          // events built from tracepoint arguments (btfevent.go)
	wake      wakeupHook       // wakeup_latency's sched_switch hook (wakeup.go)
	user      userPath         // syscall events' user-space fields (sysuser.go)
	objs      objects          // users' programs (Config.Objects; object.go)
	areaMem   []byte           // kc_area, mapped (PathOwnRings, area.go)
	pktElem   int              // the size of its elements in packet mode (PathPackets, packet.go)
	inj       injector         // the injector's record (inject.go)
	stacks    []layout.Stack   // the call chains each event key records (stack.go)
	ctxs      []layout.Context // the contexts every event records (context.go)
	trigs     *Triggers        // the triggers (trigger.go); nil: none
	perfFDs   []int            // the perf contexts' counters (context.go)
}

// Options replaces the recorder by another object built on kconsume.h
// (the bench producer), with values for its own variables, or turns on
// the recorder's hooks (synthetic:wakeup_latency).
type Options struct {
	Spec  *ebpf.CollectionSpec
	Vars  map[string]any
	hooks bool
	small []uint32 // per event key: its record size when smallSize allows, or 0
	sys   bool     // some event may take the raw syscall path (sysShape)
	user  bool     // some event has user-space fields (sysUserOf)
	// userFiltered are the keys of those with a field filter.
	userFiltered []int
	userNr       bool              // each such event has a number kc_sys_user_fault dispatches by
	userTail     bool              // one of them records call chains or contexts (tail)
	btf          map[string]btfUse // by BTF program: the event it records (btfShape)
	// filters are the events' field filters by key (nil: none), and
	// formats the events' formats.
	filters []*filter.Filter
	formats []*tracefs.Format
	// sysEvents are the syscall events the syscall programs can build.
	sysEvents []sysEvent
	// stacks are the call chains each event key records (nil: none),
	// ctxs the contexts every event records.
	stacks []layout.Stack
	ctxs   []layout.Context
	// pktRaw and pktTP are nil when the events can be written in packet
	// mode, else why not (pktEligible): with syscall events on the raw
	// syscall path, and through their tracepoints.
	pktRaw, pktTP error
	// probes are the probe of each event key, nil for the others
	// (WithProbes).
	probes []*probe.Probe
	// trigs are the triggers (WithTriggers), nil for none.
	trigs *Triggers
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

// pidWords mirrors KC_PID_WORDS (bpf/filter.h; TestMirrorsC): the words
// of kc_pid_bits.
const pidWords = 1024

// PidBits returns kc_pid_bits of bpf/filter.h for the ids pids: bit
// id % (64 × len) set for each.
func PidBits(pids []int) [pidWords]uint64 {
	var bits [pidWords]uint64
	for _, p := range pids {
		i := uint32(p) % (64 * uint32(len(bits)))
		bits[i/64] |= 1 << (i % 64)
	}
	return bits
}

// setFilters fills the kernel-side filter maps from the configuration.
func (r *Recorder) setFilters() error {
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

// Filtered reports whether the recorder filters tasks in the kernel.
func (r *Recorder) Filtered() bool {
	return len(r.cfg.PIDs) > 0 || len(r.cfg.Comms) > 0 || r.cfg.Cgroup != ""
}

// CPUState returns CPU cpu's slot of the mapped kc_state array; the
// slots from ncpu on count the records of users' programs.
func (r *Recorder) CPUState(cpu int) *gen.RingbufKcCpuState {
	return (*gen.RingbufKcCpuState)(unsafe.Pointer(&r.stateMem[cpu*cpuStateLen]))
}

// WakeupMask returns kc_wakeup_mask for cfg: one less than how many
// records of at most sampledMax bytes a writer may put into a ring between
// two looks at its fill (bpf/kc/ringbuf.h:kc_wakeup_flags). All the CPUs'
// writers together may pass over no more than half the ring's room above
// the watermark, so a late look still wakes the consumer well before the
// ring is full; tiny rings get a look at every record.
func WakeupMask(cfg Config, ncpu int) uint64 {
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

// Arm tells the writers into the rings that the drainer is about to
// sleep: their next look at a ring's fill over the watermark wakes it,
// and with data set so does the first record of a process other than
// this one. A drainer that goes round again at once is not armed, or a
// ring kept over the watermark would wake it on every pass. The store
// is skipped when a slot is armed so already, so the writers' cache line
// is not taken away for nothing.
func (r *Recorder) Arm(data bool) {
	if r.transport != Ringbuf {
		return
	}
	want := uint32(armFill)
	if data {
		want |= armData
	}
	for slot := range 2 * r.ncpu {
		if cs := r.CPUState(slot); atomic.LoadUint32(&cs.Armed) != want {
			atomic.StoreUint32(&cs.Armed, want)
		}
	}
}

// Disarm takes back what arm asked for, so that a drainer awake for
// another reason (its timer, a command) is not woken again for nothing.
func (r *Recorder) Disarm() {
	if r.transport != Ringbuf {
		return
	}
	for slot := range 2 * r.ncpu {
		if cs := r.CPUState(slot); atomic.LoadUint32(&cs.Armed) != 0 {
			atomic.StoreUint32(&cs.Armed, 0)
		}
	}
}

// WokeAt returns when the writers of slot last woke the drainer, on
// CLOCK_MONOTONIC, or 0.
func (r *Recorder) WokeAt(slot int) uint64 {
	return atomic.LoadUint64(&r.CPUState(slot).WokeAt)
}

// Emitted returns the records the kernel side put into cpu's ring.
func (r *Recorder) Emitted(cpu int) uint64 {
	return atomic.LoadUint64(&r.CPUState(cpu).Emitted) + atomic.LoadUint64(&r.CPUState(r.ncpu+cpu).Emitted)
}

// KernelLost returns the records the kernel side failed to put into
// cpu's ring.
func (r *Recorder) KernelLost(cpu int) uint64 {
	return atomic.LoadUint64(&r.CPUState(cpu).Lost) + atomic.LoadUint64(&r.CPUState(r.ncpu+cpu).Lost)
}

// SetRunning opens or closes the gate every program checks first.
func (r *Recorder) SetRunning(on bool) error {
	if r.running == nil {
		return nil // not loaded, or closed: nothing runs
	}
	return r.running.Set(boolU32(on))
}

// SetCPUDisabled closes (or reopens) the gate of cpu alone.
func (r *Recorder) SetCPUDisabled(cpu int, disabled bool) {
	atomic.StoreUint32(&r.CPUState(cpu).Disabled, boolU32(disabled))
}

// CPUDisabled reports whether cpu's own gate is closed.
func (r *Recorder) CPUDisabled(cpu int) bool {
	return atomic.LoadUint32(&r.CPUState(cpu).Disabled) != 0
}

// Missed returns the recorder runs the kernel skipped so far because a
// BPF program already ran on the CPU (the programs' recursion_misses):
// all of them, and those of the tracepoint recorders alone, each of
// which was an event lost. The raw syscall programs run for every
// syscall, recorded or not, and users' programs (Config.Objects) may
// write any number of events a run, so theirs count in all alone. A
// program of a BTF tracepoint misses whenever another run of it is on
// the CPU: one preempted on a faultable syscall tracepoint (6.13+)
// leaves every run on that CPU Missed until it resumes.
func (r *Recorder) Missed() (all, lost uint64) {
	// The copies a filter change loaded record events as the others do.
	lost = r.tp.laterMissed()
	all = r.objs.missed() + lost + r.raw.laterMissed(&r.tp.laterMu)
	// kc_tp* are kc_tracepoint's copies: per event (kc_tp_N), by size
	// (kc_tp_sN) and filtered (kc_tpf_N).
	for name, p := range r.coll.Programs {
		raw := name == gen.RingbufProgKcSysEnter || name == gen.RingbufProgKcSysExit
		if !raw && name != gen.RingbufProgKcTracepoint && !strings.HasPrefix(name, "kc_tp") && !strings.HasPrefix(name, FentryPrefix) && !IsBTFProg(name) {
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

// RingSize returns the size of the BPF ring buffers: the rings, or with
// kc_area the doorbells.
func (r *Recorder) RingSize() int {
	if r.plan[PathOwnRings].on {
		return bellSize
	}
	return r.cfg.RingSize
}

// NewRing creates the BPF ring buffer of stream i and puts it in the
// recorder's array of rings; it returns the map.
func (r *Recorder) NewRing(i int) (*ebpf.Map, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: fmt.Sprintf("kc_ring%d", i), Type: ebpf.RingBuf, MaxEntries: uint32(r.RingSize())})
	if err != nil {
		return nil, fmt.Errorf("ring buffer %d: %w", i, err)
	}
	r.rings = append(r.rings, m)
	if err := r.coll.Maps[gen.RingbufMapKcRings].Put(uint32(i), m); err != nil {
		return nil, fmt.Errorf("ring buffer %d: %w", i, err)
	}
	return m, nil
}

// SetPerf points cpu's slot of the perf event array at the perf event fd.
func (r *Recorder) SetPerf(cpu, fd int) error {
	if err := r.coll.Maps[gen.PerfMapKcPerf].Put(uint32(cpu), uint32(fd)); err != nil {
		return fmt.Errorf("perf event array slot %d: %w", cpu, err)
	}
	return nil
}

// Detach detaches every program, the users' too, so that nothing more
// enters the rings; it returns what failed.
func (r *Recorder) Detach() []error {
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
	r.objs.close()
	return errs
}

// Close detaches and frees every kernel object and mapping; it is
// idempotent.
func (r *Recorder) Close() {
	_ = r.Detach()
	r.closePerfContexts()
	r.tp.close()
	r.raw.close(&r.tp.laterMu)
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

// CPUs returns the number of possible CPUs the recorder was loaded for.
func (r *Recorder) CPUs() int { return r.ncpu }

// Transport returns the transport the recorder writes through.
func (r *Recorder) Transport() Transport { return r.transport }

// On reports whether the recorder takes optional path p.
func (r *Recorder) On(p Path) bool { return r.plan[p].on }

// Why returns why the recorder does not take optional path p for some
// or all of the events that could take it, or nil.
func (r *Recorder) Why(p Path) error { return r.plan[p].why }

// Progs returns the program that records each event key attached so
// far: a tracepoint program copy, a syscall program or a BTF program.
func (r *Recorder) Progs() []string { return r.tpProgs }

// UsesCookie reports whether the events' keys come from attach cookies
// rather than from program copies with the key patched in.
func (r *Recorder) UsesCookie() bool { return r.tp.cookie }

// RawFromPerf reports whether the raw syscall path rides on the perf
// tracepoints (preempt.go).
func (r *Recorder) RawFromPerf() bool { return r.raw.perf }

// Preempt returns whether tracing programs run preemptibly here.
func (r *Recorder) Preempt() Preemptible { return r.preempt }

// RingBytes returns the size in bytes of each stream's ring.
func (r *Recorder) RingBytes() int { return r.cfg.RingSize }

// Global reports whether one ring takes every CPU's records.
func (r *Recorder) Global() bool { return r.cfg.Global }

// PktElem returns the size of a packet-mode ring's elements, the trace's
// packets, or 0 outside packet mode.
func (r *Recorder) PktElem() int { return r.pktElem }

// Area returns stream i's kc_area ring, mapped writable (the drainer
// zeroes the space it releases), or nil without kc_area.
func (r *Recorder) Area(i int) []byte {
	if r.areaMem == nil {
		return nil
	}
	size := r.cfg.RingSize
	return r.areaMem[i*size : (i+1)*size : (i+1)*size]
}

// Collection returns the loaded recorder object: its programs, maps and
// variables.
func (r *Recorder) Collection() *ebpf.Collection { return r.coll }

// Loaded reports whether the recorder is loaded and its counters mapped:
// Close has not run.
func (r *Recorder) Loaded() bool { return r.stateMem != nil }

// Maps returns the maps a recover after a kill reads, by the name it
// pins them under: kc_state as "state", and with kc_area "area".
func (r *Recorder) Maps() map[string]*ebpf.Map {
	m := map[string]*ebpf.Map{"state": r.coll.Maps[gen.RingbufMapKcState]}
	if r.plan[PathOwnRings].on {
		m["area"] = r.coll.Maps[gen.RingbufMapKcArea]
	}
	return m
}

// Ring returns the BPF ring buffer of stream i (with kc_area, its
// doorbell).
func (r *Recorder) Ring(i int) *ebpf.Map { return r.rings[i] }

// UserUnread returns per CPU the user-space values the recorder could
// not read (kc_sys_user_unread), or nil where no recorded event has
// user-space fields.
func (r *Recorder) UserUnread() []uint64 {
	m := r.coll.Maps[gen.RingbufMapKcSysUserUnread]
	if m == nil || !r.user.on {
		return nil
	}
	var per []uint64
	if err := m.Lookup(uint32(0), &per); err != nil {
		return nil
	}
	return per
}

// Inject runs the injector on cpu with one record of key. It fails with
// ErrStopped when the gate is closed and ErrInjectLost when the ring was
// full.
func (r *Recorder) Inject(cpu int, key uint32, payload []byte) error {
	return r.inj.run(r.coll, r.ncpu, cpu, key, payload)
}

// FilterKept returns how many events event key's field filter kept so
// far, and false when the event has no filter.
func (r *Recorder) FilterKept(key int) (uint64, bool) {
	m := r.coll.Maps[gen.RingbufMapKcFilterKept]
	if r.tp.filter(key) == nil || m == nil {
		return 0, false
	}
	var per []uint64
	if err := m.Lookup(uint32(key), &per); err != nil {
		return 0, true
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, true
}
