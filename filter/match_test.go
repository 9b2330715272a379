package filter

import "testing"

// matchCase is one Match: a filter over a record made from vals, the
// task's comm and the CPU, and whether the kernel keeps it.
type matchCase struct {
	expr string
	vals map[string]any
	comm string
	cpu  int
	want bool
}

type vals = map[string]any

func runMatches(t *testing.T, event string, cases []matchCase) {
	t.Helper()
	f := testFormat(t, event)
	for _, c := range cases {
		flt, err := ParseOptions(c.expr, f, testOpts)
		if err != nil {
			t.Errorf("%s: %q: %v", event, c.expr, err)
			continue
		}
		rec := makeRecord(f, c.vals)
		if got := flt.Match(rec, c.comm, c.cpu); got != c.want {
			t.Errorf("%s: %q over %v comm %q cpu %d: %v, want %v", event, c.expr, c.vals, c.comm, c.cpu, got, c.want)
		}
	}
}

func TestMatchIntegers(t *testing.T) {
	runMatches(t, sw, []matchCase{
		{"prev_pid == 1", vals{"prev_pid": 1}, "", 0, true},
		{"prev_pid == 1", vals{"prev_pid": 2}, "", 0, false},
		{"prev_pid != 1", vals{"prev_pid": 2}, "", 0, true},
		{"prev_pid < 0", vals{"prev_pid": -5}, "", 0, true},
		{"prev_pid < -5", vals{"prev_pid": -5}, "", 0, false},
		{"prev_pid <= -5", vals{"prev_pid": -5}, "", 0, true},
		{"prev_pid > 0x7ffffffe", vals{"prev_pid": 0x7fffffff}, "", 0, true},
		// The constant is truncated to the field's size.
		{"prev_pid == 0x100000001", vals{"prev_pid": 1}, "", 0, true},
		{"prev_pid >= 010", vals{"prev_pid": 8}, "", 0, true},
		{"prev_pid & 6", vals{"prev_pid": 4}, "", 0, true},
		{"prev_pid & 6", vals{"prev_pid": 9}, "", 0, false},
		{"prev_state < 0", vals{"prev_state": -1}, "", 0, true},
		{"common_type == 0x10001", vals{"common_type": 1}, "", 0, true},
		{"common_flags > 200", vals{"common_flags": 255}, "", 0, true},
		{"CPU == 1", nil, "", 1, true},
		{"CPU == 1", nil, "", 0, false},
		{"cpu >= 1", nil, "", 3, true},
		{"common_cpu < 0", nil, "", 0, false},
		{"CPU & 1", nil, "", 1, false},
		{"CPU & CPUS{1}", nil, "", 1, true},
		{"CPU & CPUS{0-1}", nil, "", 1, true},
		{"CPU == CPUS{0-1}", nil, "", 1, false},
		{"CPU != CPUS{0-1}", nil, "", 1, true},
		{"prev_pid & CPUS{0-1}", vals{"prev_pid": 1}, "", 0, true},
		{"prev_pid & CPUS{0-1}", vals{"prev_pid": 5}, "", 0, false},
		{"prev_pid != CPUS{0-1}", vals{"prev_pid": 5}, "", 0, false},
		{"prev_pid != CPUS{0-1}", vals{"prev_pid": 1}, "", 0, true},
		{"prev_pid & CPUS{1}", vals{"prev_pid": 1}, "", 0, true},
		{"prev_pid & CPUS{1}", vals{"prev_pid": 3}, "", 0, false},
		// The cpumask predicates read a u64 into an unsigned int.
		{"prev_state & CPUS{0-1}", vals{"prev_state": int64(1) << 32}, "", 0, true},
		{"stacktrace == 0", nil, "", 0, false},
		{"stacktrace != 0", nil, "", 0, false},
		{"prev_state.function == schedule", vals{"prev_state": 0x1010}, "", 0, true},
		{"prev_state.function == schedule", vals{"prev_state": 0x1100}, "", 0, false},
		{"prev_state.function != schedule", vals{"prev_state": 0x1100}, "", 0, true},
		{"0", nil, "", 0, true},
	})
}

func TestMatchLogic(t *testing.T) {
	a := vals{"prev_pid": 1, "next_pid": 2, "prev_prio": 3}
	runMatches(t, sw, []matchCase{
		{"prev_pid == 1 && next_pid == 2", a, "", 0, true},
		{"prev_pid == 1 && next_pid == 3", a, "", 0, false},
		{"prev_pid == 9 || next_pid == 2", a, "", 0, true},
		{"prev_pid == 9 || next_pid == 2 && prev_prio == 4", a, "", 0, false},
		{"(prev_pid == 9 || next_pid == 2) && prev_prio == 3", a, "", 0, true},
		{"!(prev_pid == 1)", a, "", 0, false},
		{"!prev_pid == 1 || !next_pid == 2", a, "", 0, false},
		{"!(prev_pid == 9 || next_pid == 9)", a, "", 0, true},
		{"!!prev_pid == 1", a, "", 0, true},
		{"prev_pid == 1 && !(next_pid == 9 || !(prev_prio == 3 && CPU == 0))", a, "", 0, true},
		{"prev_pid == 1 && !(next_pid == 9 || !(prev_prio == 3 && CPU == 0))", a, "", 1, false},
	})
}

func TestMatchStrings(t *testing.T) {
	full := "abcdefghijklmnop" // 16 bytes, no NUL in a char[16]
	runMatches(t, sw, []matchCase{
		{`prev_comm == "bash"`, vals{"prev_comm": "bash"}, "", 0, true},
		{`prev_comm == "bas"`, vals{"prev_comm": "bash"}, "", 0, false},
		{`prev_comm == "bashx"`, vals{"prev_comm": "bash"}, "", 0, false},
		{`prev_comm != "bash"`, vals{"prev_comm": "bash"}, "", 0, false},
		{`prev_comm == "ba*"`, vals{"prev_comm": "ba*"}, "", 0, true},
		{`prev_comm ~ "ba*"`, vals{"prev_comm": "bash"}, "", 0, true},
		{`prev_comm ~ "!ba*"`, vals{"prev_comm": "bash"}, "", 0, false},
		{`prev_comm ~ "*as*"`, vals{"prev_comm": "bash"}, "", 0, true},
		// regex_match_end looks at the end of the 16-byte array.
		{`prev_comm ~ "*sh"`, vals{"prev_comm": "bash"}, "", 0, false},
		{`prev_comm ~ "*no"`, vals{"prev_comm": "0123456789abno"}, "", 0, false},
		{`prev_comm ~ "*no"`, vals{"prev_comm": "0123456789abcno"}, "", 0, true},
		{`prev_comm ~ "*"`, vals{"prev_comm": ""}, "", 0, true},
		{`prev_comm ~ "b?sh"`, vals{"prev_comm": "bash"}, "", 0, true},
		{`prev_comm ~ "b*h"`, vals{"prev_comm": "bash"}, "", 0, true},
		{`prev_comm ~ "[a-c]ash"`, vals{"prev_comm": "bash"}, "", 0, true},
		{`prev_comm ~ "[!a-c]ash"`, vals{"prev_comm": "bash"}, "", 0, false},
		{`prev_comm ~ "b\ash"`, vals{"prev_comm": "bash"}, "", 0, true},
		{`prev_comm ~ "1*"`, vals{"prev_comm": "1abc"}, "", 0, false},
		{`prev_comm ~ "1*"`, vals{"prev_comm": "1*"}, "", 0, true},
		{`prev_comm == "` + full + `"`, vals{"prev_comm": full}, "", 0, true},
		{`prev_comm ~ "*` + full[1:] + `"`, vals{"prev_comm": full}, "", 0, false},
		{`prev_comm ~ "a*p"`, vals{"prev_comm": full}, "", 0, true},
		{`COMM == "bash"`, nil, "bash", 0, true},
		{`comm ~ "ba*"`, nil, "zsh", 0, false},
		{`COMM == "0123456789abcdef"`, nil, "0123456789abcdef", 0, false},
		{`COMM == "0123456789abcde"`, nil, "0123456789abcdef", 0, true},
	})
	runMatches(t, execEv, []matchCase{
		{`filename == "/bin/true"`, vals{"filename": "/bin/true"}, "", 0, true},
		{`filename ~ "*true"`, vals{"filename": "/bin/true"}, "", 0, true},
		{`filename ~ "/usr/*"`, vals{"filename": "/bin/true"}, "", 0, false},
		{`filename ~ "*bin*"`, vals{"filename": "/bin/true"}, "", 0, true},
		{`filename ~ "/*/t?ue"`, vals{"filename": "/bin/true"}, "", 0, true},
		{`filename != "/bin/true"`, vals{"filename": "/bin/false"}, "", 0, true},
	})
	runMatches(t, "test:rel_test", []matchCase{
		{`name == "eth0"`, vals{"name": "eth0"}, "", 0, true},
		{`name ~ "eth*"`, vals{"name": "wlan0"}, "", 0, false},
		{`mac == "ab"`, vals{"mac": "ab"}, "", 0, true},
		{`v4 == 0x04030201`, vals{"v4": 0x04030201}, "", 0, true},
		{`addr == 0`, nil, "", 0, false},
		{`ptr == "x"`, nil, "", 0, false},
		{`ptr != "x"`, nil, "", 0, false},
		{`small < 0`, vals{"small": -1}, "", 0, true},
		{`half == -2`, vals{"half": -2}, "", 0, true},
	})
	runMatches(t, ipi, []matchCase{
		{`cpumask & CPUS{1}`, vals{"cpumask": cpumask{0x3}}, "", 0, true},
		{`cpumask == CPUS{1}`, vals{"cpumask": cpumask{0x3}}, "", 0, false},
		{`cpumask == CPUS{0-1}`, vals{"cpumask": cpumask{0x3, 0, 0, 0, 0, 0, 0, 0}}, "", 0, true},
		{`cpumask != CPUS{0}`, vals{"cpumask": cpumask{0x1}}, "", 0, false},
	})
}

// TestMatchShort: a record too short for a field, or a data_loc that
// points outside it, does not match.
func TestMatchShort(t *testing.T) {
	f := testFormat(t, execEv)
	flt, err := Parse(`filename ~ "*" || pid != 0`, f)
	if err != nil {
		t.Fatal(err)
	}
	rec := makeRecord(f, vals{"filename": "/bin/true", "pid": 0})
	for n := range len(rec) {
		if n < 16 && flt.Match(rec[:n], "", 0) {
			t.Errorf("record of %d bytes matched", n)
		}
	}
	rec[10] = 0xff // the length reaches past the record
	if flt.Match(rec, "", 0) {
		t.Error("data_loc past the record matched")
	}
}
