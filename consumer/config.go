package consumer

import (
	"fmt"
	"os"
	"time"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/synth"
)

// Transport is how records travel from BPF to the consumer.
type Transport = recorder.Transport

// The transports (recorder.Transport).
const (
	Auto    = recorder.Auto
	Ringbuf = recorder.Ringbuf
	Perf    = recorder.Perf
)

// Clock is the kernel clock that stamps records.
type Clock = recorder.Clock

// The clocks (recorder.Clock).
const (
	Mono = recorder.Mono
	Boot = recorder.Boot
	TAI  = recorder.TAI
)

// Syscalls is how syscalls:sys_enter_* and sys_exit_* events are
// recorded.
type Syscalls = recorder.Syscalls

// The ways of recording syscall events (recorder.Syscalls).
const (
	SyscallsAuto       = recorder.SyscallsAuto
	SyscallsRaw        = recorder.SyscallsRaw
	SyscallsTracepoint = recorder.SyscallsTracepoint
	SyscallsFentry     = recorder.SyscallsFentry
)

// FentryMax is the most syscall events SyscallsAuto records on the
// function path.
const FentryMax = recorder.FentryMax

// recorder returns what the recorder takes of c.
func (c Config) recorder() recorder.Config {
	return recorder.Config{
		PIDs: c.PIDs, Comms: c.Comms, Cgroup: c.Cgroup,
		RingSize: c.RingSize, Watermark: c.Watermark, Global: c.Global, Latency: c.Latency,
		Syscalls: c.Syscalls, Clock: c.Clock, Objects: c.Objects,
		SubbufSize: c.SubbufSize, Mode: c.Mode, Adjust: c.Adjust,
	}
}

// Config describes a recording session. Zero values take the defaults
// named on each field.
type Config struct {
	// Events are tracepoints by name: "sched:sched_switch", globs
	// ("sched:*"), or a bare event name; "synthetic:NAME" (a glob too)
	// names definitions in Synth. Each must match something.
	Events []string
	// Synth holds the synthetic event definitions "synthetic:NAME"
	// patterns in Events may name. The built-in events synth.Klog and
	// synth.WakeupLatency need no definition and are matched only by
	// their exact name, never by a glob.
	Synth []*synth.Event
	// Objects are users' BPF programs built on bpf/kc_synth.h (see
	// LoadObject): each is loaded onto the session's rings and attached
	// by its sections, and the synthetic events it declares with
	// KC_SYNTH_EVENT are recorded.
	Objects []*ebpf.CollectionSpec
	// Adjust writes fields of tracepoints otherwise than the kernel
	// wrote them: event ("sched:sched_switch") → field → how. An event
	// whose fields are copied is written with its deltas added in place;
	// one with Flags, or with dynamic fields, is transcoded.
	// Profiles use it where their tracer writes a value otherwise than
	// ftrace (lttng-modules' priorities are prio - 100).
	Adjust map[string]map[string]Adjust

	// Filters, applied in the kernel. PIDs match a thread id or a process
	// id; Cgroup is a cgroup v2 directory whose subtree is recorded; Comms
	// are task command names (at most 15 bytes).
	PIDs   []int
	Cgroup string
	Comms  []string
	// Filters keep only the events of the tracepoints they name whose
	// fields pass their expression, in ftrace's event filter language
	// (docs/filters.md), evaluated in the recorder before the event
	// takes ring space. An event several filters name must pass all.
	Filters []EventFilter
	// Triggers take an action (snapshot, stop, start) when an event of
	// theirs passes their condition, decided in the recorder
	// (docs/triggers.md).
	Triggers []Trigger

	// Stacks record call chains with the events they name (docs/stacks.md):
	// the kernel's, the user's or both, each a sequence of return
	// addresses behind the event's fields. StackDepth bounds their
	// frames (0: the kernel's limit, kernel.perf_event_max_stack).
	Stacks     []EventStack
	StackDepth int
	// Contexts are LTTng's kernel contexts by name (procname, pid, tid,
	// ppid, prio, nice, vpid, vtid, vppid, cpu_id, cgroup,
	// perf:cpu:COUNTER), recorded with every tracepoint behind its
	// fields (docs/stacks.md).
	Contexts []string
	// ContextsInStream writes the contexts as LTTng does (--profile
	// lttng): in the stream's event context, which every event of the
	// trace carries; those the recorder does not write (synthetic
	// events, the statedump) carry zeros. Otherwise each tracepoint
	// event carries them in its own context.
	ContextsInStream bool

	// Dir receives the trace (metadata and trace<N> files); it must exist.
	// Sink, when set, is used instead (tests, benchmarks, a profile's
	// writer); a Dir given with it still receives the symbols of call
	// chains (KernelSymbols, UserSymbols).
	Dir  string
	Sink relayfmt.Sink

	// Channel geometry: SubbufSize (default 256 KiB) and NSubbufs
	// (default 8) per CPU, Mode, and Global for one buffer for all CPUs.
	SubbufSize int
	NSubbufs   int
	Mode       relayfmt.Mode
	Global     bool

	Transport Transport
	Clock     Clock
	Syscalls  Syscalls

	// RingSize is the size of each BPF ring buffer or perf ring in bytes, a
	// power-of-two number of pages (default 4 MiB).
	RingSize int
	// Watermark is how many unread bytes make the producer wake the
	// consumer (default RingSize/4).
	Watermark int
	// Latency, when set (1 ms or more), bounds how long a record waits in
	// a ring while the consumer could run: the first record of another
	// process after the consumer went to sleep wakes it, and it drains
	// that record within Latency. Records of the consumer's own process
	// do not wake it (its own sleeping would wake it again); they are
	// picked up with the next. Unset, nothing but the watermark and the
	// session's commands (Flush, Snapshot, Close …) wake the consumer,
	// as with trace-cmd and perf record: an idle machine does not see it
	// run. On the perf transport (kernels before 5.8) the producer cannot
	// wake it early, so a set Latency is a timer that ticks while
	// recording.
	Latency time.Duration

	// ReorderWindow bounds how long a record waits so that a late record
	// stamped earlier can still be written before it (default 1 ms);
	// ReorderMax bounds how many wait per stream (default 1024).
	ReorderWindow time.Duration
	ReorderMax    int

	// Env is added to the metadata env block.
	Env map[string]string

	// Rotation cuts the trace into chunks (Session.Rotate), each a
	// complete trace: a new chunk begins once the current one's packets
	// reach RotateSize bytes, and at the latest RotateInterval after the
	// last one began (0: neither). The sink must write chunks
	// (relayfmt.Rotator, as package chunks' does), in discard mode;
	// RotateSize is at least a packet per stream.
	RotateSize     uint64
	RotateInterval time.Duration
}

// EventFilter is a field filter: Expr, in ftrace's event filter
// language, applies to the recorded tracepoints that Event, a pattern as
// Config.Events takes them, names.
type EventFilter struct {
	Event string
	Expr  string
}

// EventStack asks for call chains: Stack with the recorded tracepoints
// that Event, a pattern as Config.Events takes them, names; "" names
// them all.
type EventStack struct {
	Event string
	Stack Stack
}

// Stack says which call chains an event records.
type Stack = layout.Stack

// The call chains.
const (
	StackKernel = layout.StackKernel
	StackUser   = layout.StackUser
	MaxStack    = layout.MaxStack
)

// Adjust is how the consumer writes one field of a tracepoint otherwise
// than the kernel wrote it (layout.Adjust).
type Adjust = layout.Adjust

// Defaults.
const (
	DefaultSubbufSize    = 256 << 10
	DefaultNSubbufs      = 8
	DefaultRingSize      = 4 << 20
	DefaultReorderWindow = time.Millisecond
	DefaultReorderMax    = 1024
	MaxCommLen           = 15 // TASK_COMM_LEN - 1
	// MaxRingSize keeps ring offsets within the 32 bits the reorder
	// window stores (a ring is mapped twice).
	MaxRingSize = 1 << 30
)

// ErrConfig wraps every configuration error.
var ErrConfig = recorder.ErrConfig

// Check fills in the defaults and validates the configuration before
// anything is loaded: the sub-buffer geometry (relayfmt.CheckGeometry),
// the ring size, the buffers against free memory, watermark, latency,
// reorder window, transport, clock, filters and output. Its error wraps
// ErrConfig and says why. New calls it; callers may call it earlier.
func (c *Config) Check() error {
	if c.SubbufSize == 0 {
		c.SubbufSize = DefaultSubbufSize
	}
	if c.NSubbufs == 0 {
		c.NSubbufs = DefaultNSubbufs
	}
	if c.RingSize == 0 {
		c.RingSize = DefaultRingSize
	}
	if err := relayfmt.CheckGeometry(c.SubbufSize, c.NSubbufs); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	page := os.Getpagesize()
	if c.RingSize < page || c.RingSize&(c.RingSize-1) != 0 || c.RingSize > MaxRingSize {
		return fmt.Errorf("%w: ring size %d is not a power of two from %d to %d bytes", ErrConfig, c.RingSize, page, MaxRingSize)
	}
	if err := c.checkMemory(); err != nil {
		return err
	}
	if c.Watermark == 0 {
		c.Watermark = c.RingSize / 4
	}
	if c.Watermark < 0 || c.Watermark > c.RingSize {
		return fmt.Errorf("%w: watermark %d outside 1..%d (the ring size)", ErrConfig, c.Watermark, c.RingSize)
	}
	if c.Latency != 0 && c.Latency < time.Millisecond {
		return fmt.Errorf("%w: latency %v: 0 (no bound) or 1ms and more", ErrConfig, c.Latency)
	}
	if c.ReorderWindow == 0 {
		c.ReorderWindow = DefaultReorderWindow
	}
	if c.ReorderMax == 0 {
		c.ReorderMax = DefaultReorderMax
	}
	if c.ReorderWindow < 0 || c.ReorderMax < 1 {
		return fmt.Errorf("%w: reorder window %v and max %d must be positive", ErrConfig, c.ReorderWindow, c.ReorderMax)
	}
	if c.Transport > Perf {
		return fmt.Errorf("%w: unknown transport %d", ErrConfig, c.Transport)
	}
	if err := c.checkTriggers(); err != nil {
		return err
	}
	if c.Clock > TAI {
		return fmt.Errorf("%w: unknown clock %d", ErrConfig, c.Clock)
	}
	if c.Syscalls > SyscallsFentry {
		return fmt.Errorf("%w: unknown syscall path %d", ErrConfig, c.Syscalls)
	}
	if c.StackDepth < 0 || c.StackDepth > MaxStack {
		return fmt.Errorf("%w: stack depth %d: want 1 to %d frames", ErrConfig, c.StackDepth, MaxStack)
	}
	if _, err := layout.ParseContexts(c.Contexts); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	for _, st := range c.Stacks {
		if st.Stack == 0 || st.Stack&^(StackKernel|StackUser) != 0 {
			return fmt.Errorf("%w: stack for %q: want the kernel's, the user's or both", ErrConfig, st.Event)
		}
	}
	if c.Syscalls == SyscallsRaw && c.Transport == Perf {
		return fmt.Errorf("%w: the raw syscall path needs the ringbuf transport", ErrConfig)
	}
	if c.Syscalls == SyscallsFentry && c.Transport == Perf {
		return fmt.Errorf("%w: the fentry syscall path needs the ringbuf transport", ErrConfig)
	}
	for _, p := range c.PIDs {
		if p <= 0 {
			return fmt.Errorf("%w: pid %d", ErrConfig, p)
		}
	}
	for _, comm := range c.Comms {
		if comm == "" || len(comm) > MaxCommLen {
			return fmt.Errorf("%w: comm %q must be 1..%d bytes", ErrConfig, comm, MaxCommLen)
		}
	}
	if c.Dir == "" && c.Sink == nil {
		return fmt.Errorf("%w: no output directory", ErrConfig)
	}
	return c.checkRotation()
}

// checkRotation refuses a rotation that cannot work: a negative
// interval, a size under a sub-buffer per stream (each chunk's streams
// take at least one packet), or rotation of a flight recorder, whose
// sub-buffers reach the trace only at its snapshots.
func (c *Config) checkRotation() error {
	if c.RotateInterval < 0 {
		return fmt.Errorf("%w: rotate interval %v is negative", ErrConfig, c.RotateInterval)
	}
	if c.RotateSize == 0 && c.RotateInterval == 0 && !c.rotates() {
		return nil
	}
	if c.Mode != relayfmt.NoOverwrite {
		return fmt.Errorf("%w: rotation needs discard mode: a flight recorder (overwrite mode) writes its sub-buffers only at a snapshot; take snapshots instead", ErrConfig)
	}
	streams, err := c.streams()
	if err != nil {
		return err
	}
	return CheckRotateSize(c.RotateSize, streams, c.SubbufSize)
}

// CheckRotateSize returns nil when a chunk of size bytes (0: no size)
// can hold a packet of packet bytes in each of streams streams, or an
// ErrConfig that says why not.
func CheckRotateSize(size uint64, streams, packet int) error {
	if need := uint64(streams) * uint64(packet); size != 0 && size < need {
		return fmt.Errorf("%w: rotate size %d is under one packet per stream (%d streams x %d bytes = %d): a chunk holds at least that", ErrConfig, size, streams, packet, need)
	}
	return nil
}

// streams returns the number of streams: the possible CPUs, or 1 in
// global mode.
func (c *Config) streams() (int, error) {
	if c.Global {
		return 1, nil
	}
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return 0, fmt.Errorf("possible CPUs: %w", err)
	}
	return n, nil
}

// checkMemory refuses buffers that do not fit in free memory: per stream,
// NSubbufs sub-buffers and a ring.
func (c *Config) checkMemory() error {
	streams := 1
	if !c.Global {
		n, err := ebpf.PossibleCPU()
		if err != nil {
			return fmt.Errorf("possible CPUs: %w", err)
		}
		streams = n
	}
	need := uint64(streams) * (uint64(c.NSubbufs)*uint64(c.SubbufSize) + uint64(c.RingSize))
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return nil // the kernel will say no if it must
	}
	if avail := (uint64(si.Freeram) + uint64(si.Bufferram)) * uint64(si.Unit); need > avail {
		return fmt.Errorf("%w: buffers need %d MiB (%d streams x (%d x %d + ring %d)), more than the %d MiB of free memory",
			ErrConfig, need>>20, streams, c.NSubbufs, c.SubbufSize, c.RingSize, avail>>20)
	}
	return nil
}
