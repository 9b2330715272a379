package recorder

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/kconsume/kconsume/gen"
)

// The function path: syscall events recorded by programs on the
// syscalls' x86_64 entry points (Config.Syscalls SyscallsFentry), a
// program copy per event: fentry and fexit programs, or, where the
// kernel runs those preemptibly (Preemptible) or refuses them, kprobes
// and kretprobes through kprobe.multi links, which run with preemption
// off and so lose no event to a preempted task.

// fentryPath holds the function path's program copies by the event they
// record.
type fentryPath struct {
	progs  map[int]string    // event key → its fentry or fexit program copy
	links  map[int]link.Link // event key → its copy's link, once attached
	kprobe bool              // the copies are kprobes and kretprobes
	fn     map[int]string    // event key → the function a kprobe copy is on
	exit   map[int]bool      // event key → a kretprobe copy
}

// FentryPrefix starts the names of the function path's program copies.
const FentryPrefix = "kc_sysf_"

// possible returns why the function path cannot record n syscall
// events here, or nil.
func (p *fentryPath) possible(r *Recorder, n int) error {
	switch {
	case r.cfg.Syscalls == SyscallsRaw || r.cfg.Syscalls == SyscallsTracepoint:
		return fmt.Errorf("turned off (syscalls: %s)", r.cfg.Syscalls)
	case r.cfg.Syscalls == SyscallsAuto && n > FentryMax:
		return fmt.Errorf("%d syscall events, more than the %d syscalls: auto puts on it", n, FentryMax)
	case r.cfg.Syscalls == SyscallsAuto && r.preempt.On && !Testing.RawFromBTF && kprobeFuncs() != nil && rawSysPossible(r.cfg, r.transport) == nil:
		return fmt.Errorf("%w (%s), and kprobes cannot stand in: %w: the raw path keeps them", errPreemptible, r.preempt.Why, kprobeFuncs())
	case runtime.GOARCH != "amd64":
		return fmt.Errorf("not on %s", runtime.GOARCH)
	case r.transport != Ringbuf:
		return errors.New("needs BPF ring buffers")
	}
	return nil
}

// copies puts in spec, for each of evs whose syscall function
// __x64_sys_NAME the kernel's BTF has, a copy of kc_sys_fentry (entry
// events) or kc_sys_fexit (exit events) attached to it, with the event's
// key and syscall number patched in; it removes the two originals. When
// the path cannot run, it adds none and r.plan[PathFentry] says why; with
// Config.Syscalls SyscallsFentry that is the error returned, as is a
// syscall event the path cannot record.
func (p *fentryPath) copies(r *Recorder, spec *ebpf.CollectionSpec, evs []sysEvent) error {
	enter, exit := spec.Programs[gen.RingbufProgKcSysFentry], spec.Programs[gen.RingbufProgKcSysFexit]
	kenter, kexit := spec.Programs[gen.RingbufProgKcSysKprobe], spec.Programs[gen.RingbufProgKcSysKretprobe]
	for _, n := range []string{gen.RingbufProgKcSysFentry, gen.RingbufProgKcSysFexit, gen.RingbufProgKcSysKprobe, gen.RingbufProgKcSysKretprobe} {
		delete(spec.Programs, n)
	}
	if len(evs) == 0 {
		return nil
	}
	fail := func(err error) error {
		r.plan.off(PathFentry, err)
		p.drop(spec)
		if r.cfg.Syscalls == SyscallsFentry {
			return fmt.Errorf("%w: fentry syscall path: %w", ErrNotSupported, err)
		}
		return nil
	}
	if err := p.possible(r, len(evs)); err != nil {
		return fail(err)
	}
	kspec, err := btf.LoadKernelSpec()
	if err != nil {
		return fail(fmt.Errorf("kernel BTF: %w", err))
	}
	// Trampolines run preemptibly where tracepoints do (preempt.go);
	// kprobes stand in there, and where the kernel refuses trampolines.
	p.kprobe = (r.preempt.On && !Testing.RawFromBTF || Testing.FuncKprobes) && kprobeFuncs() == nil
	probed := p.kprobe
	for _, e := range evs {
		fn, err := sysFunc(kspec, e.name)
		if err != nil {
			if r.cfg.Syscalls == SyscallsFentry {
				return fail(err)
			}
			r.plan[PathFentry].why = err
			continue
		}
		if !probed {
			if err := fentryProbe(fn); err != nil {
				if kprobeFuncs() != nil {
					return fail(fmt.Errorf("an empty program on %s: %w", fn, err))
				}
				p.kprobe = true
			}
			probed = true
		}
		base := enter
		if e.exit {
			base = exit
		}
		if p.kprobe {
			base = kenter
			if e.exit {
				base = kexit
			}
			p.fn[e.key], p.exit[e.key] = fn, e.exit
		}
		name := FentryPrefix + strconv.Itoa(e.key)
		ps, err := patchImm(base, name, keyPlaceholder, uint32(e.key))
		if err == nil {
			ps, err = patchImm(ps, name, nrPlaceholder, uint32(e.nr))
		}
		if err != nil {
			return err
		}
		ps.AttachTo = fn
		if p.kprobe {
			ps.AttachTo, ps.AttachType = "", ebpf.AttachTraceKprobeMulti
		}
		spec.Programs[name] = ps
		p.progs[e.key] = name
	}
	return nil
}

// fentryProbe loads an empty fentry program on fn and returns the
// kernel's error, if any: some kernels refuse fentry programs (this
// project's development VM answers EPERM to root), and a probe costs
// less than loading the recorder twice.
func fentryProbe(fn string) error {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "kc_fentry_probe",
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceFEntry,
		AttachTo:     fn,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return err
	}
	return p.Close()
}

// sysFunc returns the function of the kernel's BTF kspec that the x86_64
// syscall table calls for syscall name with the registers:
// __x64_sys_NAME, or for a syscall without arguments __do_sys_NAME, of
// which SYSCALL_DEFINE0 makes __x64_sys_NAME an alias that BTF does not
// name (arch/x86/include/asm/syscall_wrapper.h, __SYS_STUB0).
func sysFunc(kspec *btf.Spec, name string) (string, error) {
	var f *btf.Func
	x64 := "__x64_sys_" + name
	err := kspec.TypeByName(x64, &f)
	if err == nil {
		return x64, nil
	}
	do := "__do_sys_" + name
	if kspec.TypeByName(do, &f) == nil {
		if p, ok := f.Type.(*btf.FuncProto); ok && len(p.Params) == 1 && isRegsPointer(p.Params[0].Type) {
			return do, nil
		}
	}
	return "", fmt.Errorf("syscall function %s: %w", x64, err)
}

// isRegsPointer reports whether t is a pointer to (const) struct pt_regs.
func isRegsPointer(t btf.Type) bool {
	p, ok := btf.As[*btf.Pointer](t)
	if !ok {
		return false
	}
	st, ok := btf.As[*btf.Struct](p.Target)
	return ok && st.Name == "pt_regs"
}

// kprobeFuncs returns nil when the function path can run on kprobes
// here: kprobe.multi links (Linux 5.18, CONFIG_FPROBE), which run a
// kretprobe from the function graph's return hook with no cap on the
// calls in flight (a classic kretprobe misses calls past its maxactive
// without a count BPF sees), and bpf_task_pt_regs (Linux 5.15), which
// gives a kretprobe the syscall's registers. Else it returns why not.
var kprobeFuncs = sync.OnceValue(func() error {
	if err := features.HaveBPFLinkKprobeMulti(); err != nil {
		return fmt.Errorf("kprobe.multi links: %w", err)
	}
	if err := features.HaveProgramHelper(ebpf.Kprobe, asm.FnTaskPtRegs); err != nil {
		return fmt.Errorf("bpf_task_pt_regs: %w", err)
	}
	return nil
})

// KprobeFuncs returns nil when the function path can run on kprobes
// here, else why not (kprobe.multi links, Linux 5.18, and
// bpf_task_pt_regs, Linux 5.15).
func KprobeFuncs() error { return kprobeFuncs() }

// attachOne attaches prog, the copy of event key's program, to its
// syscall function.
func (p *fentryPath) attachOne(key int, prog *ebpf.Program) (link.Link, error) {
	if !p.kprobe {
		return link.AttachTracing(link.TracingOptions{Program: prog})
	}
	opts := link.KprobeMultiOptions{Symbols: []string{p.fn[key]}}
	if p.exit[key] {
		return link.KretprobeMulti(prog, opts)
	}
	return link.KprobeMulti(prog, opts)
}

// Kprobes reports whether the function path's copies are kprobes and
// kretprobes, which run with preemption off, rather than fentry and
// fexit programs.
func (r *Recorder) Kprobes() bool { return r.fentry.kprobe && len(r.fentry.progs) > 0 }

// drop removes the function path's program copies from spec.
func (p *fentryPath) drop(spec *ebpf.CollectionSpec) {
	for _, name := range p.progs {
		delete(spec.Programs, name)
	}
	clear(p.progs)
}

// attach attaches the function path's program copies and sets
// progs[key] to each one's name; when one fails, it detaches those it
// attached, sets none and returns why.
func (p *fentryPath) attach(r *Recorder, progs []string) error {
	links := map[int]link.Link{}
	for key, name := range p.progs {
		l, err := p.attachOne(key, r.coll.Programs[name])
		if err != nil {
			for _, l := range links {
				_ = l.Close()
			}
			clear(progs)
			return fmt.Errorf("attaching %s to %s: %w", name, r.coll.Programs[name].String(), err)
		}
		links[key] = l
		progs[key] = name
	}
	for _, l := range links {
		r.links = append(r.links, l)
	}
	p.links = links
	return nil
}
