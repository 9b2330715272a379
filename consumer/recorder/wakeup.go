package recorder

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/synth"
)

// Flags of kc_tp_info (bpf/kc/event.h).
const (
	tpRecord  = 1 // KC_TP_RECORD
	tpWaking  = 2 // KC_TP_WAKING
	tpSwitch  = 4 // KC_TP_SWITCH
	tpSysUser = 8 // KC_TP_SYSUSER
	// KC_TP_FILTERED: the syscall programs filter the event.
	tpFiltered = 16
)

// The tracepoints synthetic:wakeup_latency is computed from.
var (
	wakingEvent = tracefs.Event{System: "sched", Name: "sched_waking"}
	switchEvent = tracefs.Event{System: "sched", Name: "sched_switch"}
)

// WakeupHooks returns the formats of sched_waking and sched_switch that
// recorded does not hold: wakeup_latency needs the recorder on them.
func WakeupHooks(fs tracefs.FS, recorded []*tracefs.Format) ([]*tracefs.Format, error) {
	var out []*tracefs.Format
	for _, ev := range []tracefs.Event{wakingEvent, switchEvent} {
		found := false
		for _, f := range recorded {
			found = found || (f.System == ev.System && f.Name == ev.Name)
		}
		if found {
			continue
		}
		f, err := fs.Format(ev)
		if err != nil {
			return nil, fmt.Errorf("%w: synthetic:%s needs %s: %w", ErrNotSupported, synth.WakeupLatency, ev, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// wakeupHook is the sched_switch hook of wakeup_latency: its event key
// and kc_tp_info, which LinkWakeup completes once the synthetic event's
// class exists.
type wakeupHook struct {
	key  uint32
	info gen.RingbufKcTpInfo
}

// fill sets the hook of the tracepoint f, with key, in ti: the offsets
// of the fields the recorder reads, checked against the format.
func (w *wakeupHook) fill(f *tracefs.Format, key uint32, ti *gen.RingbufKcTpInfo) error {
	var pid string
	switch (tracefs.Event{System: f.System, Name: f.Name}) {
	case wakingEvent:
		ti.Flags |= tpWaking
		pid = "pid"
	case switchEvent:
		ti.Flags |= tpSwitch
		pid = "next_pid"
		prio, err := hookField(f, "next_prio", 4)
		if err != nil {
			return err
		}
		comm, err := hookField(f, "next_comm", 16)
		if err != nil {
			return err
		}
		ti.PrioOff, ti.CommOff = uint16(prio), uint16(comm)
	default:
		return nil
	}
	off, err := hookField(f, pid, 4)
	if err != nil {
		return err
	}
	ti.PidOff = uint16(off)
	if ti.Flags&tpSwitch != 0 {
		w.key, w.info = key, *ti
	}
	return nil
}

// hookField returns the offset of the inline field name of size bytes.
func hookField(f *tracefs.Format, name string, size int) (int, error) {
	for _, fl := range f.Fields {
		if fl.Name == name && fl.Loc == tracefs.Inline && fl.Size == size && fl.Offset+size <= 0xfff {
			return fl.Offset, nil
		}
	}
	return 0, fmt.Errorf("%w: synthetic:%s: %s has no %d-byte field %s", ErrNotSupported, synth.WakeupLatency, f.FullName(), size, name)
}

// link tells the sched_switch hook, in the recorder's kc_tp_info map
// info, key: the class of wakeup_latency.
func (w *wakeupHook) link(info *ebpf.Map, key uint32) error {
	w.info.AuxKey = key
	if err := info.Put(w.key, w.info); err != nil {
		return fmt.Errorf("synthetic:%s: %w", synth.WakeupLatency, err)
	}
	return nil
}
