// Package profile names a trace's events, fields and metadata environment
// in the dialect of one tracer: "ftrace" keeps the names tracefs gives
// (sched:sched_switch with prev_pid), "lttng" speaks lttng-modules'
// (sched_switch with prev_tid, syscall_entry_read, a kernel-domain env),
// so LTTng's analyses and Trace Compass's kernel views read the trace.
//
// A profile renames: names live in the metadata, the payload bytes of a
// renamed event are the same under every profile, so renaming costs
// nothing per event. Where lttng-modules writes a field's value otherwise
// (scheduler priorities less 100, block's rwbs as an integer) the
// consumer adjusts it as it writes the event (Adjust), at the cost of a
// transcode in the drain. The few events whose values ftrace lacks
// (Built) the lttng profile records with its own BPF program in place of
// ftrace's tracepoint, at that program's cost.
package profile

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/relayfmt"
)

// Profile is one naming dialect.
type Profile struct {
	// Name is the profile's name on the command line.
	Name string
	// Doc says in one line what the profile does.
	Doc string
	// Tracer is the metadata's tracer_name; empty keeps "kconsume".
	Tracer string
	// rename maps a class and its fields to the dialect; nil keeps them.
	rename func(name string) (string, map[string]string, bool)
}

// Ftrace is the default profile: tracefs names as they are.
var Ftrace = &Profile{Name: "ftrace", Doc: "tracefs names (sched:sched_switch, prev_pid): what trace-cmd and perf users know"}

// LTTng names events and fields as lttng-modules does and writes its
// kernel-domain metadata environment.
var LTTng = &Profile{Name: "lttng", Doc: "lttng-modules names (sched_switch, prev_tid, syscall_entry_read) and a statedump: for LTTng's analyses and Trace Compass", Tracer: LTTngTracer, rename: lttngName}

var all = []*Profile{Ftrace, LTTng}

// Names returns the known profiles' names, the default first.
func Names() []string {
	var out []string
	for _, p := range all {
		out = append(out, p.Name)
	}
	return out
}

// Lookup returns the profile called name; "" is the default, ftrace. It
// fails for an unknown name with an error listing the known ones.
func Lookup(name string) (*Profile, error) {
	if name == "" {
		return Ftrace, nil
	}
	for _, p := range all {
		if p.Name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("unknown profile %q: known profiles are %s", name, strings.Join(Names(), ", "))
}

// Detect returns the profile a trace's metadata was written with: lttng
// when its tracer_name is lttng-modules, ftrace otherwise.
func Detect(m *relayfmt.Metadata) *Profile {
	if m.Tracer == LTTng.Tracer {
		return LTTng
	}
	return Ftrace
}

// EventName returns the dialect's name for the event class name (an
// ftrace "system:event" or "synthetic:NAME") and the renaming of its
// fields (absent fields keep their names). ok is false when the event
// keeps its ftrace name.
func (p *Profile) EventName(name string) (string, map[string]string, bool) {
	if p.rename == nil {
		return name, nil, false
	}
	return p.rename(name)
}

// Apply renames the event classes of m in place. A class whose new name
// another class already has keeps its name, so names stay unique. It
// fails only when a renamed class is invalid, which names it.
func (p *Profile) Apply(m *relayfmt.Metadata) error {
	return p.apply(m, nil)
}

// apply is Apply with a cache of renamed classes by original, so a
// metadata rewritten at each new class renames each class once.
func (p *Profile) apply(m *relayfmt.Metadata, cache map[*relayfmt.EventClass]*relayfmt.EventClass) error {
	if p.Tracer != "" {
		m.Tracer = p.Tracer
	}
	if p.rename == nil {
		return nil
	}
	taken := make(map[string]bool, len(m.Classes))
	for _, c := range m.Classes {
		if c != nil {
			taken[c.Name] = true
		}
	}
	for i, c := range m.Classes {
		if c == nil {
			continue
		}
		nc, ok := cache[c]
		if !ok {
			var err error
			if nc, err = p.renameClass(c); err != nil {
				return err
			}
			if cache != nil {
				cache[c] = nc
			}
		}
		if nc == nil || taken[nc.Name] {
			continue
		}
		delete(taken, c.Name)
		taken[nc.Name] = true
		m.Classes[i] = nc
	}
	return nil
}

// renameClass returns c in the profile's dialect, or nil when it keeps
// its ftrace names.
func (p *Profile) renameClass(c *relayfmt.EventClass) (*relayfmt.EventClass, error) {
	name, fields, ok := p.rename(c.Name)
	if !ok {
		return nil, nil
	}
	fs := slices.Clone(c.Fields)
	// The event's context (--context) keeps LTTng's names already; the
	// payload is a scope of its own.
	payload := fs[c.Context:]
	sequence(c.Name, payload)
	for j := range payload {
		if to, ok := fields[payload[j].Name]; ok && !slices.ContainsFunc(payload, func(f relayfmt.Field) bool { return f.Name == to }) {
			from := payload[j].Name
			payload[j].Name = to
			for k := range payload {
				if payload[k].LengthField == from {
					payload[k].LengthField = to
				}
			}
		}
	}
	nc, err := relayfmt.NewEventClass(c.ID, name, fs)
	if err != nil {
		return nil, fmt.Errorf("profile %s: event %s as %s: %w", p.Name, c.Name, name, err)
	}
	return nc, nil
}

// Adjust returns the fields the profile writes otherwise than the kernel,
// by ftrace event and field (consumer.Config.Adjust): under lttng, the
// scheduler priorities less 100, as lttng-modules writes task->prio -
// MAX_RT_PRIO, and the block events' rwbs as lttng-modules' integer
// (RWBS); nil under ftrace. The caller may not change it.
func (p *Profile) Adjust() map[string]map[string]consumer.Adjust {
	if p != LTTng {
		return nil
	}
	return lttngAdjust
}

// Original returns the ftrace name of an event class name of this
// profile's dialect, and false when name is not one this profile gives
// (it is then an ftrace name already). Readers use it to treat traces of
// every profile alike.
func (p *Profile) Original(name string) (string, bool) {
	if p.rename == nil {
		return name, false
	}
	return lttngOriginal(name)
}
