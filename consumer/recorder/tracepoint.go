package recorder

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/gen"
	"golang.org/x/sys/unix"
)

// The classic tracepoints: the recorder's kc_tracepoint, told each
// event's key by the attach cookie or, before Linux 5.15, patched into a
// copy per event, with copies specialised by record size
// (kc_record_small) where the record goes into the ring as it is.

// tracepoints is the tracepoint kind's state.
type tracepoints struct {
	cookie bool // event keys come from attach cookies
	// filters holds each event key's field filter, nil for none; the
	// formats of the filtered events, by key.
	filters []*filter.Filter
	formats []*tracefs.Format
	// base is the general program the copies derive from; links holds
	// each recorded event's tracepoint link, gens the generation of
	// the copy it runs, and later the collections of the copies loaded
	// after the recorder (ReplaceFilter).
	base  *ebpf.ProgramSpec
	links map[int]link.Link
	gens  map[int]uint32
	later map[int]*ebpf.Collection
	epoch uint32 // the CPUs' epoch of filter changes (kc_epoch)
	// laterMu guards later against a change while the drainer reads
	// its programs' misses; gone keeps those of the copies closed.
	laterMu sync.Mutex
	gone    uint64
}

// laterMissed returns the recursion misses of the copies loaded after
// the recorder, those closed included: each an event lost.
func (t *tracepoints) laterMissed() uint64 {
	t.laterMu.Lock()
	defer t.laterMu.Unlock()
	n := t.gone
	for _, c := range t.later {
		n += programsMissed(c)
	}
	return n
}

// programsMissed returns the recursion misses of c's programs.
func programsMissed(c *ebpf.Collection) (n uint64) {
	for _, p := range c.Programs {
		if st, err := p.Stats(); err == nil {
			n += st.RecursionMisses
		}
	}
	return n
}

// filter returns event key i's field filter, or nil when it has none
// (or the kernel's "0", no filter).
func (t *tracepoints) filter(i int) *filter.Filter {
	if i < len(t.filters) && t.filters[i] != nil && len(t.filters[i].Prog) > 0 {
		return t.filters[i]
	}
	return nil
}

// filteredProg names the program copy of filtered event key i.
func filteredProg(i int) string { return "kc_tpf_" + strconv.Itoa(i) }

// smallSize returns the record size of f when the recorder can copy it
// straight into the ring with a program copy of its own size
// (kc_record_small in bpf/kc/tracepoint.bpf.h): a multiple of 2 from 8 to
// smallMax bytes, without dynamic fields. Otherwise it returns 0.
func smallSize(f *tracefs.Format) uint32 {
	n := f.FixedSize()
	if n < 8 || n > smallMax || n%2 != 0 {
		return 0
	}
	for _, fl := range f.All() {
		if fl.Loc != tracefs.Inline {
			return 0
		}
	}
	return uint32(n)
}

// keyPlaceholder, sizePlaceholder and nrPlaceholder are
// KC_KEY_PLACEHOLDER, KC_SIZE_PLACEHOLDER and KC_NR_PLACEHOLDER of
// bpf/kc/; smallMax is KC_SMALL_MAX (TestMirrorsC checks them).
const (
	keyPlaceholder  = 0x6b634b4559
	sizePlaceholder = 0x6b6353495a
	nrPlaceholder   = 0x6b634e5253
	smallMax        = 128
)

// copies makes the recorder's program copies in spec. With attach
// cookies: kc_tracepoint for every event, plus kc_tp_sN for the events
// of small record size N (kc_record_small). Without: kc_tp_I for event
// key I, with I patched in, on the general path only (a copy that perf
// refused to attach would have no general copy to fall back to).
func (t *tracepoints) copies(spec *ebpf.CollectionSpec, transport Transport, nevents int, opts *Options) error {
	orig := spec.Programs[gen.RingbufProgKcTracepoint]
	base := orig
	if transport == Ringbuf { // the perf object has no kc_record_small
		var err error
		if base, err = patchImm(base, base.Name, sizePlaceholder, 0); err != nil {
			return err
		}
		spec.Programs[base.Name] = base
	}
	t.base = base
	if opts != nil {
		t.filters, t.formats = opts.filters, opts.formats
	}
	if !t.cookie {
		delete(spec.Programs, gen.RingbufProgKcTracepoint)
		for i := 0; i < nevents; i++ {
			ps, err := patchImm(base, "kc_tp_"+strconv.Itoa(i), keyPlaceholder, uint32(i))
			if flt := t.filter(i); err == nil && flt != nil {
				ps, err = filterProg(ps, ps.Name, flt, t.formats[i])
			}
			if err == nil && opts != nil && opts.trigs.of(i) >= 0 {
				ps, err = t.trigProg(ps, opts.trigs, i, t.formats[i])
			}
			if err != nil {
				return err
			}
			spec.Programs[ps.Name] = ps
		}
		return nil
	}
	for i := 0; i < nevents; i++ {
		if opts != nil && i < len(opts.probes) && opts.probes[i] != nil {
			continue // kc_probe's copy has its filter (probes.setup)
		}
		if flt := t.filter(i); flt != nil || opts != nil && opts.trigs.of(i) >= 0 {
			ps, err := base.Copy(), error(nil)
			ps.Name = filteredProg(i)
			if flt != nil {
				ps, err = filterProg(base, filteredProg(i), flt, t.formats[i])
			}
			if err == nil && opts != nil {
				ps, err = t.trigProg(ps, opts.trigs, i, t.formats[i])
			}
			if err != nil {
				return err
			}
			spec.Programs[ps.Name] = ps
		}
	}
	if transport != Ringbuf || opts == nil {
		return nil
	}
	for _, n := range opts.small {
		if n == 0 || spec.Programs[smallProg(n)] != nil {
			continue
		}
		ps, err := patchImm(orig, smallProg(n), sizePlaceholder, n)
		if err != nil {
			return err
		}
		spec.Programs[ps.Name] = ps
	}
	return nil
}

// smallProg names the recorder copy for records of n bytes.
func smallProg(n uint32) string { return "kc_tp_s" + strconv.Itoa(int(n)) }

// patchImm returns a copy of program base named name with v in place of
// its one 64-bit immediate placeholder.
func patchImm(base *ebpf.ProgramSpec, name string, placeholder int64, v uint32) (*ebpf.ProgramSpec, error) {
	ps := base.Copy()
	ps.Name = name
	n := 0
	for i := range ps.Instructions {
		ins := &ps.Instructions[i]
		if ins.OpCode.IsDWordLoad() && ins.Constant == placeholder && ins.Reference() == "" {
			ins.Constant = int64(v)
			n++
		}
	}
	if n != 1 {
		return nil, fmt.Errorf("recorder program has %d placeholders %#x, want 1", n, placeholder)
	}
	return ps, nil
}

// attach attaches the recorder copy for event key i to the
// tracepoint f, with its size-specialised copy when there is one and the
// record goes into the ring as it is (asIs: not built by steps in packet
// mode).
func (t *tracepoints) attach(r *Recorder, f *tracefs.Format, i int, recorded, asIs bool) error {
	name, opts := "kc_tp_"+strconv.Itoa(i), (*link.TracepointOptions)(nil)
	if t.cookie {
		name, opts = gen.RingbufProgKcTracepoint, &link.TracepointOptions{Cookie: uint64(i)}
		// A record whose program builds its payload (packet mode's
		// steps) goes through the scratch record, never a small copy.
		if small := smallProg(smallSize(f)); recorded && asIs && r.coll.Programs[small] != nil {
			name = small
		}
		if recorded && (t.filter(i) != nil || r.trig(i)) {
			name = filteredProg(i)
		}
	}
	lk, err := attachTracepoint(f.System, f.Name, r.coll.Programs[name], opts)
	if errors.Is(err, unix.EACCES) && name != gen.RingbufProgKcTracepoint && t.cookie {
		// perf checks a copy's loads against the event's last field
		// (max_ctx_offset); where that is not its largest, record the
		// event the general way.
		name = gen.RingbufProgKcTracepoint
		lk, err = attachTracepoint(f.System, f.Name, r.coll.Programs[name], opts)
	}
	if err != nil {
		return fmt.Errorf("attaching to %s: %w", f.FullName(), err)
	}
	r.links = append(r.links, lk)
	r.tpProgs = append(r.tpProgs, name)
	if recorded {
		if t.links == nil {
			t.links = map[int]link.Link{}
		}
		t.links[i] = lk
	}
	return nil
}

// close closes the copies loaded after the recorder.
func (t *tracepoints) close() {
	t.laterMu.Lock()
	defer t.laterMu.Unlock()
	for _, c := range t.later {
		t.gone += programsMissed(c)
		c.Close()
	}
	t.later = nil
}
