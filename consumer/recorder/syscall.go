package recorder

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
)

// The raw syscall path (kc_sys_enter, kc_sys_exit in bpf/kc/sys_raw.bpf.h)
// records syscalls:sys_enter_* and sys_exit_* events from the kernel's
// sys_enter and sys_exit tracepoints, which the syscall events hang off,
// instead of through perf's syscall hooks: it builds the same record and
// skips perf_syscall_enter and trace_call_bpf, a good part of the cost of
// a traced syscall. LTTng records syscalls the same way.

// sysMax is KC_SYS_MAX (bpf/kc/syscall.h): the syscall numbers the
// dispatch map covers.
const sysMax = 1024

// SysShape reports whether the raw syscall programs build f's record as
// kernel/trace/trace_syscalls.c does, and which of them: an entry event
// (exit false) with __syscall_nr at 8 and at most six 8-byte arguments
// from 16 (struct syscall_trace_enter), or an exit event with
// __syscall_nr and an 8-byte ret at 16 (struct syscall_trace_exit).
// Events with any other layout, such as the user-space strings some
// kernels add, keep the tracepoint.
func SysShape(f *tracefs.Format) (exit, ok bool) {
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

// rawPath is the raw syscall path: kc_sys_enter and kc_sys_exit on the
// raw syscall tracepoints record the syscall events, dispatching by
// syscall number (Config.Syscalls SyscallsRaw).
type rawPath struct {
	perf  bool           // on the perf tracepoints raw_syscalls:* instead (preempt.go)
	slots map[int]uint32 // each recorded event key's slot in kc_sys_keys
	// links are the attached programs' (enter, exit), gen their
	// generation, and later the collection of those a change of filter
	// loaded (refilter.go).
	links [2]link.Link
	gen   uint32
	later *ebpf.Collection
	gone  uint64 // the misses of the later programs closed
}

// rawSysPossible returns why the raw syscall path cannot run here, or
// nil: it needs x86_64 (it reads the arguments from struct pt_regs), BPF
// ring buffers and the kernel's BTF (tp_btf programs, CO-RE reads).
func rawSysPossible(cfg Config, transport Transport) error {
	switch {
	case cfg.Syscalls == SyscallsTracepoint:
		return errors.New("turned off (syscalls: tracepoint)")
	case runtime.GOARCH != "amd64":
		return fmt.Errorf("not on %s", runtime.GOARCH)
	case transport != Ringbuf:
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
	rawFromPerf(spec, false)
}

// rawFromPerf makes the raw syscall path's programs, under their usual
// names, the copies for the perf tracepoints raw_syscalls:sys_enter and
// sys_exit when perf is set (where tracing programs run preemptibly,
// preempt.go), and removes those copies from spec.
func rawFromPerf(spec *ebpf.CollectionSpec, perf bool) {
	if perf {
		spec.Programs[gen.RingbufProgKcSysEnter] = spec.Programs[gen.RingbufProgKcSysEnterTp]
		spec.Programs[gen.RingbufProgKcSysExit] = spec.Programs[gen.RingbufProgKcSysExitTp]
	}
	delete(spec.Programs, gen.RingbufProgKcSysEnterTp)
	delete(spec.Programs, gen.RingbufProgKcSysExitTp)
}

// taskBTF reports whether the kernel has bpf_get_current_task_btf (5.11).
func taskBTF() bool {
	return features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetCurrentTaskBtf) == nil
}

// attach records the syscall events of formats (indexed by event
// key) that the syscall programs can build: through their function
// programs where loaded (fentryCopies), through the raw syscall programs
// for the others that sysShape allows and whose syscall number sysNr
// knows, filling the dispatch map and attaching kc_sys_enter and
// kc_sys_exit as needed. It returns, per event key, the program that
// records the event, or "" for the events left to their tracepoints.
// When the function path fails to attach, its events take the raw path
// and r.plan[PathFentry] says why; when the raw path fails, its events keep
// their tracepoints and r.plan[PathRawSys] says why. With Config.Syscalls
// SyscallsFentry or SyscallsRaw, that path's failure is the error
// returned instead.
func (p *rawPath) attach(r *Recorder, formats []*tracefs.Format) ([]string, error) {
	progs := make([]string, len(formats))
	if err := r.fentry.attach(r, progs); err != nil {
		if r.cfg.Syscalls == SyscallsFentry {
			return nil, fmt.Errorf("fentry syscall path: %w", err)
		}
		r.plan.off(PathFentry, err)
	}
	if r.coll.Programs[gen.RingbufProgKcSysEnter] == nil {
		return progs, nil
	}
	keys := r.coll.Maps[gen.RingbufMapKcSysKeys]
	var used [2]bool
	var slots []uint32
	var rawKeys []int
	for i, f := range formats {
		exit, ok := SysShape(f)
		nr, known := sysNr(f)
		if progs[i] != "" || !ok || !known || r.tail(i) {
			continue
		}
		slot := uint32(nr)
		progs[i] = gen.RingbufProgKcSysEnter
		if exit {
			slot += sysMax
			progs[i] = gen.RingbufProgKcSysExit
		}
		rawKeys = append(rawKeys, i)
		k := gen.RingbufKcSysKey{Key: uint32(i + 1), Id: uint16(f.ID), Size: uint16(f.FixedSize())}
		if r.tp.filter(i) != nil {
			k.Flags = tpFiltered
		}
		if t := r.trigs.of(i); t >= 0 {
			k.Trig = uint32(t + 1)
		}
		if err := keys.Put(slot, k); err != nil {
			r.plan.off(PathRawSys, fmt.Errorf("dispatching %s: %w", f.FullName(), err))
			break
		}
		slots = append(slots, slot)
		used[boolU32(exit)] = true
	}
	var links []link.Link
	for dir, name := range []string{gen.RingbufProgKcSysEnter, gen.RingbufProgKcSysExit} {
		if !used[dir] || r.plan[PathRawSys].why != nil {
			continue
		}
		l, err := p.attachProg(dir, r.coll.Programs[name])
		if err != nil {
			r.plan.off(PathRawSys, fmt.Errorf("attaching %s: %w", name, err))
			break
		}
		links = append(links, l)
		p.links[dir] = l
	}
	if r.plan[PathRawSys].why != nil {
		for _, l := range links {
			_ = l.Close()
		}
		p.links = [2]link.Link{}
		for _, slot := range slots {
			_ = keys.Put(slot, gen.RingbufKcSysKey{})
		}
		if r.cfg.Syscalls == SyscallsRaw {
			return nil, fmt.Errorf("raw syscall path: %w", r.plan[PathRawSys].why)
		}
		for _, i := range rawKeys {
			progs[i] = ""
		}
		return progs, nil
	}
	r.links = append(r.links, links...)
	p.slots = map[int]uint32{}
	for j, i := range rawKeys {
		p.slots[i] = slots[j]
	}
	return progs, nil
}

// laterMissed returns the recursion misses of the raw programs a change
// of filter loaded, those closed included; mu guards them.
func (p *rawPath) laterMissed(mu *sync.Mutex) uint64 {
	mu.Lock()
	defer mu.Unlock()
	n := p.gone
	if p.later != nil {
		n += programsMissed(p.later)
	}
	return n
}

// close closes the raw programs a change of filter loaded.
func (p *rawPath) close(mu *sync.Mutex) {
	mu.Lock()
	defer mu.Unlock()
	if p.later != nil {
		p.gone += programsMissed(p.later)
		p.later.Close()
		p.later = nil
	}
}

// attachProg attaches prog, a copy of kc_sys_enter (dir 0) or
// kc_sys_exit (dir 1), to its tracepoint.
func (p *rawPath) attachProg(dir int, prog *ebpf.Program) (link.Link, error) {
	if p.perf {
		return link.Tracepoint("raw_syscalls", []string{"sys_enter", "sys_exit"}[dir], prog, nil)
	}
	return link.AttachTracing(link.TracingOptions{Program: prog})
}

// sysEvent is a syscall event the syscall programs can build: its event
// key, whether it is an exit event, the syscall's number and name,
// whether it has a field filter, and whether it has a trigger.
type sysEvent struct {
	key      int
	exit     bool
	nr       int32
	name     string
	filtered bool
	trig     bool // it has a trigger, which only the raw path evaluates
}

// sysNr returns the x86_64 syscall number of the syscall event f, from
// the kernel's syscall table (sysnr_amd64.go), or false for a syscall
// the table does not have, newer than the kernel it comes from, or one
// whose number the programs' dispatch tables (sysMax) cannot hold.
func sysNr(f *tracefs.Format) (int32, bool) {
	name, ok := strings.CutPrefix(f.Name, "sys_enter_")
	if !ok {
		name, ok = strings.CutPrefix(f.Name, "sys_exit_")
	}
	nr, known := sysNrs[name]
	return nr, ok && known && nr >= 0 && nr < sysMax
}
