package recorder

import (
	"errors"
	"os"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/relayfmt"
)

// Transport is how records travel from BPF to the consumer.
type Transport uint8

const (
	// Auto picks Ringbuf where the kernel has BPF ring buffers (5.8+),
	// else Perf.
	Auto Transport = iota
	// Ringbuf uses one BPF ring buffer per CPU (or one in global mode).
	Ringbuf
	// Perf uses a perf event array: one perf ring per CPU.
	Perf
)

// String returns "auto", "ringbuf" or "perf".
func (t Transport) String() string {
	switch t {
	case Ringbuf:
		return "ringbuf"
	case Perf:
		return "perf"
	}
	return "auto"
}

// Clock is the kernel clock that stamps records.
type Clock uint8

const (
	// Mono is CLOCK_MONOTONIC (bpf_ktime_get_ns).
	Mono Clock = iota
	// Boot is CLOCK_BOOTTIME, which counts suspend (Linux 5.8+).
	Boot
	// TAI is CLOCK_TAI (Linux 6.1+).
	TAI
)

// String returns "mono", "boot" or "tai", the CLI's names.
func (c Clock) String() string {
	switch c {
	case Boot:
		return "boot"
	case TAI:
		return "tai"
	}
	return "mono"
}

// Syscalls is how syscalls:sys_enter_* and sys_exit_* events are
// recorded.
type Syscalls uint8

const (
	// SyscallsAuto takes the function path for up to FentryMax syscall
	// events where the kernel allows it (see SyscallsFentry), else the
	// raw path where the kernel allows it (see SyscallsRaw), each event's
	// tracepoint otherwise.
	SyscallsAuto Syscalls = iota
	// SyscallsRaw records them from the kernel's raw sys_enter and
	// sys_exit tracepoints (x86_64, BPF ring buffers, kernel BTF): cheaper
	// per recorded event, but a program then runs on every syscall of the
	// machine, recorded or not. New fails when the raw path cannot run.
	// Events it cannot build (a layout other than the kernel's usual one,
	// a syscall newer than kconsume's table) keep their tracepoints.
	SyscallsRaw
	// SyscallsTracepoint records each event through its own tracepoint,
	// so syscalls that are not recorded cost nothing.
	SyscallsTracepoint
	// SyscallsFentry records each event from a program on its syscall's
	// x86_64 entry point (fentry on __x64_sys_NAME, fexit for exit
	// events; x86_64, BPF ring buffers, kernel BTF, a kernel that lets
	// BPF attach to functions): syscalls that are not recorded run no
	// BPF and skip the syscall tracepoints' slow path, and a recorded one
	// skips the raw path's dispatch. One program is loaded and attached
	// per event, so it suits a few events, not syscalls:*. New fails when
	// the path cannot run; events it cannot build keep the raw path or
	// their tracepoints.
	SyscallsFentry
)

// FentryMax is the most syscall events SyscallsAuto records on the
// function path: each takes a program and a trampoline of its own.
const FentryMax = 32

// String returns "auto", "raw", "tracepoint" or "fentry", the CLI's names.
func (y Syscalls) String() string {
	switch y {
	case SyscallsFentry:
		return "fentry"
	case SyscallsRaw:
		return "raw"
	case SyscallsTracepoint:
		return "tracepoint"
	}
	return "auto"
}

// Errors of the recorder, which consumer's API returns as its own.
var (
	// ErrConfig wraps every configuration error.
	ErrConfig = errors.New("bad configuration")
	// ErrNotSupported wraps what the kernel lacks for a setting.
	ErrNotSupported = errors.New("not supported by this kernel")
	// ErrStopped is returned when an injected event meets a closed gate:
	// the session, or the chosen CPU's buffer, is stopped.
	ErrStopped = errors.New("recording is stopped")
	// ErrInjectLost is returned when an injected event found its ring
	// full; it is counted and reported in the stream like any
	// kernel-side loss.
	ErrInjectLost = errors.New("ring full: event counted as lost")
)

// Config is what the recorder takes of a session's configuration
// (consumer.Config, whose fields of the same names document them).
type Config struct {
	PIDs       []int
	Comms      []string
	Cgroup     string
	RingSize   int
	Watermark  int
	Global     bool
	Latency    time.Duration
	Syscalls   Syscalls
	Clock      Clock
	Objects    []*ebpf.CollectionSpec
	SubbufSize int
	Mode       relayfmt.Mode
	Adjust     map[string]map[string]layout.Adjust
}

// Testing turns off paths the kernel has, so that one kernel's tests
// cover the ways of recording that other kernels take; set its fields
// before a Load, never during one. KC_NO_AREA=1 and KC_NO_PKT=1 in the
// environment set NoArea and NoPackets, KCONSUME_RAW_FROM_PERF=1
// RawFromPerf and KCONSUME_RAW_FROM_PERF=0 RawFromBTF.
var Testing = struct {
	// NoArea writes into BPF ring buffers where kc_area would do.
	NoArea bool
	// NoPackets leaves packet mode off.
	NoPackets bool
	// NoCookie patches a program copy per event even where the kernel
	// has attach cookies.
	NoCookie bool
	// NoBTF records the BTF sched events through their tracepoints.
	NoBTF bool
	// RenameBTF loads sched_process_rename's BTF program where its
	// tracepoint would be taken.
	RenameBTF bool
	// RawFromPerf puts the raw syscall path on the perf tracepoints, as
	// on kernels whose programs run preemptibly.
	RawFromPerf bool
	// FuncKprobes puts the function path on kprobes where it would take
	// trampolines, as on kernels whose programs run preemptibly.
	FuncKprobes bool
	// RawFromBTF keeps the raw syscall path on its tp_btf programs and
	// the function path on its trampolines where programs run
	// preemptibly, as on kernels where they do not: the paths without
	// their fixes for preemption, to measure what the fixes cost.
	RawFromBTF bool
	// UserFaultRecords lets kc_sys_user_fault record the events it
	// pages memory in for on a preemptible kernel too, where a kernel
	// without preemption in its programs would.
	UserFaultRecords bool
	// NewCollection loads a spec; tests make it refuse paths.
	NewCollection func(*ebpf.CollectionSpec) (*ebpf.Collection, error)
}{
	NoArea:        os.Getenv("KC_NO_AREA") == "1",
	NoPackets:     os.Getenv("KC_NO_PKT") == "1",
	RawFromPerf:   os.Getenv("KCONSUME_RAW_FROM_PERF") == "1",
	RawFromBTF:    os.Getenv("KCONSUME_RAW_FROM_PERF") == "0",
	NewCollection: ebpf.NewCollection,
}
