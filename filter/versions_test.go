package filter

import (
	"errors"
	"strings"
	"testing"
)

// TestChanges checks the version table against the kernels whose
// sources were read (Debian's) and the one it was run on.
func TestChanges(t *testing.T) {
	for _, c := range []struct {
		rel  string
		feat Feature
		want bool
	}{
		{"5.10.223-amd64", FeatRelLoc, false},
		{"6.1.192", FeatRelLoc, true},
		{"6.1.192", FeatFunction, false},
		{"6.12.117", FeatFunction, true},
		{"6.1.192", FeatStacktrace, false},
		{"6.12.117", FeatStacktrace, true},
		{"6.1.192", FeatCPUS, false},
		{"6.12.117", FeatCPUS, true},
		{"5.10.223", FeatGlobLen, false},
		{"6.1.192", FeatGlobLen, true},
		{"6.1.192", FeatIncomplete, false},
		{"6.12.114", FeatIncomplete, false},
		{"6.12.117", FeatIncomplete, true},
		{"6.18.44-fc-v657", FeatIncomplete, false},
		{"7.3.4+deb13-amd64", FeatIncomplete, true},
	} {
		r, ok := ParseRelease(c.rel)
		if !ok {
			t.Fatalf("ParseRelease(%q) failed", c.rel)
		}
		if got := Has(r, c.feat); got != c.want {
			t.Errorf("Has(%s, %s) = %v, want %v", c.rel, c.feat, got, c.want)
		}
	}
	if olderVerdict(FeatIncomplete) != true || olderVerdict(FeatCPUS) != false {
		t.Error("olderVerdict: a refusing change's rows are accepted before it, the others refused")
	}
}

// TestParseForKernel holds ParseOptions with an older Kernel to that
// kernel's refusals of the later syntax, each with a note naming the
// release that has it, and the newest kernel (the zero Release) to
// accepting them.
func TestParseForKernel(t *testing.T) {
	for _, c := range []struct {
		rel, expr string
		reason    Reason
		pos       int
		note      string
	}{
		{"6.1.192", "prev_state.function == schedule", ErrInvalidOp, 11, "FIELD.function needs Linux 6.2 or later; this kernel is 6.1.192"},
		{"6.1.192", "stacktrace == 1", ErrFieldNotFound, 11, "the pseudo field stacktrace needs Linux 6.4 or later"},
		{"6.1.192", "CPU & CPUS{0}", ErrInvalidValue, 7, "CPUS{list} needs Linux 6.6 or later"},
		{"5.10.223", "prev_pid == 1 && CPU == CPUS{1}", ErrInvalidValue, 25, "CPUS{list} needs Linux 6.6"},
		{"6.1.192", "nosuch == 1", ErrFieldNotFound, 7, ""},
	} {
		rel, _ := ParseRelease(c.rel)
		opts := testOpts
		opts.Kernel = rel
		_, err := ParseOptions(c.expr, testFormat(t, sw), opts)
		var pe *Error
		if !errors.As(err, &pe) {
			t.Errorf("%s: %q: want %q, got %v", c.rel, c.expr, c.reason, err)
			continue
		}
		if pe.Reason != c.reason || pe.Pos != c.pos || !strings.HasPrefix(pe.Note, c.note) || (c.note == "") != (pe.Note == "") {
			t.Errorf("%s: %q: got %q at %d (%s), want %q at %d (%s)", c.rel, c.expr, pe.Reason, pe.Pos, pe.Note, c.reason, c.pos, c.note)
		}
		if _, err := ParseOptions(c.expr, testFormat(t, sw), testOpts); c.note != "" && err != nil {
			t.Errorf("newest kernel: %q: %v", c.expr, err)
		}
	}
}
