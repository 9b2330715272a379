package profile

import (
	"fmt"
	"slices"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/relayfmt"
)

// Built is an event the lttng profile records with kconsume's own BPF
// program (bpf/lttng/sched.bpf.c) in place of ftrace's tracepoint,
// because lttng-modules' event carries values ftrace's does not.
type Built struct {
	// Ftrace is the tracepoint it replaces, which patterns name.
	Ftrace string
	// Synth is the synthetic event the program emits (synthetic:Synth
	// under the ftrace profile's names).
	Synth string
	// LTTng is lttng-modules' name for it.
	LTTng string
	// Values says how the fields are built.
	Values string
	// sequences are one-element array fields written, with the field
	// before them, as lttng-modules' sequences: field → length field.
	sequences map[string]string
}

var builtTable = []Built{{
	Ftrace:    "sched:sched_process_fork",
	Synth:     "lttng_sched_process_fork",
	LTTng:     "sched_process_fork",
	Values:    "parent_comm, parent_tid (task pid), parent_pid (task tgid), parent_ns_inum (inode of its active pid namespace), child_comm, child_tid, vtids (one element: the child's tid in the initial pid namespace; lttng-modules writes one per level), child_pid (tgid), child_ns_inum: read from both task_structs by a tp_btf program (Linux 5.5+, kernel BTF)",
	sequences: map[string]string{"vtids": "_vtids_length"},
}}

var (
	builtBySynth = map[string]*Built{}
	builtByLTTng = map[string]*Built{}
)

func init() {
	for i := range builtTable {
		b := &builtTable[i]
		builtBySynth["synthetic:"+b.Synth] = b
		builtByLTTng[b.LTTng] = b
	}
}

// BuiltEvents returns the events p builds itself; none under ftrace.
func (p *Profile) BuiltEvents() []Built {
	if p != LTTng {
		return nil
	}
	return slices.Clone(builtTable)
}

// Replace returns the tracepoint patterns with the events in built taken
// out, and which of built they named. A pattern naming only such events is
// dropped; a glob naming others too becomes the list of the others. A
// pattern that matches nothing, or names a synthetic event, is kept as it
// is (the session says what is wrong with it). It fails when tracefs
// cannot be read or a pattern is malformed.
func Replace(fs tracefs.FS, patterns []string, built []Built) (kept []string, named []Built, err error) {
	replaced := map[string]bool{}
	for _, b := range built {
		replaced[b.Ftrace] = false
	}
	for _, p := range patterns {
		if len(built) == 0 || len(p) > 10 && p[:10] == "synthetic:" {
			kept = append(kept, p)
			continue
		}
		evs, err := fs.Events(p)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p, err)
		}
		var others []string
		hit := false
		for _, e := range evs {
			if _, ok := replaced[e.String()]; ok {
				replaced[e.String()] = true
				hit = true
				continue
			}
			others = append(others, e.String())
		}
		if !hit {
			kept = append(kept, p)
			continue
		}
		kept = append(kept, others...)
	}
	for _, b := range built {
		if replaced[b.Ftrace] {
			named = append(named, b)
		}
	}
	return kept, named, nil
}

// sequence turns the one-element arrays of class name that lttng-modules
// writes as sequences into sequences of the field before them; the
// payload bytes are the same (a count of 1, then the element).
func sequence(name string, fs []relayfmt.Field) {
	b := builtBySynth[name]
	if b == nil {
		return
	}
	for i := 1; i < len(fs); i++ {
		lf, ok := b.sequences[fs[i].Name]
		if ok && fs[i].Kind == relayfmt.Array && fs[i].Len == 1 && fs[i-1].Name == lf && fs[i-1].Kind == relayfmt.Scalar && fs[i-1].Elem == relayfmt.U8 {
			fs[i] = relayfmt.SequenceField(fs[i].Name, fs[i].Elem, lf)
		}
	}
}
