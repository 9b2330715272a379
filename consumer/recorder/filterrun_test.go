package recorder

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/internal/testenv"
)

// globFormat is an event whose only field is a __data_loc string at 8.
var globFormat = &tracefs.Format{System: "kc", Name: "glob", Fields: []tracefs.Field{
	{Name: "s", Type: "char", Offset: 8, Size: 4, ArrayLen: -1, Loc: tracefs.DataLoc},
}}

// globRecord returns the trace record of globFormat holding str as n
// bytes (str, NUL-padded or cut).
func globRecord(str string, n int) []byte {
	rec := make([]byte, 12+n)
	binary.NativeEndian.PutUint32(rec[8:], uint32(n)<<16|12)
	copy(rec[12:], str)
	return rec
}

// filterRunner loads flt's compiled code for events of format f
// (kc_field_filter's body) in a raw tracepoint program that runs it on
// the ring record in a map, and returns a function that runs it on a
// trace record and returns its verdict.
func filterRunner(t *testing.T, f *tracefs.Format, flt *filter.Filter) func(rec []byte) bool {
	t.Helper()
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	code, err := compileFilter(flt, f, ringRec)
	if err != nil {
		t.Fatalf("%s: %v", flt.Expr, err)
	}
	code[0] = code[0].WithSymbol("filter")
	ins := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.DWord),
		asm.LoadMapValue(asm.R1, 0, 0).WithReference("rec"),
		asm.Call.Label("filter"),
		asm.Return(),
	}
	spec := &ebpf.CollectionSpec{
		Maps: map[string]*ebpf.MapSpec{"rec": {Type: ebpf.Array, KeySize: 4, ValueSize: 4096, MaxEntries: 1}},
		Programs: map[string]*ebpf.ProgramSpec{"glob": {
			Type: ebpf.RawTracepoint, Instructions: append(ins, code...), License: "GPL",
		}},
	}
	if err := globTables(spec); err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatalf("%s: %v", flt.Expr, err)
	}
	t.Cleanup(coll.Close)
	prog, m := coll.Programs["glob"], coll.Maps["rec"]
	return func(rec []byte) bool { return runFilter(t, prog, m, rec) }
}

// runFilter returns the verdict of prog on trace record rec.
func runFilter(t *testing.T, prog *ebpf.Program, m *ebpf.Map, rec []byte) bool {
	t.Helper()
	// The ring record lacks the trace record's bytes 2 and 3
	// (layout.RingOff).
	ring := append(append([]byte{}, rec[:2]...), rec[2+layout.RingCut:]...)
	val := make([]byte, 4096)
	copy(val, ring)
	if err := m.Put(uint32(0), val); err != nil {
		t.Fatal(err)
	}
	ctx := make([]byte, 8)
	binary.NativeEndian.PutUint64(ctx, uint64(len(ring)))
	ret, err := prog.Run(&ebpf.RunOptions{Context: ctx})
	if err != nil {
		t.Fatal(err)
	}
	return ret != 0
}

// TestDynGlobMatchesMatch runs globs on __data_loc strings compiled into
// BPF over strings that cross the loop's chunks, end early at a NUL, are
// empty or longer than their field says, and holds each verdict to
// filter.Match (itself held to the kernel by the filter package's
// TestKernelMatches).
func TestDynGlobMatchesMatch(t *testing.T) {
	testenv.RequireRoot(t)
	rng := rand.New(rand.NewPCG(49, 1))
	parts := []string{"a", "b", "/", "*", "?", "[ab]", "[!a]", "[a-c]", "\\*", "x"}
	alphabet := "ab/x*c"
	pats := []string{"*/kcf-exec-[ab]", "*", "a*", "*a", "?", "*[!/]*-exec-*-a", "a*b*c*d", "*a?*"}
	for len(pats) < 40 {
		var b strings.Builder
		for range 1 + rng.IntN(6) {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		pats = append(pats, b.String())
	}
	for _, pat := range pats {
		for _, not := range []string{"", "!"} {
			expr := fmt.Sprintf(`s ~ "%s%s"`, not, pat)
			flt, err := filter.ParseOptions(expr, globFormat, filter.Options{NrCPUs: 2})
			if err != nil {
				t.Fatalf("%s: %v", expr, err)
			}
			run := filterRunner(t, globFormat, flt)
			for k := range 60 {
				l := rng.IntN(8)
				if k%4 == 0 {
					l = 50 + rng.IntN(150)
				}
				var b strings.Builder
				for range l {
					b.WriteByte(alphabet[rng.IntN(len(alphabet))])
				}
				str := b.String()
				n := l + 1
				switch k % 5 {
				case 1:
					n = l // no NUL: the field's length ends it
				case 2:
					n = l + 9 // NULs after it
				case 3:
					n = 0
				}
				rec := globRecord(str, n)
				want := flt.Match(rec, "", 0)
				if got := run(rec); got != want {
					t.Errorf("%s on %q (%d bytes): recorder %v, filter.Match %v", expr, str, n, got, want)
				}
			}
		}
	}
}

// TestMaskMatchesMatch runs CPUS{} predicates on a cpumask field
// compiled into BPF over bitmaps of every length up to the kernel's
// CPUs and past it, and holds each verdict to filter.Match.
func TestMaskMatchesMatch(t *testing.T) {
	testenv.RequireRoot(t)
	f := &tracefs.Format{System: "ipi", Name: "ipi_send_cpumask", Fields: []tracefs.Field{
		{Name: "cpumask", Type: "cpumask_t", Offset: 8, Size: 4, ArrayLen: -1, Loc: tracefs.DataLoc},
	}}
	rng := rand.New(rand.NewPCG(49, 2))
	for _, nr := range []int{2, 8, 65, 130} {
		for _, expr := range []string{"cpumask & CPUS{0}", "cpumask == CPUS{0}", "cpumask != CPUS{1}", "cpumask & CPUS{1,%d}",
			"cpumask == CPUS{0-%d}", "cpumask != CPUS{0-%d}", "cpumask & CPUS{%d}"} {
			if strings.Contains(expr, "%d") {
				expr = fmt.Sprintf(expr, nr-1)
			}
			flt, err := filter.ParseOptions(expr, f, filter.Options{NrCPUs: nr})
			if err != nil {
				t.Fatalf("%s: %v", expr, err)
			}
			run := filterRunner(t, f, flt)
			for k := range 40 {
				n := rng.IntN(2 + nr/4)
				bits := make([]byte, n)
				for i := range bits {
					switch k % 3 {
					case 0:
						bits[i] = byte(rng.Uint32())
					case 1:
						bits[i] = 0xff
					}
				}
				if k%3 == 2 && n > 0 {
					bits[0] = 1 << rng.IntN(2)
				}
				rec := make([]byte, 12+n)
				binary.NativeEndian.PutUint32(rec[8:], uint32(n)<<16|12)
				copy(rec[12:], bits)
				if got, want := run(rec), flt.Match(rec, "", 0); got != want {
					t.Errorf("%d CPUs: %s on %x: recorder %v, filter.Match %v", nr, expr, bits, got, want)
				}
			}
		}
	}
}
