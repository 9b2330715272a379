package recorder

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/synth"
)

// object is a user's BPF program built on bpf/kc_synth.h, loaded onto the
// session's gate, rings and counters.
type object struct {
	coll  *ebpf.Collection
	links []link.Link
}

func (o *object) close() {
	for _, l := range o.links {
		_ = l.Close()
	}
	o.coll.Close()
}

// LoadObject reads a user's BPF object file for Config.Objects.
func LoadObject(path string) (*ebpf.CollectionSpec, error) {
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		return nil, fmt.Errorf("%w: BPF object %s: %w", ErrConfig, path, err)
	}
	return spec, nil
}

// The names kc_synth.h gives an event's key and definition variables.
const (
	keyVarPrefix = "kc_key_"
	defVarPrefix = "kc_def_"
	gateMap      = ".data.kc_gate"
)

// objects are the users' programs loaded onto the recorder's rings.
// mu guards list against close while the drainer reads their programs'
// misses; gone keeps those of the objects closed.
type objects struct {
	mu   sync.Mutex
	list []*object
	gone uint64
}

// missed returns the recursion misses of the objects' programs, those
// closed included.
func (ob *objects) missed() uint64 {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	n := ob.gone
	for _, o := range ob.list {
		n += programsMissed(o.coll)
	}
	return n
}

// close detaches and closes every object, keeping their misses.
func (ob *objects) close() {
	n := ob.missed()
	ob.mu.Lock()
	defer ob.mu.Unlock()
	ob.gone = n
	for _, o := range ob.list {
		o.close()
	}
	ob.list = nil
}

// add loads and attaches one user object onto r.
func (ob *objects) add(r *Recorder, spec *ebpf.CollectionSpec, declare func(*synth.Event) (uint32, error)) error {
	if spec.Variables[gen.ExampleVarKcNcpu] == nil || spec.Maps[gen.ExampleMapKcState] == nil || spec.Maps[gateMap] == nil {
		return fmt.Errorf("%w: not built on kc_synth.h (no kc_ncpu, kc_state or %s)", ErrConfig, gateMap)
	}
	rep, set, err := objectShape(r, spec)
	if err != nil {
		return err
	}
	if err := objectKeys(spec, set, declare); err != nil {
		return err
	}
	for name, v := range set {
		vs := spec.Variables[name]
		if vs == nil {
			return fmt.Errorf("%w: no variable %s", ErrConfig, name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("setting %s: %w", name, err)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: rep})
	if err != nil {
		return fmt.Errorf("loading: %w", err)
	}
	o := &object{coll: coll}
	progs := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		progs = append(progs, name)
	}
	slices.Sort(progs)
	for _, name := range progs {
		l, err := attach(spec.Programs[name], coll.Programs[name])
		if err != nil {
			o.close()
			return fmt.Errorf("program %s: %w", name, err)
		}
		o.links = append(o.links, l)
	}
	ob.mu.Lock()
	ob.list = append(ob.list, o)
	ob.mu.Unlock()
	return nil
}

// objectShape sizes spec's maps for the session and returns the maps of
// the recorder that replace the object's (its state, gate, rings and
// kc_area) and the values of the object's variables. It fails on an
// object built for the other transport.
func objectShape(r *Recorder, spec *ebpf.CollectionSpec) (map[string]*ebpf.Map, map[string]any, error) {
	rep := map[string]*ebpf.Map{
		gen.ExampleMapKcState: r.coll.Maps[gen.RingbufMapKcState],
		gateMap:               r.coll.Maps[gateMap],
	}
	spec.Maps[gen.ExampleMapKcState].MaxEntries = uint32(2 * r.ncpu)
	if r.transport == Ringbuf {
		m := spec.Maps[gen.ExampleMapKcRings]
		if m == nil {
			return nil, nil, fmt.Errorf("%w: built for the perf transport (-DKC_PERF), the session uses ring buffers", ErrConfig)
		}
		m.MaxEntries = uint32(r.ncpu)
		m.InnerMap.MaxEntries = uint32(r.RingSize())
		rep[gen.ExampleMapKcRings] = r.coll.Maps[gen.RingbufMapKcRings]
	} else {
		m := spec.Maps[gen.ExamplePerfMapKcPerf]
		if m == nil {
			return nil, nil, fmt.Errorf("%w: built for ring buffers, the session uses the perf transport (build with -DKC_PERF)", ErrConfig)
		}
		m.MaxEntries = uint32(r.ncpu)
		rep[gen.ExamplePerfMapKcPerf] = r.coll.Maps[gen.PerfMapKcPerf]
	}
	set := map[string]any{
		gen.ExampleVarKcNcpu:   uint32(r.ncpu),
		gen.ExampleVarKcClock:  uint32(r.cfg.Clock),
		gen.ExampleVarKcGlobal: boolU32(r.cfg.Global),
	}
	if spec.Variables[gen.ExampleVarKcSelfTgid] != nil {
		set[gen.ExampleVarKcSelfTgid] = uint32(os.Getpid())
	}
	if r.transport == Ringbuf {
		set[gen.ExampleVarKcWakeupBytes] = uint64(r.cfg.Watermark)
	}
	if r.plan[PathOwnRings].on {
		// areaUsable checked that the object has kc_area.
		setupArea(spec, set, r.cfg, r.ncpu, gen.ExampleMapKcArea, false)
		rep[gen.ExampleMapKcArea] = r.coll.Maps[gen.RingbufMapKcArea]
	} else {
		stripArea(spec)
	}
	return rep, set, nil
}

// objectKeys declares the synthetic events of spec's kc_key_NAME
// variables, in the order of their names, and puts in set the key each
// gets.
func objectKeys(spec *ebpf.CollectionSpec, set map[string]any, declare func(*synth.Event) (uint32, error)) error {
	var names []string
	for name := range spec.Variables {
		if ev, ok := strings.CutPrefix(name, keyVarPrefix); ok {
			names = append(names, ev)
		}
	}
	slices.Sort(names)
	for _, ev := range names {
		def, err := objectDef(spec, ev)
		if err != nil {
			return err
		}
		key, err := declare(def)
		if err != nil {
			return err
		}
		set[keyVarPrefix+ev] = key
	}
	return nil
}

// objectDef returns the definition of event ev embedded in spec by
// KC_SYNTH_EVENT, checked to be named ev.
func objectDef(spec *ebpf.CollectionSpec, ev string) (*synth.Event, error) {
	vs := spec.Variables[defVarPrefix+ev]
	if vs == nil {
		return nil, fmt.Errorf("%w: %s%s has no definition %s%s (declare events with KC_SYNTH_EVENT)", ErrConfig, keyVarPrefix, ev, defVarPrefix, ev)
	}
	raw := make([]byte, vs.Size())
	if err := vs.Get(raw); err != nil {
		return nil, fmt.Errorf("%s%s: %w", defVarPrefix, ev, err)
	}
	text, _, _ := bytes.Cut(raw, []byte{0})
	def, err := synth.Parse(string(text))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if def.Name != ev {
		return nil, fmt.Errorf("%w: %s%s defines %q", ErrConfig, defVarPrefix, ev, def.Name)
	}
	return def, nil
}

// errAttach explains which programs a user's object may hold.
var errAttach = errors.New("kconsume attaches tracepoint, raw_tp, tp_btf, fentry, fexit, kprobe, kretprobe, kprobe.multi and kretprobe.multi programs")

// attach attaches prog by its section, as libbpf's auto-attach does.
func attach(ps *ebpf.ProgramSpec, prog *ebpf.Program) (link.Link, error) {
	sec := ps.SectionName
	kind, target, _ := strings.Cut(sec, "/")
	switch kind {
	case "tracepoint", "tp":
		group, name, ok := strings.Cut(target, "/")
		if !ok {
			return nil, fmt.Errorf("%w: section %q names no tracepoint (tracepoint/GROUP/NAME)", ErrConfig, sec)
		}
		return attachTracepoint(group, name, prog, nil)
	case "raw_tp", "raw_tracepoint":
		if target == "" {
			return nil, fmt.Errorf("%w: section %q names no tracepoint", ErrConfig, sec)
		}
		return link.AttachRawTracepoint(link.RawTracepointOptions{Name: target, Program: prog})
	case "tp_btf", "fentry", "fexit":
		return link.AttachTracing(link.TracingOptions{Program: prog})
	case "kprobe":
		return link.Kprobe(target, prog, nil)
	case "kretprobe":
		return link.Kretprobe(target, prog, nil)
	case "kprobe.multi", "kretprobe.multi":
		// libbpf takes a glob there; kconsume one function.
		if target == "" || strings.ContainsAny(target, "*?[") {
			return nil, fmt.Errorf("%w: section %q: name one function (%s/FUNC; no globs)", ErrConfig, sec, kind)
		}
		opts := link.KprobeMultiOptions{Symbols: []string{target}}
		if kind == "kretprobe.multi" {
			return link.KretprobeMulti(prog, opts)
		}
		return link.KprobeMulti(prog, opts)
	}
	return nil, fmt.Errorf("%w: section %q: %w", ErrConfig, sec, errAttach)
}
