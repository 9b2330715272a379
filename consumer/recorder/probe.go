package recorder

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/internal/kallsyms"
	"golang.org/x/sys/unix"
)

// The dynamic probes: kc_probe (bpf/kc/probe.bpf.h) on each kprobe or
// uprobe,
// told its event's key by the attach cookie, building the record of the
// probe's fetch arguments from the steps in kc_probe_map.

// probes is the probe kind's state: the probe of each event key, nil
// for the events of other kinds.
type probes struct {
	of    []*probe.Probe
	progs map[int]string // the program copy of each filtered probe's key
	// multi holds the keys of the kprobes of each glob attached at once
	// (kprobe.multi, Linux 5.18), done those attached.
	multi map[string][]int
	done  map[string]bool
}

// probeProg names the program copy of probe key i: a filtered one's,
// or an fentry or fexit probe's.
func probeProg(i int) string { return "kc_prf_" + strconv.Itoa(i) }

// WithProbes tells the load which event keys are probes: ps by key,
// nil for the others. It returns o.
func (o *Options) WithProbes(ps []*probe.Probe) *Options {
	o.probes = ps
	return o
}

// errProbeCookie says why a kernel before Linux 5.15 records no probe.
var errProbeCookie = errors.New("probes need BPF attach cookies (Linux 5.15)")

// setup keeps kc_probe and its maps, sized for nevents keys, where some
// event is a probe, and removes them otherwise (no verifier time, no
// scratch). It fails where probes cannot be recorded here.
func (p *probes) setup(r *Recorder, spec *ebpf.CollectionSpec, set map[string]any, opts *Options, nevents int) error {
	if opts != nil {
		p.of = opts.probes
	}
	need := false
	for _, pr := range p.of {
		need = need || pr != nil
	}
	if !need {
		delete(spec.Programs, gen.RingbufProgKcProbe)
		delete(spec.Programs, gen.RingbufProgKcFentry)
		delete(spec.Programs, gen.RingbufProgKcFexit)
		delete(spec.Maps, gen.RingbufMapKcProbeMap)
		delete(spec.Maps, gen.RingbufMapKcProbeScratch)
		return nil
	}
	if r.transport != Ringbuf || spec.Programs[gen.RingbufProgKcProbe] == nil {
		return fmt.Errorf("%w: probes need BPF ring buffers, not %s", ErrNotSupported, r.transport)
	}
	spec.Maps[gen.RingbufMapKcProbeMap].MaxEntries = uint32(max(nevents, 1))
	major, minor, err := kernelRelease()
	if err != nil {
		return err
	}
	for _, pr := range p.of {
		switch {
		case pr == nil:
		case pr.Kind.Tracing() && (major < 5 || major == 5 && minor < 17):
			return fmt.Errorf("%w: %s: fentry and fexit probes need bpf_get_func_arg (Linux 5.17)", ErrNotSupported, pr.FullName())
		case !pr.Kind.Tracing() && !r.tp.cookie:
			return fmt.Errorf("%w: %s: %w", ErrNotSupported, pr.FullName(), errProbeCookie)
		case pr.Kind == probe.Uretprobe && (major < 6 || major == 6 && minor < 6):
			return fmt.Errorf("%w: %s: a uretprobe's function address needs bpf_get_func_ip for uprobes (Linux 6.6)", ErrNotSupported, pr.FullName())
		}
	}
	// A filtered probe gets a copy with its filter compiled in, as a
	// filtered tracepoint does (filtercode.go); an fentry or fexit
	// probe a copy for its function, its key patched in.
	p.progs = map[int]string{}
	kprobe, fentry, fexit := spec.Programs[gen.RingbufProgKcProbe], spec.Programs[gen.RingbufProgKcFentry], spec.Programs[gen.RingbufProgKcFexit]
	delete(spec.Programs, gen.RingbufProgKcFentry)
	delete(spec.Programs, gen.RingbufProgKcFexit)
	for i, pr := range p.of {
		if pr == nil {
			continue
		}
		ps := kprobe
		if pr.Kind.Tracing() {
			base := fentry
			if pr.Kind == probe.Fexit {
				base = fexit
			}
			if ps, err = patchImm(base, probeProg(i), keyPlaceholder, uint32(i)); err != nil {
				return err
			}
			ps.AttachTo = pr.Symbol
		}
		if i < len(opts.filters) && opts.filters[i] != nil && len(opts.filters[i].Prog) > 0 {
			if ps, err = filterProg(ps, probeProg(i), opts.filters[i], opts.formats[i]); err != nil {
				return fmt.Errorf("%s: %w", pr.FullName(), err)
			}
		}
		if ps != kprobe {
			spec.Programs[ps.Name] = ps
			p.progs[i] = ps.Name
		}
	}
	p.setupMulti(spec)
	return nil
}

// setupMulti gathers the unfiltered kprobes and kretprobes of each glob
// into one kprobe.multi link where the kernel has them, with a copy of
// kc_probe made for that attach type: one attach for hundreds of
// functions, where a kprobe each costs the kernel a registration each.
func (p *probes) setupMulti(spec *ebpf.CollectionSpec) {
	p.multi, p.done = map[string][]int{}, map[string]bool{}
	if features.HaveBPFLinkKprobeMulti() != nil {
		return
	}
	for i, pr := range p.of {
		if pr != nil && pr.Group != "" && (pr.Kind == probe.Kprobe || pr.Kind == probe.Kretprobe) && p.progs[i] == "" {
			p.multi[pr.Group] = append(p.multi[pr.Group], i)
		}
	}
	if len(p.multi) == 0 {
		return
	}
	ps := spec.Programs[gen.RingbufProgKcProbe].Copy()
	ps.Name, ps.AttachType = probeMultiProg, ebpf.AttachTraceKprobeMulti
	spec.Programs[ps.Name] = ps
}

// probeMultiProg names kc_probe's copy for kprobe.multi links.
const probeMultiProg = "kc_probe_multi"

// attachMulti attaches the kprobes of group, keys, with one
// kprobe.multi link, each function's key its cookie.
func (p *probes) attachMulti(r *Recorder, group string, keys []int) error {
	var opts link.KprobeMultiOptions
	for _, k := range keys {
		opts.Symbols = append(opts.Symbols, p.of[k].Symbol)
		opts.Cookies = append(opts.Cookies, uint64(k))
	}
	attach := link.KprobeMulti
	if p.of[keys[0]].Kind == probe.Kretprobe {
		attach = link.KretprobeMulti
	}
	l, err := attach(r.coll.Programs[probeMultiProg], opts)
	if err != nil {
		return fmt.Errorf("%s: %d functions through kprobe.multi: %w", group, len(keys), err)
	}
	r.links = append(r.links, l)
	p.done[group] = true
	return nil
}

// attach writes probe key i's steps, its record laid out as f says, into
// kc_probe_map and attaches kc_probe to it, with i as the cookie. It
// fails, naming the probe, when the file or symbol is not there or the
// kernel refuses the probe.
func (p *probes) attach(r *Recorder, i int, f *tracefs.Format) error {
	pr := p.of[i]
	def, err := probeDef(pr, f)
	if err != nil {
		return fmt.Errorf("%s: %w", pr.FullName(), err)
	}
	if err := r.coll.Maps[gen.RingbufMapKcProbeMap].Put(uint32(i), def); err != nil {
		return fmt.Errorf("%s: %w", pr.FullName(), err)
	}
	if keys := p.multi[pr.Group]; len(keys) > 0 {
		r.tpProgs = append(r.tpProgs, probeMultiProg)
		if p.done[pr.Group] {
			return nil
		}
		return p.attachMulti(r, pr.Group, keys)
	}
	name := cmp.Or(p.progs[i], gen.RingbufProgKcProbe)
	ls, err := attachProbe(pr, r.coll.Programs[name], uint64(i))
	r.links = append(r.links, ls...)
	if err != nil {
		return fmt.Errorf("%s: %w", pr.FullName(), err)
	}
	r.tpProgs = append(r.tpProgs, name)
	return nil
}

// attachProbe attaches prog where pr fires, with cookie: a link, or
// for a USDT probe one a site, with its semaphore counted up while the
// link lasts (the kernel's ref_ctr_offset, Linux 4.20). It returns the
// links made before a failure too.
func attachProbe(pr *probe.Probe, prog *ebpf.Program, cookie uint64) ([]link.Link, error) {
	one := func(l link.Link, err error) ([]link.Link, error) {
		if err != nil {
			return nil, err
		}
		return []link.Link{l}, nil
	}
	switch pr.Kind {
	case probe.Fentry, probe.Fexit:
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		return one(l, tracingWhy(pr.Symbol, err))
	case probe.Kprobe:
		l, err := link.Kprobe(pr.Symbol, prog, &link.KprobeOptions{Cookie: cookie, Offset: pr.Offset})
		return one(l, kprobeWhy(pr.Symbol, err))
	case probe.Kretprobe:
		l, err := link.Kretprobe(pr.Symbol, prog, &link.KprobeOptions{Cookie: cookie})
		return one(l, kprobeWhy(pr.Symbol, err))
	}
	ex, err := link.OpenExecutable(pr.Path)
	if err != nil {
		return nil, err
	}
	opts := &link.UprobeOptions{Cookie: cookie, Offset: pr.Offset}
	switch pr.Kind {
	case probe.Uretprobe:
		return one(ex.Uretprobe(pr.Symbol, prog, opts))
	case probe.Usdt:
		var ls []link.Link
		for _, s := range pr.Sites {
			l, err := ex.Uprobe("", prog, &link.UprobeOptions{Cookie: cookie, Address: s.Offset, RefCtrOffset: s.Semaphore})
			if err != nil {
				return ls, fmt.Errorf("site at 0x%x: %w", s.Offset, err)
			}
			ls = append(ls, l)
		}
		return ls, nil
	}
	return one(ex.Uprobe(pr.Symbol, prog, opts))
}

// probeDef returns pr's steps as kc_probe reads them, its record laid
// out as f, its format, says. It fails for a
// probe the program cannot build: too many arguments or dereferences, a
// dereference offset beyond 32 bits, a record too large.
func probeDef(pr *probe.Probe, f *tracefs.Format) (gen.RingbufKcProbeDef, error) {
	var d gen.RingbufKcProbeDef
	fixed := f.FixedSize()
	if len(pr.Args) > len(d.Args) || fixed > probeFixedMax {
		return d, fmt.Errorf("%d arguments, a record of %d bytes: at most %d and %d", len(pr.Args), fixed, len(d.Args), probeFixedMax)
	}
	d.Nargs, d.Fixed = uint16(len(pr.Args)), uint16(fixed)
	// Two addresses head a return probe's record, but a trampoline's.
	d.Ret = uint8(boolU32(pr.Kind.Return() && !pr.Kind.Tracing()))
	d.IpReg, d.SpReg, d.RetReg = uint8(probe.IPReg), uint8(probe.SPReg), uint8(probe.RetvalReg)
	// A kprobe's address is kp.addr (trace_kprobe.c), which the
	// instruction pointer passed; a return probe's function is not in
	// the registers.
	d.FuncIp = uint8(boolU32(!pr.Kind.User() || pr.Kind.Return()))
	own := f.Fields[len(f.Fields)-len(pr.Args):]
	for j, a := range pr.Args {
		da := &d.Args[j]
		da.N, da.Base, da.Off = a.Fetch.N, uint8(a.Fetch.Base), uint16(own[j].Offset)
		if !a.Type.String {
			da.Size = uint8(a.Type.Size)
		}
		if len(a.Fetch.Derefs) > len(da.Deref) {
			return d, fmt.Errorf("argument %s: %d dereferences, at most %d", a.Name, len(a.Fetch.Derefs), len(da.Deref))
		}
		da.Nderef = uint8(len(a.Fetch.Derefs))
		user := pr.Kind.User()
		if user {
			da.User = 1 // the stack and @ADDR
		}
		for k, dr := range a.Fetch.Derefs {
			if dr.Off != int64(int32(dr.Off)) {
				return d, fmt.Errorf("argument %s: dereference offset %d beyond 32 bits", a.Name, dr.Off)
			}
			da.Deref[k] = int32(dr.Off)
			if dr.User || user {
				da.User |= 2 << k
			}
			// The string is where the last access points; a user
			// one is the process's (fetch_store_string_user).
			user = dr.User || pr.Kind.User()
		}
		if a.Type.String && (user || a.Type.Name == "ustring") {
			da.User |= probeUserString
		}
	}
	return d, nil
}

// probeFixedMax and probeUserString are KC_PROBE_FIXED and KC_PU_STR
// of bpf/kc/probe.bpf.h (TestMirrorsC checks them).
const (
	probeFixedMax   = 256
	probeUserString = 0x80
)

// blame names the probe whose own program copy (filtered, fentry or
// fexit) err, a failed load, is about (" for fentry:FUNC …"), or returns
// "": the kernel names only the copy.
func (p *probes) blame(err error) string {
	var pe *ebpf.VerifierError
	msg := err.Error()
	for i, pr := range p.of {
		if pr == nil {
			continue
		}
		// kc_probe itself serves them all: no one probe to name.
		name := p.progs[i]
		if name != "" && strings.Contains(msg, "program "+name+":") {
			if pr.Kind.Tracing() && !errors.As(err, &pe) && errors.Is(err, unix.EPERM) {
				return " for " + pr.Spec + " (the kernel refuses fentry and fexit programs here)"
			}
			return " for " + pr.Spec
		}
	}
	return ""
}

// kprobeWhy returns err, a kprobe's failure to attach to function sym,
// with what the kernel's lists say of sym: no such function in its
// symbols (or one inlined into every caller, which leaves none), one on
// the kprobe blacklist (kernel/kprobes.c refuses those), or one the
// kprobe events refuse because ftrace cannot trace it (notrace, or
// inlined into its callers: not in available_filter_functions;
// kernel/trace/trace_kprobe.c refuses those without
// CONFIG_KPROBE_EVENTS_ON_NOTRACE). nil stays nil.
func kprobeWhy(sym string, err error) error {
	if err == nil {
		return nil
	}
	syms, kerr := kallsyms.Read()
	if kerr != nil {
		return err
	}
	if _, _, ok := syms.Lookup(sym); !ok {
		return fmt.Errorf("no function %s in the kernel's symbols (none, or inlined into every caller; kconsume list 'kprobe:%s*' lists those kprobes can name): %w", sym, firstWord(sym), err)
	}
	if bl, berr := probe.Blacklisted(probe.KprobeBlacklist, sym); berr == nil && bl {
		return fmt.Errorf("%s cannot be probed: it is on the kernel's kprobe blacklist (%s), where a probe would recurse or break the kernel: %w", sym, probe.KprobeBlacklist, err)
	}
	if notTraceable(sym) {
		return fmt.Errorf("%s cannot be probed: it is not in the kernel's available_filter_functions (notrace, or inlined into its callers): %w", sym, err)
	}
	return err
}

// notTraceable reports whether the kernel's available_filter_functions,
// where it can be read, leaves function sym out.
func notTraceable(sym string) bool {
	fs, err := tracefs.Find()
	if err != nil {
		return false
	}
	funcs, err := probe.TraceableFunctions(fs.Root)
	return err == nil && !slices.Contains(funcs, sym)
}

// tracingWhy returns err, an fentry or fexit program's failure to
// attach to function sym, with why when ftrace cannot trace sym (not in
// available_filter_functions: notrace, or inlined into its callers), as
// a trampoline is reached through the function's ftrace call site
// (kernel/bpf/trampoline.c). nil stays nil.
func tracingWhy(sym string, err error) error {
	if err == nil {
		return nil
	}
	if notTraceable(sym) {
		return fmt.Errorf("%s cannot be probed: it is not in the kernel's available_filter_functions (notrace, or inlined into its callers), and trampolines attach at its ftrace call site: %w", sym, err)
	}
	return err
}

// firstWord returns sym up to its first underscore after the first
// character, a prefix for list's glob.
func firstWord(sym string) string {
	if i := strings.IndexByte(sym[min(1, len(sym)):], '_'); i >= 0 {
		return sym[:i+1]
	}
	return sym
}
