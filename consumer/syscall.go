package consumer

import (
	"errors"
	"fmt"
	"runtime"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
)

// The raw syscall path (kc_sys_enter, kc_sys_exit in bpf/kconsume.bpf.c)
// records syscalls:sys_enter_* and sys_exit_* events from the kernel's
// sys_enter and sys_exit tracepoints, which the syscall events hang off,
// instead of through perf's syscall hooks: it builds the same record and
// skips perf_syscall_enter and trace_call_bpf, a good part of the cost of
// a traced syscall. LTTng records syscalls the same way.

// sysMax is KC_SYS_MAX of bpf/kconsume.bpf.c: the syscall numbers the
// dispatch map covers.
const sysMax = 1024

// sysShape reports whether the raw syscall programs build f's record as
// kernel/trace/trace_syscalls.c does, and which of them: an entry event
// (exit false) with __syscall_nr at 8 and at most six 8-byte arguments
// from 16 (struct syscall_trace_enter), or an exit event with
// __syscall_nr and an 8-byte ret at 16 (struct syscall_trace_exit).
// Events with any other layout, such as the user-space strings some
// kernels add, keep the tracepoint.
func sysShape(f *tracefs.Format) (exit, ok bool) {
	switch {
	case f.System != "syscalls":
		return false, false
	case strings.HasPrefix(f.Name, "sys_enter_"):
	case strings.HasPrefix(f.Name, "sys_exit_"):
		exit = true
	default:
		return false, false
	}
	if len(f.Skipped) != 0 || len(f.Fields) == 0 || len(f.Fields) > 7 {
		return false, false
	}
	nr := f.Fields[0]
	if nr.Name != "__syscall_nr" || nr.Offset != 8 || nr.Size != 4 || !nr.Signed || nr.Loc != tracefs.Inline || nr.ArrayLen != 0 {
		return false, false
	}
	args := f.Fields[1:]
	if exit && (len(args) != 1 || args[0].Name != "ret") {
		return false, false
	}
	for i, a := range args {
		if a.Offset != 16+8*i || a.Size != 8 || a.Loc != tracefs.Inline || a.ArrayLen != 0 {
			return false, false
		}
	}
	size := 12 // no argument: the record ends after __syscall_nr
	if len(args) > 0 {
		size = 16 + 8*len(args)
	}
	return exit, f.FixedSize() == size
}

// rawSysPossible returns why the raw syscall path cannot run here, or
// nil: it needs x86_64 (it reads the arguments from struct pt_regs), BPF
// ring buffers and the kernel's BTF (tp_btf programs, CO-RE reads).
func (r *recorder) rawSysPossible() error {
	switch {
	case r.cfg.Syscalls == SyscallsTracepoint:
		return errors.New("turned off (syscalls: tracepoint)")
	case runtime.GOARCH != "amd64":
		return fmt.Errorf("not on %s", runtime.GOARCH)
	case r.transport != Ringbuf:
		return errors.New("needs BPF ring buffers")
	}
	if _, err := btf.LoadKernelSpec(); err != nil {
		return fmt.Errorf("kernel BTF: %w", err)
	}
	return nil
}

// dropRawSys removes the raw syscall programs from spec.
func dropRawSys(spec *ebpf.CollectionSpec) {
	delete(spec.Programs, gen.RingbufProgKcSysEnter)
	delete(spec.Programs, gen.RingbufProgKcSysExit)
}

// taskBTF reports whether the kernel has bpf_get_current_task_btf (5.11).
func taskBTF() bool {
	return features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetCurrentTaskBtf) == nil
}

// rawSyscalls records through the raw syscall programs those of formats
// (indexed by event key) that sysShape allows and whose syscall number
// sysNr knows: it fills the dispatch map and attaches kc_sys_enter and
// kc_sys_exit as needed. It returns, per event key, the program that
// records the event, or "" for the events left to their tracepoints.
// When something fails on the way, all of them are and r.sysErr says why;
// with Config.Syscalls SyscallsRaw, that is the error returned instead.
func (r *recorder) rawSyscalls(formats []*tracefs.Format) ([]string, error) {
	progs := make([]string, len(formats))
	if r.coll.Programs[gen.RingbufProgKcSysEnter] == nil {
		return progs, nil
	}
	keys := r.coll.Maps[gen.RingbufMapKcSysKeys]
	var used [2]bool
	var slots []uint32
	for i, f := range formats {
		exit, ok := sysShape(f)
		nr, known := sysNr(f)
		if !ok || !known || nr < 0 || nr >= sysMax {
			continue
		}
		slot := uint32(nr)
		progs[i] = gen.RingbufProgKcSysEnter
		if exit {
			slot += sysMax
			progs[i] = gen.RingbufProgKcSysExit
		}
		if err := keys.Put(slot, uint32(i+1)); err != nil {
			r.sysErr = fmt.Errorf("dispatching %s: %w", f.FullName(), err)
			break
		}
		slots = append(slots, slot)
		used[boolU32(exit)] = true
	}
	var links []link.Link
	for dir, name := range []string{gen.RingbufProgKcSysEnter, gen.RingbufProgKcSysExit} {
		if !used[dir] || r.sysErr != nil {
			continue
		}
		l, err := link.AttachTracing(link.TracingOptions{Program: r.coll.Programs[name]})
		if err != nil {
			r.sysErr = fmt.Errorf("attaching %s: %w", name, err)
			break
		}
		links = append(links, l)
	}
	if r.sysErr != nil {
		for _, l := range links {
			_ = l.Close()
		}
		for _, slot := range slots {
			_ = keys.Put(slot, uint32(0))
		}
		if r.cfg.Syscalls == SyscallsRaw {
			return nil, fmt.Errorf("raw syscall path: %w", r.sysErr)
		}
		return make([]string, len(formats)), nil
	}
	r.links = append(r.links, links...)
	return progs, nil
}

// sysNr returns the x86_64 syscall number of the syscall event f, from
// the kernel's syscall table (sysnr_amd64.go), or false for a syscall
// the table does not have, newer than the kernel it comes from.
func sysNr(f *tracefs.Format) (int32, bool) {
	name, ok := strings.CutPrefix(f.Name, "sys_enter_")
	if !ok {
		name, ok = strings.CutPrefix(f.Name, "sys_exit_")
	}
	nr, known := sysNrs[name]
	return nr, ok && known
}
