package recorder

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/synth"
)

// Events is what the recorder attaches: the recorded events, which get
// keys 0 to len(formats)-1, and the hooks, which take the keys after
// them; each recorded event's layout and user-space fields, of which
// the recorder keeps userBuf bytes each; with wake set, the sched_waking
// and sched_switch keys carry the wakeup_latency hooks.
type Events struct {
	Formats, Hooks []*tracefs.Format
	Layouts        []*layout.Layout
	Users          []*SysUser
	UserBuf        int
	Wake           bool
	// StackDepth is the most frames of the call chains the layouts
	// declare (layout.Stack), 0 for the kernel's limit (StackLimit).
	StackDepth int
}

// AttachSyscalls attaches the programs that record syscall events of
// formats other than through their tracepoints (the raw syscall path,
// kc_sys_user_fault) and returns, for each event, where its ring record
// keeps the trace record's bytes: layout.SysRingOff for the raw
// syscall programs' records, layout.RingOff for the others.
func (r *Recorder) AttachSyscalls(formats []*tracefs.Format, users []*SysUser) ([]func(int) int, error) {
	raw, err := r.raw.attach(r, formats)
	if err != nil {
		return nil, err
	}
	user, err := r.user.attach(r, formats, users)
	if err != nil {
		return nil, err
	}
	at := make([]func(int) int, len(formats))
	r.sysProgs = make([]string, len(formats))
	for i := range formats {
		at[i] = layout.RingOff
		if raw[i] != "" {
			at[i] = layout.SysRingOff
		}
		r.sysProgs[i] = cmp.Or(raw[i], user[i])
	}
	return at, nil
}

// AttachEvents tells the recorder each event's layout (kc_tp_info) and
// attaches it: through the syscall programs attachSyscalls attached, a
// BPF program built from its tracepoint's arguments, or its tracepoint.
func (r *Recorder) AttachEvents(es Events) error {
	info := r.coll.Maps[gen.RingbufMapKcTpInfoMap]
	for i, f := range append(slices.Clip(es.Formats), es.Hooks...) {
		recorded := i < len(es.Formats)
		ti, err := r.tpInfo(es, i, f)
		if err != nil {
			return err
		}
		if err := info.Put(uint32(i), ti); err != nil {
			return fmt.Errorf("event %s: %w", f.FullName(), err)
		}
		if recorded && i < len(r.probe.of) && r.probe.of[i] != nil {
			if err := r.probe.attach(r, i, f); err != nil {
				return err
			}
			continue
		}
		var p string
		if recorded {
			p = r.sysProgs[i]
		}
		if recorded && p == "" && r.btf.keys[i] != "" {
			p = r.btf.attach(r, i)
		}
		if p != "" {
			r.tpProgs = append(r.tpProgs, p)
		} else if err := r.tp.attach(r, f, i, recorded, ti.Nops == 0); err != nil {
			return err
		}
	}
	return nil
}

// tpInfo returns what the recorder's programs need to know of event key
// i, f: its id and sizes, its dynamic fields, its user-space fields, in
// packet mode the steps that build its payload, and the wakeup_latency
// hooks it carries.
func (r *Recorder) tpInfo(es Events, i int, f *tracefs.Format) (gen.RingbufKcTpInfo, error) {
	var ti gen.RingbufKcTpInfo
	if i < len(es.Formats) {
		l := es.Layouts[i]
		ti = gen.RingbufKcTpInfo{Id: uint16(f.ID), Size: uint16(f.FixedSize()), Ndyn: uint16(len(l.Dyn)), Flags: tpRecord}
		copy(ti.Dyn[:], l.Dyn)
		if f.System == "syscalls" && r.tp.filter(i) != nil {
			ti.Flags |= tpFiltered
		}
		if l.Stack != 0 {
			if err := putStack(&ti, l.Stack, es.StackDepth); err != nil {
				return ti, fmt.Errorf("event %s: %w", f.FullName(), err)
			}
		}
		putContexts(&ti, l)
		if u := es.Users[i]; u != nil {
			if (l.Stack != 0 || len(l.Ctx) > 0) && r.user.rec {
				return ti, fmt.Errorf("%w: event %s: call chains and contexts: %w", ErrNotSupported, f.FullName(), errStackUser)
			}
			if r.transport != Ringbuf {
				return ti, fmt.Errorf("%w: event %s: its user-space fields need BPF ring buffers, not %s", ErrNotSupported, f.FullName(), r.transport)
			}
			u.put(&ti, es.UserBuf)
		}
		if r.plan[PathPackets].on {
			ops, err := pktOps(l)
			if err != nil {
				// pktEligible took both syscall paths.
				return ti, fmt.Errorf("packet mode: %w", err)
			}
			ti.Nops = uint16(len(ops))
			copy(ti.Ops[:], ops)
		}
	}
	if es.Wake {
		if err := r.wake.fill(f, uint32(i), &ti); err != nil {
			return ti, err
		}
	}
	return ti, nil
}

// LinkWakeup tells the sched_switch hook key, the class of
// wakeup_latency, which exists only once the synthetic events are
// declared.
func (r *Recorder) LinkWakeup(key uint32) error {
	return r.wake.link(r.coll.Maps[gen.RingbufMapKcTpInfoMap], key)
}

// AddObjects loads and attaches each user object: it takes the session's
// gate, rings and counters in place of its own maps, each kc_key_NAME is
// set to the class of synthetic:NAME that declare returns for the
// object's kc_def_NAME (which must agree with Config.Synth and the
// built-in events),
// and each program is attached by its section. It fails, loading nothing
// of that object, on an object not built on kc_synth.h or for the other
// transport, a bad or clashing definition, or a program kconsume cannot
// attach.
func (r *Recorder) AddObjects(specs []*ebpf.CollectionSpec, declare func(*synth.Event) (uint32, error)) error {
	for i, spec := range specs {
		if err := r.objs.add(r, spec.Copy(), declare); err != nil {
			return fmt.Errorf("BPF object %d: %w", i+1, err)
		}
	}
	return nil
}
