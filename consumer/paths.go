package consumer

// The paths a session records through, and why each is on or off.

import (
	"strings"

	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/gen"
)

// BTFEvents returns the events recorded by the recorder's own tp_btf
// programs (sched_switch, sched_waking, sched_wakeup, sched_wakeup_new,
// task_rename, and the hot events table's, consumer/recorder/hot) and,
// when one was to be but the kernel refused, why. The path is not
// tried for an event in a layout its program does not build, with
// synthetic:wakeup_latency, or on the perf transport.
func (s *Session) BTFEvents() (events []string, why error) {
	for i, p := range s.rec.Progs()[:len(s.events)] {
		if recorder.IsBTFProg(p) {
			events = append(events, s.events[i].FullName())
		}
	}
	return events, s.rec.Why(recorder.PathBTF)
}

// BTFUnknown returns the session's events that the BTF path builds on
// other kernels but not on this one, whose record or tracepoint
// arguments its table does not know, each with why; they are recorded
// through their tracepoints.
func (s *Session) BTFUnknown() map[string]string {
	out := map[string]string{}
	for i, p := range s.rec.Progs()[:len(s.events)] {
		if recorder.IsBTFProg(p) {
			continue
		}
		if why := recorder.BTFMismatch(s.events[i]); why != "" {
			out[s.events[i].FullName()] = why
		}
	}
	return out
}

// UserFault returns nil when the recorder pages in the user memory that
// syscall events' user-space fields hold before it reads it, as the
// kernel does for its own events, or why it does not; nil too when no
// recorded event has such fields.
func (s *Session) UserFault() error {
	if s.rec.On(recorder.PathUserFault) {
		return nil
	}
	return s.rec.Why(recorder.PathUserFault)
}

// Preemptible returns whether this kernel runs tracing programs
// preemptibly, and why (preempt.go), and the session's events recorded
// by programs that run so there: events a task preempted inside such a
// program can make the kernel skip for the other tasks on its CPU. Those
// are the function path's syscall events on fentry and fexit, the syscall events of their
// own tracepoints (whose perf programs 7.x runs before it turns
// preemption off, kernel/trace/trace_syscalls.c) and those with
// user-space fields (kc_sys_user_fault), and fentry and fexit probes
// (the fprobes system), which are trampolines. The raw path, the function
// path on kprobes (Recorder.Kprobes), the other tracepoints and the
// sched events' BTF programs keep preemption off or run where the
// kernel does. The skipped runs are counted (CPUStats.Missed).
func (s *Session) Preemptible() (p recorder.Preemptible, events []string) {
	p = s.rec.Preempt()
	if !p.On {
		return p, nil
	}
	for i, prog := range s.rec.Progs()[:len(s.events)] {
		f := s.events[i]
		function := strings.HasPrefix(prog, recorder.FentryPrefix)
		sysTP := f.System == "syscalls" && !function && prog != gen.RingbufProgKcSysEnter && prog != gen.RingbufProgKcSysExit
		if function && !s.rec.Kprobes() || sysTP || f.System == probe.SystemFprobes {
			events = append(events, f.FullName())
		}
	}
	return p, events
}

// RawSyscalls returns the syscall events recorded through the raw
// syscall path (Config.Syscalls), those with user-space fields that
// kc_sys_user_fault records included, and, when the raw path could have
// recorded some of the session's events but did not run, why.
func (s *Session) RawSyscalls() (events []string, why error) {
	for i, p := range s.rec.Progs()[:len(s.events)] {
		if p == gen.RingbufProgKcSysEnter || p == gen.RingbufProgKcSysExit || p == gen.RingbufProgKcSysUserFault {
			events = append(events, s.events[i].FullName())
		}
	}
	return events, s.rec.Why(recorder.PathRawSys)
}

// FentrySyscalls returns the syscall events recorded through the
// function path (Config.Syscalls SyscallsFentry) and, when the path
// could have recorded some of the session's events but did not, why.
func (s *Session) FentrySyscalls() (events []string, why error) {
	for i, p := range s.rec.Progs()[:len(s.events)] {
		if strings.HasPrefix(p, recorder.FentryPrefix) {
			events = append(events, s.events[i].FullName())
		}
	}
	return events, s.rec.Why(recorder.PathFentry)
}

// OwnRings returns nil when the recorder's programs write into its own
// rings (kc_area, area.go), or why they write into BPF ring buffers or
// perf buffers.
func (s *Session) OwnRings() error { return s.rec.Why(recorder.PathOwnRings) }

// Packets returns nil when the recorder's programs write the trace's
// packets themselves (packet mode, packet.go), so the drainer reads no
// record, or why they do not.
func (s *Session) Packets() error { return s.rec.Why(recorder.PathPackets) }

// Preemptible says whether the kernel runs tracing programs
// preemptibly (recorder.Preemptible).
type Preemptible = recorder.Preemptible
