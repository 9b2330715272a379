package recorder

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/gen"
	"golang.org/x/sys/unix"
)

// A change of an event's filter while it records (ReplaceFilter, kconsume
// ctl filter) loads new program copies with the new filter compiled in
// and the next generation, attaches them beside the ones that record the
// event, and switches the event to them one CPU at a time: each CPU's
// epoch (kc_epoch) moves past the switch the event's entry names
// (kc_tp_info, or kc_sys_keys on the raw path), and the programs of one
// firing on one CPU read one epoch, so exactly one of the two
// generations records it (kc_gen_ok). The old copies are detached after.
// The event keeps its path, and so its record's layout: a tracepoint's
// copy, a function-path copy, or the raw programs, which serve every
// raw-path event and are all replaced together.

// genPlaceholder mirrors KC_GEN_PLACEHOLDER (bpf/kc/fields.h).
const genPlaceholder = 0x6b6347454e

// refilter is one change of filter, as the kind of program that records
// the event makes it.
type refilter struct {
	progs map[string]*ebpf.ProgramSpec // the new copies, their generation not yet patched
	cur   uint32                       // the generation recording now
	// attach attaches the new copies, in the order of old.
	attach func(*ebpf.Collection) ([]link.Link, error)
	// setSwitch writes into the event's entry (entries) the generations
	// cur and next and the epoch at which a CPU takes next (0: none).
	setSwitch func(cur, next, at uint32) error
	old       []link.Link
	// done records the kind's new generation, links and collection.
	done func(next uint32, links []link.Link, coll *ebpf.Collection)
}

// ReplaceFilter gives recorded event key i, of format f, the field filter
// flt (nil or the kernel's "0": none) while it is recorded, each event
// recorded once across the change. It fails for a filter the recorder
// cannot evaluate, or with the kernel's error; the event then keeps its
// filter. Callers serialize it with Detach and Close.
func (r *Recorder) ReplaceFilter(i int, f *tracefs.Format, flt *filter.Filter) error {
	if flt != nil && len(flt.Prog) == 0 {
		flt = nil
	}
	if flt != nil {
		if err := CheckFilter(flt, f); err != nil {
			return err
		}
	}
	t := &r.tp
	var c *refilter
	var err error
	switch {
	case t.links[i] != nil:
		c, err = t.refilter(r, i, f, flt)
	case r.fentry.links[i] != nil:
		c, err = r.fentry.refilter(r, i, f, flt)
	case r.raw.recorded(i):
		c, err = r.raw.refilter(r, i, f, flt)
	case r.btf.links[i] != nil:
		c, err = r.btf.refilter(r, i, f, flt)
	default:
		return fmt.Errorf("event %s is recorded by %s, whose filter cannot change", f.FullName(), r.tpProgs[i])
	}
	if err != nil {
		return err
	}
	next := c.cur + 1
	for name, ps := range c.progs {
		if c.progs[name], err = patchImm(ps, name, genPlaceholder, next); err != nil {
			return err
		}
	}
	spec := &ebpf.CollectionSpec{Maps: maps.Clone(r.spec.Maps), Programs: c.progs, Types: r.spec.Types}
	if err := globTables(spec); err != nil {
		return err
	}
	if !r.plan[PathOwnRings].on {
		// As the load did to the programs it kept (setupRings):
		// kernels before 5.12 refuse kc_area's atomics even unreached.
		stripArea(spec)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: r.coll.Maps})
	if err != nil {
		return fmt.Errorf("loading the filter of %s: %w", f.FullName(), err)
	}
	t.epoch++
	err = c.setSwitch(c.cur, next, t.epoch)
	var links []link.Link
	if err == nil {
		links, err = c.attach(coll)
	}
	if err != nil {
		// The old copies record on: the switch is taken back, or a
		// later change's epoch would hand the event to no copy.
		_ = c.setSwitch(c.cur, c.cur, 0)
		for _, l := range links {
			_ = l.Close()
		}
		coll.Close()
		return fmt.Errorf("switching %s to its new filter: %w", f.FullName(), err)
	}
	t.setEpoch(r, t.epoch)
	// Closing a tracepoint's or a trampoline's link waits for its
	// programs' runs to end (tracepoint_synchronize_unregister,
	// bpf_trampoline_update): after it only the new copies run, and
	// the switch need not be read any more.
	for k, old := range c.old {
		_ = old.Close()
		if j := slices.Index(r.links, old); j >= 0 {
			r.links[j] = links[k]
		}
	}
	c.done(next, links, coll)
	for len(t.filters) <= i {
		t.filters = append(t.filters, nil)
	}
	for len(t.formats) <= i {
		t.formats = append(t.formats, nil)
	}
	t.filters[i], t.formats[i] = flt, f
	// A run may read the entry while it is written, a field before
	// and another after: one field at a time, each write leaves every
	// mix of old and new reading next. Left undone, the switch stays
	// read but names next still.
	err = c.setSwitch(next, next, t.epoch)
	if err == nil {
		err = c.setSwitch(next, next, 0)
	}
	if err != nil {
		return fmt.Errorf("switching %s to its new filter: %w", f.FullName(), err)
	}
	return nil
}

// refilter changes the filter of event key i, which a copy of
// kc_tracepoint records: a new copy of the general program.
func (t *tracepoints) refilter(r *Recorder, i int, f *tracefs.Format, flt *filter.Filter) (*refilter, error) {
	name := "kc_tpg_" + strconv.Itoa(i)
	ps, err := patchImm(t.base, name, keyPlaceholder, uint32(i))
	if err == nil && flt != nil {
		ps, err = filterProg(ps, name, flt, f)
	}
	if err == nil {
		ps, err = t.trigProg(ps, r.trigs, i, f) // the trigger stays
	}
	if err != nil {
		return nil, err
	}
	var opts *link.TracepointOptions
	if t.cookie {
		opts = &link.TracepointOptions{Cookie: uint64(i)}
	}
	return copyRefilter(r, i, name, ps, t.links, false, func(p *ebpf.Program) (link.Link, error) {
		return attachTracepoint(f.System, f.Name, p, opts)
	}), nil
}

// copyRefilter returns the change of event key i's filter where one
// program copy records it: ps, named name, replaces the copy whose link
// is links[i], attached by attach; filtered marks a syscall event that
// its program filters.
func copyRefilter(r *Recorder, i int, name string, ps *ebpf.ProgramSpec, links map[int]link.Link, filtered bool, attach func(*ebpf.Program) (link.Link, error)) *refilter {
	return &refilter{
		progs: map[string]*ebpf.ProgramSpec{name: ps},
		cur:   r.tp.gens[i],
		attach: func(coll *ebpf.Collection) ([]link.Link, error) {
			l, err := attach(coll.Programs[name])
			return []link.Link{l}, err
		},
		setSwitch: infoSwitch(r, i, filtered),
		old:       []link.Link{links[i]},
		done: func(next uint32, nl []link.Link, coll *ebpf.Collection) {
			r.tp.keepLater(i, coll)
			links[i] = nl[0]
			r.tp.setGen(i, next)
			r.tpProgs[i] = name
		},
	}
}

// attachTracing attaches a tracing program (fentry, fexit, tp_btf).
func attachTracing(p *ebpf.Program) (link.Link, error) {
	return link.AttachTracing(link.TracingOptions{Program: p})
}

// refilter changes the filter of syscall event key i, which the
// function path records: a new copy of its fentry or fexit program with
// the new filter in its kc_sys_field_filter.
func (p *fentryPath) refilter(r *Recorder, i int, f *tracefs.Format, flt *filter.Filter) (*refilter, error) {
	name := p.progs[i]
	base := r.spec.Programs[name]
	if base == nil {
		return nil, fmt.Errorf("no program %s", name)
	}
	ps := base.Copy()
	flts := map[int]*filter.Filter{}
	if flt != nil {
		flts[i] = flt
	}
	code, err := sysDispatch(flts, map[int]*tracefs.Format{i: f}, false)
	if err != nil {
		return nil, err
	}
	if !replaceFunc(ps, sysFilterFunc, code) {
		return nil, fmt.Errorf("recorder program %s has no %s", name, sysFilterFunc)
	}
	attach := func(prog *ebpf.Program) (link.Link, error) { return p.attachOne(i, prog) }
	return copyRefilter(r, i, name, ps, p.links, flt != nil, attach), nil
}

// refilter changes the filter of event key i, which a BTF program
// records: a new copy of the program.
func (b *btfPath) refilter(r *Recorder, i int, f *tracefs.Format, flt *filter.Filter) (*refilter, error) {
	name := b.keys[i]
	ps := b.base[i].Copy()
	if flt != nil {
		var err error
		if ps, err = btfFilterProg(ps, name, b.uses[i], flt, f); err != nil {
			return nil, err
		}
	}
	return copyRefilter(r, i, name, ps, b.links, false, attachTracing), nil
}

// recorded reports whether the raw path records event key i.
func (p *rawPath) recorded(i int) bool {
	_, ok := p.slots[i]
	return ok
}

// refilter changes the filter of syscall event key i, which the raw
// path records: new copies of kc_sys_enter and kc_sys_exit with the
// filters of all the raw path's events, i's new one among them, which
// take over every raw-path event at once.
func (p *rawPath) refilter(r *Recorder, i int, f *tracefs.Format, flt *filter.Filter) (*refilter, error) {
	flts, formats := sharedFilters(r, slices.Collect(maps.Keys(p.slots)), i, f, flt)
	code, err := sysDispatch(flts, formats, false)
	if err != nil {
		return nil, err
	}
	progs := map[string]*ebpf.ProgramSpec{}
	var old []link.Link
	var dirs []int
	for dir, name := range []string{gen.RingbufProgKcSysEnter, gen.RingbufProgKcSysExit} {
		if p.links[dir] == nil {
			continue
		}
		ps := r.spec.Programs[name].Copy()
		if !replaceFunc(ps, sysFilterFunc, code) {
			return nil, fmt.Errorf("recorder program %s has no %s", name, sysFilterFunc)
		}
		progs[name] = ps
		old = append(old, p.links[dir])
		dirs = append(dirs, dir)
	}
	keysMap := r.coll.Maps[gen.RingbufMapKcSysKeys]
	return &refilter{
		progs: progs,
		cur:   p.gen,
		attach: func(coll *ebpf.Collection) ([]link.Link, error) {
			var links []link.Link
			for _, dir := range dirs {
				l, err := p.attachProg(dir, coll.Programs[[]string{gen.RingbufProgKcSysEnter, gen.RingbufProgKcSysExit}[dir]])
				if err != nil {
					return links, err
				}
				links = append(links, l)
			}
			return links, nil
		},
		setSwitch: func(cur, next, at uint32) error {
			for k, slot := range p.slots {
				var sk gen.RingbufKcSysKey
				if err := keysMap.Lookup(slot, &sk); err != nil {
					return err
				}
				sk.Gen, sk.GenNext, sk.SwitchAt = cur, next, at
				// Filtered while either generation may run; after,
				// as the new one's filter says.
				if k == i && flt != nil {
					sk.Flags |= tpFiltered
				} else if k == i && cur == next && at == 0 {
					sk.Flags &^= tpFiltered
				}
				if err := keysMap.Put(slot, sk); err != nil {
					return err
				}
			}
			return nil
		},
		old: old,
		done: func(next uint32, links []link.Link, coll *ebpf.Collection) {
			r.tp.laterMu.Lock()
			if p.later != nil {
				p.gone += programsMissed(p.later)
				p.later.Close()
			}
			p.later = coll
			r.tp.laterMu.Unlock()
			for k, dir := range dirs {
				p.links[dir] = links[k]
			}
			p.gen = next
		},
	}, nil
}

// infoSwitch returns the setSwitch of event key i's kc_tp_info; with sys
// set, the event is one the syscall programs filter (KC_TP_FILTERED) when
// filtered is.
func infoSwitch(r *Recorder, i int, filtered bool) func(cur, next, at uint32) error {
	info := r.coll.Maps[gen.RingbufMapKcTpInfoMap]
	return func(cur, next, at uint32) error {
		return putSwitch(info, i, cur, next, at, true, filtered)
	}
}

// putSwitch writes the generations cur and next and the epoch at into
// event key i's kc_tp_info entry; where changed says its filter is the
// one changing, it marks the entry filtered while either generation may
// run, and after as filtered says.
func putSwitch(info *ebpf.Map, i int, cur, next, at uint32, changed, filtered bool) error {
	var ti gen.RingbufKcTpInfo
	if err := info.Lookup(uint32(i), &ti); err != nil {
		return err
	}
	ti.Gen, ti.GenNext, ti.SwitchAt = cur, next, at
	if changed && filtered {
		ti.Flags |= tpFiltered
	} else if changed && cur == next && at == 0 {
		ti.Flags &^= tpFiltered
	}
	return info.Put(uint32(i), ti)
}

// sharedFilters returns the filters and formats of the events keys that
// one program serves, with event i's filter flt (of format f) in place
// of its own.
func sharedFilters(r *Recorder, keys []int, i int, f *tracefs.Format, flt *filter.Filter) (map[int]*filter.Filter, map[int]*tracefs.Format) {
	flts, formats := map[int]*filter.Filter{}, map[int]*tracefs.Format{}
	for _, k := range keys {
		if kf := r.tp.filter(k); kf != nil && k != i {
			flts[k], formats[k] = kf, r.tp.formats[k]
		}
	}
	if flt != nil {
		flts[i], formats[i] = flt, f
	}
	return flts, formats
}

// keepLater keeps coll, the copy a change loaded for event key i, whose
// misses the recorder counts, closing the one before it.
func (t *tracepoints) keepLater(i int, coll *ebpf.Collection) {
	t.laterMu.Lock()
	defer t.laterMu.Unlock()
	if t.later == nil {
		t.later = map[int]*ebpf.Collection{}
	}
	if c := t.later[i]; c != nil {
		t.gone += programsMissed(c)
		c.Close()
	}
	t.later[i] = coll
}

// setGen records the generation of the copy that records event key i.
func (t *tracepoints) setGen(i int, g uint32) {
	if t.gens == nil {
		t.gens = map[int]uint32{}
	}
	t.gens[i] = g
}

// setEpoch moves every CPU's epoch of filter changes to e: by running
// kc_set_epoch on each online CPU from a thread pinned there, so that it
// runs in process context, where no firing of a tracepoint on that CPU
// is under way (run from another CPU it would come as an interrupt,
// which can fall between two programs of one firing); and for the CPUs
// it cannot reach, offline ones whose tracepoints do not fire, by
// writing kc_epoch.
func (t *tracepoints) setEpoch(r *Recorder, e uint32) {
	rest := make(chan []int)
	go func() {
		// Never unlocked: the thread, pinned, ends with the goroutine.
		runtime.LockOSThread()
		rest <- runOnEach(r.ncpu, r.coll.Programs[gen.RingbufProgKcSetEpoch], e)
	}()
	left := <-rest
	if len(left) == 0 {
		return
	}
	m := r.coll.Maps[gen.RingbufMapKcEpoch]
	epochs := make([]uint32, r.ncpu)
	if m.Lookup(uint32(0), &epochs) != nil {
		return
	}
	for _, cpu := range left {
		epochs[cpu] = e
	}
	_ = m.Put(uint32(0), epochs)
}

// runOnEach runs prog with argument e on each of ncpu CPUs from the
// calling thread, moved there first, and returns the CPUs it could not.
func runOnEach(ncpu int, prog *ebpf.Program, e uint32) []int {
	var left []int
	for cpu := 0; cpu < ncpu; cpu++ {
		var set unix.CPUSet
		set.Set(cpu)
		if prog == nil || unix.SchedSetaffinity(0, &set) != nil {
			left = append(left, cpu)
			continue
		}
		if _, err := prog.Run(&ebpf.RunOptions{CPU: uint32(cpu), Flags: unix.BPF_F_TEST_RUN_ON_CPU, Context: []uint64{uint64(e)}}); err != nil {
			left = append(left, cpu)
		}
	}
	return left
}
