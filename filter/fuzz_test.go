package filter

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// fuzzEvents are the formats the fuzz targets parse against.
var fuzzEvents = []string{sw, execEv, "test:rel_test", ipi, "ftrace:print"}

// FuzzParse parses any text against several formats: an accepted filter
// has a forward-only program that Match runs without panicking over the
// fuzzed record; a refused one has an *Error inside the expression.
func FuzzParse(f *testing.F) {
	for _, r := range verdictRows {
		f.Add(r.expr, []byte("prev_comm\x00\x01\x02\x03"), uint8(0))
	}
	f.Add(`prev_comm ~ "[!a-]*\\"`, []byte{}, uint8(1))
	formats := make([]*tracefs.Format, len(fuzzEvents))
	for i, e := range fuzzEvents {
		formats[i] = testFormat(f, e)
	}
	f.Fuzz(func(t *testing.T, expr string, rec []byte, which uint8) {
		fm := formats[int(which)%len(formats)]
		flt, err := ParseOptions(expr, fm, testOpts)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Pos < 0 || pe.Pos > len(expr) || pe.Reason == "" {
				t.Fatalf("%q: %v", expr, err)
			}
			return
		}
		for i, in := range flt.Prog {
			if in.Pred == nil || in.Jump <= i || in.Jump > len(flt.Prog)+1 {
				t.Fatalf("%q: entry %d: %+v", expr, i, in)
			}
		}
		flt.Match(rec, string(rec), int(which))
		flt.Match(makeRecord(fm, nil), "", 0)
	})
}

// FuzzMatch runs fixed filters over fuzzed records, comms and CPUs:
// Match must not panic, a filter and its negation never both match, and
// one of them matches unless the record is unreadable for the filter.
func FuzzMatch(f *testing.F) {
	f.Add([]byte{}, "bash", 0)
	f.Add(make([]byte, 64), "", 1)
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x05\x00abcdefgh/bin/true\x00"), "x", -1)
	exprs := []string{
		`filename ~ "*bin*" || pid > 3 && old_pid & 1`,
		`filename ~ "/[a-c]?n/*e" && COMM == "bash"`,
		`filename == "/bin/true" || CPU & CPUS{0-1}`,
	}
	fm := testFormat(f, execEv)
	var flts, nots []*Filter
	for _, e := range exprs {
		a, err := ParseOptions(e, fm, testOpts)
		if err != nil {
			f.Fatal(err)
		}
		b, err := ParseOptions("!("+e+")", fm, testOpts)
		if err != nil {
			f.Fatal(err)
		}
		flts, nots = append(flts, a), append(nots, b)
	}
	f.Fuzz(func(t *testing.T, rec []byte, comm string, cpu int) {
		for i := range flts {
			a, b := flts[i].Match(rec, comm, cpu), nots[i].Match(rec, comm, cpu)
			if a && b {
				t.Fatalf("%q and its negation both match %q", exprs[i], rec)
			}
			if !a && !b && len(rec) >= fm.FixedSize() && flts[i].readable(rec) {
				t.Fatalf("%q and its negation both refuse a readable %q", exprs[i], rec)
			}
		}
	})
}

// readable reports whether exec's filename data lies inside rec.
func (f *Filter) readable(rec []byte) bool {
	w := binary.LittleEndian.Uint32(rec[8:])
	return int(w&0xffff)+int(w>>16) <= len(rec)
}
