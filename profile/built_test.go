package profile

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/synth"
)

// TestBuiltFork: the definition compiled into bpf/lttng/sched.bpf.c,
// renamed by the profile, is lttng-modules' sched_process_fork
// (include/instrumentation/events/sched.h): its fields in its order, vtids
// a sequence counted by _vtids_length; and the name leads back to ftrace's.
func TestBuiltFork(t *testing.T) {
	for _, load := range []func() (*objDef, error){loadSpec(gen.LoadLTTng), loadSpec(gen.LoadLTTngPerf)} {
		spec, err := load()
		if err != nil {
			t.Fatal(err)
		}
		def, err := synth.Parse(spec.def)
		if err != nil {
			t.Fatal(err)
		}
		c, err := relayfmt.NewEventClass(3, "synthetic:"+def.Name, def.RelayFields())
		if err != nil {
			t.Fatal(err)
		}
		m := &relayfmt.Metadata{Classes: []*relayfmt.EventClass{c}}
		if err := LTTng.Apply(m); err != nil {
			t.Fatal(err)
		}
		nc := m.Classes[0]
		if nc.Name != "sched_process_fork" || nc.ID != 3 {
			t.Fatalf("renamed to %s (id %d)", nc.Name, nc.ID)
		}
		var names []string
		for _, f := range nc.Fields {
			names = append(names, f.Name)
		}
		want := []string{"parent_comm", "parent_tid", "parent_pid", "parent_ns_inum", "child_comm", "child_tid", "_vtids_length", "vtids", "child_pid", "child_ns_inum"}
		if !slices.Equal(names, want) {
			t.Fatalf("fields %v, want %v", names, want)
		}
		if v := nc.Fields[7]; v.Kind != relayfmt.Sequence || v.LengthField != "_vtids_length" || v.Elem != relayfmt.S32 {
			t.Errorf("vtids is %+v, want a sequence of int32 counted by _vtids_length", v)
		}
		if f := nc.Fields[0]; f.Kind != relayfmt.Array || !f.Text || f.Len != 16 {
			t.Errorf("parent_comm is %+v, want char[16]", f)
		}
		// The payload the program writes reads back the same under the
		// renamed class: a count of 1, then the element.
		payload, err := def.Encode(nil, "p", 1, 2, 3, "c", 4, 1, []int32{4}, 5, 6)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := nc.PayloadSize(payload); err != nil || n != len(payload) {
			t.Errorf("renamed class reads %d of %d payload bytes: %v", n, len(payload), err)
		}
		if back, ok := LTTng.Original("sched_process_fork"); !ok || back != "sched:sched_process_fork" {
			t.Errorf("Original(sched_process_fork) = %s, %v", back, ok)
		}
	}
	if Ftrace.BuiltEvents() != nil {
		t.Error("the ftrace profile builds events")
	}
}

type objDef struct{ def string }

// loadSpec reads the fork definition out of a generated object.
func loadSpec(load func() (*ebpf.CollectionSpec, error)) func() (*objDef, error) {
	return func() (*objDef, error) {
		s, err := load()
		if err != nil {
			return nil, err
		}
		v := s.Variables["kc_def_lttng_sched_process_fork"]
		raw := make([]byte, v.Size())
		if err := v.Get(raw); err != nil {
			return nil, err
		}
		text, _, _ := bytes.Cut(raw, []byte{0})
		return &objDef{def: string(text)}, nil
	}
}

// TestReplace: patterns lose the events the profile builds, globs keep
// the rest of what they match, and what matches nothing stays for the
// session to refuse.
func TestReplace(t *testing.T) {
	root := t.TempDir()
	for _, e := range []string{"sched/sched_process_fork", "sched/sched_process_exit", "sched/sched_switch", "irq/irq_handler_entry"} {
		if err := os.MkdirAll(filepath.Join(root, "events", e), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fs := tracefs.FS{Root: root}
	kept, named, err := Replace(fs, []string{"sched:sched_process_*", "irq:*", "sched_process_fork", "nosuch:event", "synthetic:x*"}, LTTng.BuiltEvents())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"sched:sched_process_exit", "irq:*", "nosuch:event", "synthetic:x*"}; !slices.Equal(kept, want) {
		t.Errorf("kept %v, want %v", kept, want)
	}
	if len(named) != 1 || named[0].LTTng != "sched_process_fork" {
		t.Errorf("named %v", named)
	}
	kept, named, err = Replace(fs, []string{"sched:sched_switch"}, LTTng.BuiltEvents())
	if err != nil || !slices.Equal(kept, []string{"sched:sched_switch"}) || len(named) != 0 {
		t.Errorf("sched_switch alone: %v %v %v", kept, named, err)
	}
	if _, _, err := Replace(fs, []string{"a/b"}, LTTng.BuiltEvents()); err == nil {
		t.Error("a malformed pattern passed")
	}
}

// TestREADMEListsBuilt: the README says which events the profile builds
// and from what.
func TestREADMEListsBuilt(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range LTTng.BuiltEvents() {
		for _, s := range []string{"`" + e.Ftrace + "`", "`" + e.LTTng + "`", "`" + e.Synth + "`", "bpf/lttng/sched.bpf.c"} {
			if !bytes.Contains(b, []byte(s)) {
				t.Errorf("README does not name %s (built event %s)", s, e.LTTng)
			}
		}
	}
}
