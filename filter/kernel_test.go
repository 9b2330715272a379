package filter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/kallsyms"
	"github.com/kconsume/kconsume/internal/testenv"
)

const tracing = "/sys/kernel/tracing"

// instance is a temporary ftrace instance of the test's own.
type instance struct {
	dir string
	t   *testing.T
}

// newInstance creates instances/kc-filter-PID and removes it when the
// test ends, pass or fail: events off, filters cleared, then rmdir. The
// top-level instance is never written.
func newInstance(t *testing.T) *instance {
	t.Helper()
	testenv.RequireRoot(t)
	dir := filepath.Join(tracing, "instances", fmt.Sprintf("kc-filter-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("creating ftrace instance: %v", err)
	}
	in := &instance{dir: dir, t: t}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(dir, "tracing_on"), []byte("0"), 0)
		_ = os.WriteFile(filepath.Join(dir, "events", "enable"), []byte("0"), 0)
		var err error
		for range 50 {
			if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
		}
		t.Errorf("removing ftrace instance %s: %v", dir, err)
	})
	return in
}

// eventDir returns the instance's directory of event "sys:name".
func (in *instance) eventDir(event string) string {
	sys, name, _ := strings.Cut(event, ":")
	return filepath.Join(in.dir, "events", sys, name)
}

// format returns the running kernel's format of event.
func (in *instance) format(event string) *tracefs.Format {
	in.t.Helper()
	sys, _, _ := strings.Cut(event, ":")
	b, err := os.ReadFile(filepath.Join(in.eventDir(event), "format"))
	if err != nil {
		in.t.Fatalf("event %s: %v", event, err)
	}
	f, err := tracefs.ParseFormat(sys, b)
	if err != nil {
		in.t.Fatalf("event %s: %v", event, err)
	}
	return f
}

// verdict is what the kernel made of a filter write.
type verdict struct {
	accepted bool
	errno    error
	text     string // parse_error text, "" for "Error: (N)"
	pos      int    // caret column, -1 without one
}

// setFilter writes expr to event's filter in one write and returns the
// kernel's verdict, read back from the filter file on refusal.
func (in *instance) setFilter(event, expr string) verdict {
	in.t.Helper()
	path := filepath.Join(in.eventDir(event), "filter")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		in.t.Fatal(err)
	}
	_, werr := f.Write([]byte(expr))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		return verdict{accepted: true}
	}
	v := verdict{errno: errors.Unwrap(werr), pos: -1}
	if errors.Is(werr, syscall.ENOSPC) || errors.Is(werr, syscall.ENOMEM) {
		in.t.Fatalf("writing filter %q: %v", expr, werr)
	}
	b, err := readOnce(path)
	if err != nil {
		in.t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if t, ok := strings.CutPrefix(l, "parse_error: "); ok {
			v.text = t
			if i > 0 && strings.HasSuffix(lines[i-1], "^") {
				v.pos = len(lines[i-1]) - 1
			}
		}
	}
	return v
}

// readOnce returns a filter file's text: the kernel answers only the
// first read of an open file (event_filter_read returns 0 past offset
// 0), so it is read in one call with room for a page.
func readOnce(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 3*4096)
	n, err := f.Read(b)
	return b[:n], err
}

// clearFilter writes "0", the kernel's "no filter".
func (in *instance) clearFilter(event string) {
	in.t.Helper()
	if v := in.setFilter(event, "0"); !v.accepted {
		in.t.Fatalf("clearing %s's filter: %v", event, v.errno)
	}
}

// runningRelease returns the running kernel's release.
func runningRelease(t *testing.T) Release {
	_, _, s := testenv.KernelRelease()
	r, ok := ParseRelease(s)
	if !ok {
		t.Fatalf("kernel release %q", s)
	}
	return r
}

// TestKernelVerdicts writes every expression of verdictRows to its
// event's filter in a temporary instance and holds the kernel's accept
// or refuse, and where it refuses its error text and caret position, to
// Parse's; the rows' own verdicts, adjusted by Changes for this kernel,
// to the kernel's.
func TestKernelVerdicts(t *testing.T) {
	in := newInstance(t)
	rel := runningRelease(t)
	opts := Options{Kernel: rel}
	syms, err := kallsyms.Read()
	if err == nil {
		opts.Symbols = syms
	} else {
		t.Logf("%v: the rows with .function are left out", err)
	}
	formats := map[string]*tracefs.Format{}
	agree, rows := 0, 0
	for _, r := range verdictRows {
		if syms == nil && strings.Contains(r.expr, ".function") {
			continue
		}
		f := formats[r.event]
		if f == nil {
			if r.event == ipi && !Has(rel, FeatCPUS) {
				// ipi_send_cpumask came with cpumask filtering (6.6).
				if _, err := os.Stat(in.eventDir(r.event)); err != nil {
					continue
				}
			}
			f = in.format(r.event)
			formats[r.event] = f
		}
		rows++
		kv := in.setFilter(r.event, r.expr)
		in.clearFilter(r.event)
		_, err := ParseOptions(r.expr, f, opts)
		want := r.reason == ""
		if r.feat != "" && !Has(rel, r.feat) && olderVerdict(r.feat) {
			// This kernel's release predates a change that refuses what
			// it accepts (a trailing && or ||, which it reads with a
			// meaning of its own): it is held to the older verdict, Parse
			// refuses on every kernel. A build of that release may have
			// the change backported (two builds of 6.18.44 differ): it
			// then refuses as Parse does, for the same reason.
			switch {
			case kv.accepted:
				agree++
			case compareVerdict(kv, err, false) == "":
				t.Logf("%s: %q: kernel %s refuses it as later ones do (%s backported): %q", r.event, r.expr, rel, r.feat, kv.text)
				agree++
			default:
				t.Errorf("%s: %q: kernel %s (without %s): accepted=%v (%v %q)", r.event, r.expr, rel, r.feat, kv.accepted, kv.errno, kv.text)
			}
			continue
		}
		var pe *Error
		if r.feat != "" && !Has(rel, r.feat) {
			// This kernel predates the row's syntax: it refuses, and so
			// must Parse for it, saying which release has it.
			want = false
			if errors.As(err, &pe) && pe.Note == "" {
				t.Errorf("%s: %q: kernel %s (without %s): Parse refuses without a note: %v", r.event, r.expr, rel, r.feat, err)
			}
		}
		if msg := compareVerdict(kv, err, want); msg != "" {
			t.Errorf("%s: %q: kernel %s: %s", r.event, r.expr, rel, msg)
			continue
		}
		agree++
	}
	t.Logf("kernel %s: %d of %d filters judged alike", rel, agree, rows)
}

// olderVerdict returns whether a kernel without feature accepts a row
// tagged with it: the filters a feature made acceptable were refused
// before it, and those it made refused were accepted.
func olderVerdict(feature Feature) bool {
	for _, c := range Changes {
		if c.Feature == feature {
			return c.Refuses
		}
	}
	return false
}

// compareVerdict returns what differs between the kernel's verdict kv,
// Parse's err and the table's want, or "".
func compareVerdict(kv verdict, err error, want bool) string {
	var pe *Error
	if err != nil && !errors.As(err, &pe) {
		return fmt.Sprintf("Parse: not an *Error: %v", err)
	}
	switch {
	case kv.accepted != want:
		return fmt.Sprintf("accepted=%v (%v %q at %d); the table says %v", kv.accepted, kv.errno, kv.text, kv.pos, want)
	case kv.accepted && err != nil:
		return fmt.Sprintf("kernel accepts; Parse: %v", err)
	case kv.accepted:
		return ""
	case err == nil:
		return fmt.Sprintf("kernel refuses (%v: %q at %d); Parse accepts", kv.errno, kv.text, kv.pos)
	case kv.text == "" && pe.Kernel():
		return fmt.Sprintf("kernel refuses without a text (%v); Parse: %v", kv.errno, err)
	case kv.text != "" && (string(pe.Reason) != kv.text || pe.Pos != kv.pos):
		return fmt.Sprintf("kernel: %q at %d; Parse: %q at %d", kv.text, kv.pos, pe.Reason, pe.Pos)
	}
	return ""
}
