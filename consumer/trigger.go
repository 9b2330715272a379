package consumer

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/relayfmt"
)

// TriggerAction is what a trigger does when its condition holds.
type TriggerAction = recorder.TriggerAction

// The trigger actions (docs/triggers.md).
const (
	TriggerSnapshot = recorder.TriggerSnapshot
	TriggerStop     = recorder.TriggerStop
	TriggerStart    = recorder.TriggerStart
	TriggerRotate   = recorder.TriggerRotate
)

// DefaultTriggerInterval is a trigger's rate limit when it names none:
// at most one action a second.
const DefaultTriggerInterval = time.Second

// MaxTriggers bounds a session's triggers.
const MaxTriggers = 64

// Trigger is a condition on the events of a recorded tracepoint and the
// action taken, in the recorder, when it holds on one (docs/triggers.md).
type Trigger struct {
	// Event names the recorded tracepoints, as Config.Events takes
	// them (globs too); an event takes one trigger.
	Event string
	// Expr is the condition in ftrace's event filter language; empty
	// or "0" for every event.
	Expr string
	// Action is snapshot (needs Mode Overwrite), stop, start or rotate
	// (needs a sink that writes chunks, as rotation does).
	Action TriggerAction
	// Interval is the least time between two actions of the trigger
	// (0: DefaultTriggerInterval).
	Interval time.Duration
}

// String returns the trigger as record --trigger takes it.
func (t Trigger) String() string {
	s := t.Event
	if t.Expr != "" {
		s += " " + t.Expr
	}
	s += " : " + t.Action.String()
	if t.Interval != 0 && t.Interval != DefaultTriggerInterval {
		s += ", every " + t.Interval.String()
	}
	return s
}

// checkTriggers fills in the triggers' intervals and fails with
// ErrConfig for an unknown action, a negative interval, a snapshot
// outside overwrite mode, a rotation inside it, or more than
// MaxTriggers.
func (c *Config) checkTriggers() error {
	if len(c.Triggers) > MaxTriggers {
		return fmt.Errorf("%w: %d triggers, at most %d", ErrConfig, len(c.Triggers), MaxTriggers)
	}
	for i := range c.Triggers {
		t := &c.Triggers[i]
		switch t.Action {
		case TriggerSnapshot:
			if c.Mode != relayfmt.Overwrite {
				return fmt.Errorf("%w: trigger %q: snapshot saves the flight recorder's buffers: it needs --mode overwrite", ErrConfig, t.String())
			}
		case TriggerStop, TriggerStart:
		case TriggerRotate:
			if c.Mode == relayfmt.Overwrite {
				return fmt.Errorf("%w: trigger %q: rotate needs discard mode: a flight recorder writes its sub-buffers only at a snapshot; take snapshots instead", ErrConfig, t.String())
			}
		default:
			return fmt.Errorf("%w: trigger on %s: unknown action %d", ErrConfig, t.Event, t.Action)
		}
		if t.Interval < 0 {
			return fmt.Errorf("%w: trigger %q: a negative interval", ErrConfig, t.String())
		}
		if t.Interval == 0 {
			t.Interval = DefaultTriggerInterval
		}
		if t.Event == "" {
			return fmt.Errorf("%w: a trigger without an event", ErrConfig)
		}
	}
	return nil
}

// resolveTriggers returns the recorder's triggers for the recorded
// events of formats (nil without triggers): each trigger's slot, and for
// each event it names its condition parsed against the event's format.
// It fails with ErrConfig, naming the trigger, for a pattern that names
// no recorded event, an event two triggers name, a probe or an event
// with user-space fields (their programs evaluate no trigger yet), or a
// condition the kernel's language or the recorder refuses; with
// ErrNotSupported on the perf transport or a kernel before
// triggerRelease.
func resolveTriggers(fs tracefs.FS, trigs []Trigger, formats []*tracefs.Format, users []*recorder.SysUser) (*recorder.Triggers, error) {
	if len(trigs) == 0 {
		return nil, nil
	}
	if rel := runningRelease(); rel != (filter.Release{}) && rel.Less(triggerRelease) {
		return nil, fmt.Errorf("%w: triggers need Linux %d.%d or later (BPF compare-and-swap); this kernel is %s", ErrNotSupported, triggerRelease.Major, triggerRelease.Minor, rel)
	}
	out := &recorder.Triggers{Slot: make([]int, len(formats)), Cond: make([]*filter.Filter, len(formats))}
	for i := range out.Slot {
		out.Slot[i] = -1
	}
	for slot, t := range trigs {
		keys, err := triggerEvents(fs, t.Event, formats)
		if err != nil {
			return nil, fmt.Errorf("%w: trigger %q: %w", ErrConfig, t.String(), err)
		}
		for _, i := range keys {
			f := formats[i]
			switch {
			case out.Slot[i] >= 0:
				return nil, fmt.Errorf("%w: trigger %q: event %s has a trigger already (%q); an event takes one trigger", ErrConfig, t.String(), f.FullName(), trigs[out.Slot[i]].String())
			case isProbe(f):
				return nil, fmt.Errorf("%w: trigger %q: event %s: triggers on probes are not evaluated yet", ErrConfig, t.String(), f.FullName())
			case i < len(users) && users[i] != nil:
				return nil, fmt.Errorf("%w: trigger %q: event %s: triggers on syscall events with user-space fields are not evaluated yet", ErrConfig, t.String(), f.FullName())
			}
			expr := t.Expr
			if expr == "" {
				expr = "0"
			}
			cond, err := parseFilter(expr, f)
			if err == nil {
				err = recorder.CheckTrigger(cond, f)
			}
			if err != nil {
				return nil, fmt.Errorf("%w: trigger %q: event %s: %w", ErrConfig, t.String(), f.FullName(), err)
			}
			out.Slot[i], out.Cond[i] = slot, cond
		}
		out.Defs = append(out.Defs, recorder.TriggerDef{Action: t.Action, Interval: t.Interval})
	}
	return out, nil
}

// triggerEvents returns the indexes in formats of the recorded
// tracepoints pattern names. It fails for a bad pattern or one that
// names no recorded event.
func triggerEvents(fs tracefs.FS, pattern string, formats []*tracefs.Format) ([]int, error) {
	evs, err := fs.Events(pattern)
	if err != nil {
		return nil, err
	}
	var keys []int
	for i, f := range formats {
		if slices.Contains(evs, tracefs.Event{System: f.System, Name: f.Name}) {
			keys = append(keys, i)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no recorded event matches it (give it with -e)", pattern)
	}
	return keys, nil
}

// triggerRelease is the first release whose verifier takes the
// compare-and-swap that claims a trigger's action (BPF_CMPXCHG, 5.12).
var triggerRelease = filter.Release{Major: 5, Minor: 12}

// TriggerCount is what one trigger did so far.
type TriggerCount struct {
	Trigger Trigger
	// Matched counts the recorded events on which its condition held,
	// Fired the actions it took (at most one per interval).
	Matched, Fired uint64
}

// TriggerCounts returns what each of the session's triggers did, in
// the order of Config.Triggers; after Close, the final counts.
func (s *Session) TriggerCounts() ([]TriggerCount, error) {
	if len(s.cfg.Triggers) == 0 {
		return nil, nil
	}
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gateShut {
		if f := s.finalTrig.Load(); f != nil {
			return *f, nil
		}
		return nil, ErrClosed
	}
	return s.triggerCounts()
}

// triggerCounts reads the recorder's trigger counts.
func (s *Session) triggerCounts() ([]TriggerCount, error) {
	counts, err := s.rec.TriggerCounts()
	if err != nil {
		return nil, err
	}
	out := make([]TriggerCount, len(counts))
	for i, c := range counts {
		out[i] = TriggerCount{Trigger: s.cfg.Triggers[i], Matched: c.Matched, Fired: c.Fired}
	}
	return out, nil
}

// TriggerRotations returns how many rotations the rotate triggers had
// the drainer make.
func (s *Session) TriggerRotations() uint64 {
	if s.dr == nil || s.dr.trig == nil {
		return 0
	}
	return s.dr.trig.rotations.Load()
}

// TriggerSnapshots returns how many snapshots the triggers had the
// drainer write, and the error of the last that failed (or rotation).
func (s *Session) TriggerSnapshots() (uint64, error) {
	if s.dr == nil || s.dr.trig == nil {
		return 0, nil
	}
	var err error
	if e := s.dr.trig.err.Load(); e != nil {
		err = *e
	}
	return s.dr.trig.snaps.Load(), err
}

// trigWatch is the drainer's end of the snapshot triggers' doorbell
// (kc_trig_ring): a note there means a snapshot is due.
type trigWatch struct {
	bell  *ringbuf
	id    int32
	due   bool
	snaps atomic.Uint64
	// rotations the rotate triggers had the drainer make.
	rotations atomic.Uint64
	err       atomic.Pointer[error]
}

// watchTriggers adds the triggers' doorbell of rec, when it has one, to
// the drainer's poller.
func (d *drainer) watchTriggers(rec *recorder.Recorder) error {
	m := rec.TriggerRing()
	if m == nil {
		return nil
	}
	bell, err := newRingbuf(m.FD(), int(m.MaxEntries()))
	if err != nil {
		return fmt.Errorf("trigger ring: %w", err)
	}
	d.trig = &trigWatch{bell: bell, id: int32(len(d.streams) + 1)}
	return d.poll.Add(m.FD(), d.trig.id)
}

// triggered writes the snapshot a trigger asked for, when its doorbell
// rang: every ring drained, the records waiting for order included,
// then the retained sub-buffers written, as Session.Snapshot does; or,
// for rotate triggers, rotates the trace as Session.Rotate does, every
// ring drained into the closing chunk. The trigger's event is in its
// ring before the doorbell rings, so it is in the snapshot or the
// closed chunk.
func (d *drainer) triggered() {
	t := d.trig
	if t == nil || !t.due {
		return
	}
	t.due = false
	t.bell.skipAll()
	if d.rot.trig {
		if _, err := d.rotate(); err != nil {
			err = fmt.Errorf("trigger rotation: %w", err)
			t.err.Store(&err)
			return
		}
		t.rotations.Add(1)
		return
	}
	d.drainAll(^uint64(0))
	if err := d.w.ch.Snapshot(); err != nil {
		err = fmt.Errorf("trigger snapshot: %w", err)
		t.err.Store(&err)
		return
	}
	t.snaps.Add(1)
}

// closeTriggers, as Close shuts the gate (gateMu held), keeps the
// triggers from acting again and keeps their counts.
func (s *Session) closeTriggers() {
	if len(s.cfg.Triggers) == 0 {
		return
	}
	_ = s.rec.LiveTriggers(false)
	s.keepTriggerCounts()
}

// keepTriggerCounts keeps the triggers' counts for TriggerCounts after
// Close.
func (s *Session) keepTriggerCounts() {
	if c, err := s.triggerCounts(); err == nil {
		s.finalTrig.Store(&c)
	}
}

// rotates reports whether a trigger of c rotates the trace: the session
// then writes chunks, as with a rotation size or interval.
func (c *Config) rotates() bool {
	for _, t := range c.Triggers {
		if t.Action == TriggerRotate {
			return true
		}
	}
	return false
}
