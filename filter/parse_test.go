package filter

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// fakeSymbols knows one function, schedule, at [0x1000, 0x1100).
type fakeSymbols struct{}

func (fakeSymbols) Lookup(name string) (uint64, uint64, bool) {
	return 0x1000, 0x1100, name == "schedule"
}

func (fakeSymbols) Containing(addr uint64) (uint64, uint64, bool) {
	return 0x1000, 0x1100, addr >= 0x1000 && addr < 0x1100
}

var testOpts = Options{NrCPUs: 2, Symbols: fakeSymbols{}}

// TestParseTable holds Parse to the verdict table: accept or refuse,
// the reason, and the kernel's caret position (checked on a 6.18 kernel
// by TestKernelVerdicts).
func TestParseTable(t *testing.T) {
	for _, r := range verdictRows {
		f := testFormat(t, r.event)
		flt, err := ParseOptions(r.expr, f, testOpts)
		if r.reason == "" {
			if err != nil {
				t.Errorf("%s: %q: %v", r.event, r.expr, err)
			} else if flt.Expr != r.expr {
				t.Errorf("%s: %q: Expr %q", r.event, r.expr, flt.Expr)
			}
			continue
		}
		var pe *Error
		if !errors.As(err, &pe) {
			t.Errorf("%s: %q: want %q at %d, got %v", r.event, r.expr, r.reason, r.pos, err)
			continue
		}
		if pe.Reason != r.reason || pe.Kernel() && pe.Pos != r.pos {
			t.Errorf("%s: %q: want %q at %d, got %q at %d", r.event, r.expr, r.reason, r.pos, pe.Reason, pe.Pos)
		}
	}
}

func TestErrorText(t *testing.T) {
	_, err := Parse("nosuch == 1", testFormat(t, sw))
	want := `filter "nosuch == 1": position 7: Field not found`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	long := "prev_pid == 1 || " + strings.Repeat(" ", 4096)
	var pe *Error
	if _, err := Parse(long, testFormat(t, sw)); !errors.As(err, &pe) || pe.Reason != ErrTooLong {
		t.Fatalf("4113 bytes: %v", err)
	}
}

// progText renders a program as "pred?branch:jump ..." for the tests.
func progText(f *Filter) string {
	var b strings.Builder
	for i, in := range f.Prog {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(in.Pred.Field.Name)
		if in.BranchIf {
			b.WriteString("?T:")
		} else {
			b.WriteString("?F:")
		}
		b.WriteString(string(rune('0' + in.Jump)))
	}
	return b.String()
}

// TestProgram checks the programs of the kernel's own examples (the
// comment above predicate_parse), with Jump = its target + 1.
func TestProgram(t *testing.T) {
	f := testFormat(t, sw)
	for _, c := range []struct{ expr, want string }{
		{"prev_pid == 1", "prev_pid?F:2"},
		{"!prev_pid == 1", "prev_pid?T:2"},
		// "a || b && c": n0: if (a) goto T; n1: if (!b) goto F; n2: if (!c) goto F.
		{"prev_pid == 1 || next_pid == 2 && prev_prio == 3", "prev_pid?T:3 next_pid?F:4 prev_prio?F:4"},
		// "a && !(!b || (c && g)) || d || e && !f", the kernel's
		// example, with its n1..n7 as 0..6, T as 7 and F as 8.
		{"prev_pid == 1 && !(!next_pid == 2 || (prev_prio == 3 && next_prio == 4)) || prev_state == 5 || common_pid == 6 && !common_type == 7",
			"prev_pid?F:4 next_pid?F:4 prev_prio?F:7 next_prio?F:7 prev_state?T:7 common_pid?F:8 common_type?T:8"},
	} {
		flt, err := ParseOptions(c.expr, f, testOpts)
		if err != nil {
			t.Fatalf("%q: %v", c.expr, err)
		}
		if got := progText(flt); got != c.want {
			t.Errorf("%q:\n got %s\nwant %s", c.expr, got, c.want)
		}
	}
}

// TestPredicates checks the typed leaves a compiler reads.
func TestPredicates(t *testing.T) {
	for _, c := range []struct {
		event, expr string
		want        Pred
	}{
		{sw, "prev_pid < -2", Pred{Field: Field{Name: "prev_pid", Offset: 24, Size: 4, Signed: true}, Op: OpLT, Kind: KindInt, Signed: true, Value: ^uint64(1)}},
		{sw, "prev_comm ~ \"!*sh\"", Pred{Field: Field{Name: "prev_comm", Offset: 8, Size: 16, StrLen: 16}, Op: OpGlob, Kind: KindString, Pattern: "sh", Match: MatchEnd, Not: true}},
		{sw, "prev_comm ~ \"1*\"", Pred{Field: Field{Name: "prev_comm", Offset: 8, Size: 16, StrLen: 16}, Op: OpGlob, Kind: KindString, Pattern: "1*", Match: MatchFull}},
		{sw, "prev_comm != \"a*\"", Pred{Field: Field{Name: "prev_comm", Offset: 8, Size: 16, StrLen: 16}, Op: OpNE, Kind: KindString, Pattern: "a*", Match: MatchFull, Not: true}},
		{sw, "COMM ~ \"*a?\"", Pred{Field: Field{Name: "COMM", Loc: LocComm, StrLen: 16}, Op: OpGlob, Kind: KindString, Pattern: "*a?", Match: MatchGlob}},
		{sw, "CPU & CPUS{1}", Pred{Field: Field{Name: "CPU", Loc: LocCPU, Signed: true}, Op: OpEQ, Kind: KindInt, Signed: true, Value: 1, NrCPUs: 2}},
		{sw, "common_pid & CPUS{0-1}", Pred{Field: Field{Name: "common_pid", Offset: 4, Size: 4, Signed: true}, Op: OpAnd, Kind: KindCPUs, Signed: true, CPUs: []int{0, 1}, NrCPUs: 2}},
		{execEv, "filename ~ \"*bin*\"", Pred{Field: Field{Name: "filename", Loc: LocDataLoc, Offset: 8, Size: 4}, Op: OpGlob, Kind: KindString, Pattern: "bin", Match: MatchMiddle}},
		{"test:rel_test", "name == \"x\"", Pred{Field: Field{Name: "name", Loc: LocRelLoc, Offset: 8, Size: 4}, Op: OpEQ, Kind: KindString, Pattern: "x"}},
		{"test:rel_test", "addr == 1", Pred{Field: Field{Name: "addr", Offset: 12, Size: 16}, Op: OpEQ, Kind: KindNever, Value: 1}},
		{"test:rel_test", "v4 == 1", Pred{Field: Field{Name: "v4", Offset: 28, Size: 4}, Op: OpEQ, Kind: KindInt, Value: 1}},
		{"test:rel_test", "mac == \"ab\"", Pred{Field: Field{Name: "mac", Offset: 32, Size: 6, StrLen: 6}, Op: OpEQ, Kind: KindString, Pattern: "ab"}},
		{"test:rel_test", "ptr ~ \"x*\"", Pred{Field: Field{Name: "ptr", Offset: 48, Size: 8}, Op: OpGlob, Kind: KindPtrString, Pattern: "x", Match: MatchFront}},
		{"test:rel_test", "blob > 3", Pred{Field: Field{Name: "blob", Offset: 56, Size: 4}, Op: OpGT, Kind: KindInt, Value: 3}},
		{"ftrace:print", "buf ~ \"*x*\"", Pred{Field: Field{Name: "buf", Offset: 16}, Op: OpGlob, Kind: KindString, Pattern: "x", Match: MatchMiddle}},
		{sw, "prev_state.function != schedule", Pred{Field: Field{Name: "prev_state", Offset: 32, Size: 8, Signed: true}, Op: OpNE, Kind: KindFunction, Signed: true, Func: "schedule", FuncStart: 0x1000, FuncEnd: 0x1100}},
	} {
		flt, err := ParseOptions(c.expr, testFormat(t, c.event), testOpts)
		if err != nil {
			t.Fatalf("%q: %v", c.expr, err)
		}
		got := *flt.Prog[0].Pred
		got.Pos = 0
		if !equalPred(got, c.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", c.expr, got, c.want)
		}
	}
}

func equalPred(a, b Pred) bool {
	return reflect.DeepEqual(a, b)
}

func TestParseRegex(t *testing.T) {
	for _, c := range []struct {
		in   string
		pat  string
		kind MatchKind
		not  bool
	}{
		{"abc", "abc", MatchFull, false},
		{"abc*", "abc", MatchFront, false},
		{"*abc", "abc", MatchEnd, false},
		{"*abc*", "abc", MatchMiddle, false},
		{"*", "", MatchEnd, false},
		{"**", "", MatchMiddle, false},
		{"a*c", "a*c", MatchGlob, false},
		{"*a?", "*a?", MatchGlob, false},
		{"a[bc]", "a[bc]", MatchGlob, false},
		{"a\\*", "a\\*", MatchGlob, false},
		{"!abc*", "abc", MatchFront, true},
		{"!", "", MatchFull, true},
		{"9*", "9*", MatchFull, false},
		{"!9?", "9?", MatchFull, true},
	} {
		pat, kind, not := parseRegex(c.in)
		if pat != c.pat || kind != c.kind || not != c.not {
			t.Errorf("%q: got %q %d %v, want %q %d %v", c.in, pat, kind, not, c.pat, c.kind, c.not)
		}
	}
}

func TestNumbers(t *testing.T) {
	for _, c := range []struct {
		in   string
		u    uint64
		uerr bool
		s    int64
		serr bool
	}{
		{"0", 0, false, 0, false},
		{"010", 8, false, 8, false},
		{"0x10", 16, false, 16, false},
		{"0X1f", 31, false, 31, false},
		{"08", 0, true, 0, true},
		{"0x", 0, true, 0, true},
		{"-1", 0, true, -1, false},
		{"-0x10", 0, true, -16, false},
		{"18446744073709551615", ^uint64(0), false, 0, true},
		{"18446744073709551616", 0, true, 0, true},
		{"-9223372036854775808", 0, true, -1 << 63, false},
		{"-9223372036854775809", 0, true, 0, true},
		{"", 0, true, 0, true},
		{"-", 0, true, 0, true},
	} {
		u, err := kstrtoull(c.in)
		if (err != nil) != c.uerr || err == nil && u != c.u {
			t.Errorf("kstrtoull(%q) = %d, %v", c.in, u, err)
		}
		s, err := kstrtoll(c.in)
		if (err != nil) != c.serr || err == nil && s != c.s {
			t.Errorf("kstrtoll(%q) = %d, %v", c.in, s, err)
		}
	}
}

func TestCPUList(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int
		ok   bool
	}{
		{"0", []int{0}, true},
		{"0-3", []int{0, 1, 2, 3}, true},
		{"0,2", []int{0, 2}, true},
		{" 1 , 3 ", []int{1, 3}, true},
		{"0-7:2/4", []int{0, 1, 4, 5}, true},
		{"all", []int{0, 1, 2, 3, 4, 5, 6, 7}, true},
		{"N", []int{7}, true},
		{"4-N", []int{4, 5, 6, 7}, true},
		{",", nil, true},
		{"8", nil, false},
		{"3-1", nil, false},
		{"1-", nil, false},
		{"0-3:3/2", nil, false},
		{"0-3:1/0", nil, false},
		{"x", nil, false},
		{"99999999999", nil, false},
	} {
		got, ok := parseCPUList(c.in, 8)
		if ok != c.ok || len(got) != len(c.want) {
			t.Errorf("%q: got %v %v, want %v %v", c.in, got, ok, c.want, c.ok)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%q: got %v, want %v", c.in, got, c.want)
				break
			}
		}
	}
}
