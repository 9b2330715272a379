package synth

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
)

const tracefs = "/sys/kernel/tracing"

// requireSynthEvents returns the path of the kernel's synthetic_events.
// Only a kernel whose configuration says CONFIG_SYNTH_EVENTS is not set
// skips; one that should have the file and lacks it fails.
func requireSynthEvents(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	path := filepath.Join(tracefs, "synthetic_events")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	_, _, rel := testenv.KernelRelease()
	line, src, found := testenv.KernelConfig("CONFIG_SYNTH_EVENTS")
	if found && strings.HasPrefix(line, "#") {
		t.Skipf("kernel %s is built without synthetic events (%q in %s)", rel, line, src)
	}
	t.Fatalf("kernel %s has no %s, though its configuration (%q in %q) does not say CONFIG_SYNTH_EVENTS is off", rel, path, line, src)
	return ""
}

// kernelListing returns the lines of synthetic_events.
func kernelListing(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			out[l] = true
		}
	}
	return out
}

// writeCommand writes one line to synthetic_events, appending (O_TRUNC
// would delete every synthetic event).
func writeCommand(path, cmd string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(cmd + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// formatField is one field of an event's format file.
type formatField struct {
	decl   string // "TYPE NAME" without __data_loc
	size   int
	signed bool
}

// kernelFormat returns the event's own fields from its format file.
func kernelFormat(name string) ([]formatField, error) {
	b, err := os.ReadFile(filepath.Join(tracefs, "events", "synthetic", name, "format"))
	if err != nil {
		return nil, err
	}
	_, own, _ := strings.Cut(string(b), "\n\n") // the common fields come first
	var out []formatField
	for _, l := range strings.Split(own, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "field:") {
			continue
		}
		var ff formatField
		for _, part := range strings.Split(l, ";") {
			k, v, _ := strings.Cut(strings.TrimSpace(part), ":")
			switch k {
			case "field":
				ff.decl = strings.TrimPrefix(v, "__data_loc ")
			case "size":
				ff.size, _ = strconv.Atoi(v)
			case "signed":
				ff.signed = v == "1"
			}
		}
		out = append(out, ff)
	}
	return out, nil
}

// TestKernelAgrees writes every definition of the table into the running
// kernel's synthetic_events and holds the kernel's verdict, listing and
// format (types, sizes, signedness) to our reading of its language, and
// the table's recorded verdicts to the kernel's; then deletes what it
// created. make vmtest runs it on every kernel of the matrix.
func TestKernelAgrees(t *testing.T) {
	path := requireSynthEvents(t)
	before := kernelListing(t, path)
	created := map[string]bool{}
	t.Cleanup(func() {
		for name := range created {
			if err := writeCommand(path, "!"+name); err != nil {
				t.Errorf("deleting synthetic event %q: %v", name, err)
			}
		}
		after := kernelListing(t, path)
		for l := range after {
			if !before[l] {
				t.Errorf("left behind in %s: %q", path, short(l))
			}
		}
	})
	_, _, rel := testenv.KernelRelease()
	rows := defTable()
	agree := 0
	for _, c := range rows {
		werr := writeCommand(path, c.def)
		var added []string
		for l := range kernelListing(t, path) {
			if !before[l] {
				added = append(added, l)
			}
		}
		accepted := len(added) == 1
		if len(added) > 1 {
			t.Fatalf("%q: %d new synthetic events: %q", short(c.def), len(added), added)
		}
		var name string
		if accepted {
			name, _, _ = strings.Cut(added[0], "\t")
			created[name] = true
		}
		ours, perr := parse(c.def, false)
		switch {
		case accepted != c.kernel:
			t.Errorf("%q: kernel %s: accepted=%v (write: %v), the table records %v", short(c.def), rel, accepted, werr, c.kernel)
		case accepted != (perr == nil):
			t.Errorf("%q: kernel %s: accepted=%v (write: %v); our reading of its language: %v", short(c.def), rel, accepted, werr, perr)
		case accepted && ours.Listing() != added[0]:
			t.Errorf("%q: kernel %s lists %q, we render %q", short(c.def), rel, short(added[0]), short(ours.Listing()))
		case accepted:
			if err := compareFormat(name, ours); err != nil {
				t.Errorf("%q: kernel %s: %v", short(c.def), rel, err)
			} else {
				agree++
			}
		default:
			agree++
		}
		if accepted {
			if err := writeCommand(path, "!"+name); err != nil {
				t.Fatalf("deleting %q: %v", short(name), err)
			}
			delete(created, name)
		}
	}
	t.Logf("kernel %s: %d of %d definitions read alike", rel, agree, len(rows))
}

// compareFormat holds the kernel's format file of event name to e's
// fields: declaration, size and signedness. A name too long for a file
// name has no format directory, which only such a name may lack.
func compareFormat(name string, e *Event) error {
	if len(name) > 255 {
		return nil
	}
	got, err := kernelFormat(name)
	if err != nil {
		return err
	}
	if len(got) != len(e.Fields) {
		return fmt.Errorf("format has %d fields, we read %d", len(got), len(e.Fields))
	}
	for i, f := range e.Fields {
		// The format writes a fixed array as "char s[]" (6.1) or
		// "char s[16]" (f_show, trace_events.c), a dynamic one as its type.
		want := []string{f.String()}
		if f.Kind == Text || f.Kind == Array {
			base, _, _ := strings.Cut(f.Type, "[")
			want = []string{base + " " + f.Name + "[]", fmt.Sprintf("%s %s[%d]", base, f.Name, f.Len)}
		}
		if g := got[i]; !slices.Contains(want, g.decl) || g.size != f.Size || g.signed != f.Signed {
			return fmt.Errorf("field %d: format says %q size %d signed %v; we read %q size %d signed %v", i, g.decl, g.size, g.signed, want[0], f.Size, f.Signed)
		}
	}
	return nil
}
