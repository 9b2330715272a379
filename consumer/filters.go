package consumer

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/internal/kallsyms"
	"golang.org/x/sys/unix"
)

// resolveFilters returns the field filter of each recorded event of
// formats (nil where none applies): the expressions of the filters whose
// Event names it, joined with &&, parsed against its format. It fails
// with ErrConfig, naming the event, the position and the reason, for an
// expression the kernel would refuse, one the recorder cannot yet
// evaluate, or a filter whose Event names no recorded event.
func resolveFilters(fs tracefs.FS, flts []EventFilter, formats []*tracefs.Format) ([]*filter.Filter, error) {
	if len(flts) == 0 {
		return nil, nil
	}
	exprs := make([][]string, len(formats))
	for _, flt := range flts {
		keys, err := namedEvents(fs, flt.Event, formats)
		if err != nil {
			return nil, err
		}
		for _, i := range keys {
			exprs[i] = append(exprs[i], flt.Expr)
		}
	}
	out := make([]*filter.Filter, len(formats))
	for i, f := range formats {
		if len(exprs[i]) == 0 {
			continue
		}
		expr := exprs[i][0]
		if len(exprs[i]) > 1 {
			expr = "(" + strings.Join(exprs[i], ") && (") + ")"
		}
		flt, err := parseFilter(expr, f)
		if err == nil {
			err = recorder.CheckFilter(flt, f)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: event %s: %w", ErrConfig, f.FullName(), err)
		}
		out[i] = flt
	}
	return out, nil
}

// resolveStacks returns the call chains each recorded event of formats
// records (nil when none does): the union of those of the stacks that
// name it. It fails with ErrConfig for a pattern that names no recorded
// event.
func resolveStacks(fs tracefs.FS, stacks []EventStack, formats []*tracefs.Format) ([]layout.Stack, error) {
	if len(stacks) == 0 {
		return nil, nil
	}
	out := make([]layout.Stack, len(formats))
	for _, st := range stacks {
		if st.Event == "" {
			for i := range out {
				out[i] |= st.Stack
			}
			continue
		}
		keys, err := namedEvents(fs, st.Event, formats)
		if err != nil {
			return nil, fmt.Errorf("stack: %w", err)
		}
		for _, i := range keys {
			out[i] |= st.Stack
		}
	}
	rel := runningRelease()
	for i, f := range formats {
		if out[i]&StackKernel != 0 && f.System == "syscalls" && rel != (filter.Release{}) && rel.Less(syscallStacks) {
			return nil, fmt.Errorf("%w: event %s: kernel call chains of syscall events need Linux %d.%d or later; this kernel (%s) hands BPF the syscall's user registers there, and the chain comes back empty (--stack user works)",
				ErrNotSupported, f.FullName(), syscallStacks.Major, syscallStacks.Minor, rel)
		}
	}
	return out, nil
}

// syscallStacks is the first release whose syscall tracepoints give BPF
// the kernel's registers, so a kernel call chain: before it
// kernel/trace/trace_syscalls.c:perf_call_bpf_enter passed the user's.
var syscallStacks = filter.Release{Major: 6, Minor: 12}

// namedEvents returns the indexes in formats of the recorded events that
// pattern names, as Config.Events names them. It fails with ErrConfig for
// a bad pattern or one that names no recorded event.
func namedEvents(fs tracefs.FS, pattern string, formats []*tracefs.Format) ([]int, error) {
	var evs []tracefs.Event
	if !probe.IsProbe(pattern) {
		var err error
		if evs, err = fs.Events(pattern); err != nil && !slices.ContainsFunc(formats, isProbe) {
			return nil, fmt.Errorf("%w: filter for %s: %w", ErrConfig, pattern, err)
		}
	}
	named := map[tracefs.Event]bool{}
	for _, e := range evs {
		named[e] = true
	}
	var keys []int
	for i, f := range formats {
		if named[tracefs.Event{System: f.System, Name: f.Name}] || isProbe(f) && probeMatches(pattern, f) {
			keys = append(keys, i)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: filter for %s: no recorded event matches it", ErrConfig, pattern)
	}
	return keys, nil
}

// parseFilter returns expr parsed against the event of format f as the
// running kernel would parse it: the syntax its release has, and
// FIELD.function names resolved in its symbol table (read on the first
// such name).
func parseFilter(expr string, f *tracefs.Format) (*filter.Filter, error) {
	return filter.ParseOptions(expr, f, filter.Options{Symbols: &kernelSymbols, Kernel: runningRelease()})
}

// runningRelease returns the running kernel's release, or the zero
// Release (the newest kernel) when uname's cannot be read.
var runningRelease = sync.OnceValue(func() filter.Release {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return filter.Release{}
	}
	r, ok := filter.ParseRelease(unix.ByteSliceToString(u.Release[:]))
	if !ok {
		return filter.Release{}
	}
	return r
})

// kernelSymbols is the running kernel's symbol table, read once, when a
// filter first names a function.
var kernelSymbols lazySymbols

// lazySymbols is a kallsyms.Table read on its first use; a table that
// cannot be read has no symbols.
type lazySymbols struct {
	once sync.Once
	tab  *kallsyms.Table
}

func (l *lazySymbols) table() *kallsyms.Table {
	l.once.Do(func() { l.tab, _ = kallsyms.Read() })
	return l.tab
}

// Lookup returns the start and end of the kernel function name.
func (l *lazySymbols) Lookup(name string) (start, end uint64, ok bool) {
	if t := l.table(); t != nil {
		return t.Lookup(name)
	}
	return 0, 0, false
}

// Containing returns the start and end of the kernel function that
// holds addr.
func (l *lazySymbols) Containing(addr uint64) (start, end uint64, ok bool) {
	if t := l.table(); t != nil {
		return t.Containing(addr)
	}
	return 0, 0, false
}
