// Package probe reads dynamic probe events as record's -e takes them:
// a probe point in bpftrace's spelling (uprobe:PATH:SYMBOL) and its
// fetch arguments in the kernel's own syntax for kprobe_events and
// uprobe_events (Documentation/trace/uprobetracer.rst), and lays out
// their records as the kernel lays out those of its own probe events
// (kernel/trace/trace_uprobe.c), so that a trace of either reads alike.
package probe

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// ErrSyntax wraps every error of Parse.
var ErrSyntax = errors.New("probe")

// Kind is a probe's kind.
type Kind uint8

const (
	// Uprobe fires when a process executes an instruction of a file.
	Uprobe Kind = iota
	// Uretprobe fires when a function of a file returns.
	Uretprobe
	// Kprobe fires when the kernel executes an instruction of a
	// function.
	Kprobe
	// Kretprobe fires when a kernel function returns.
	Kretprobe
	// Usdt fires at the sites of a user program's static probe.
	Usdt
	// Fentry fires when a kernel function is called, through its BPF
	// trampoline, with its arguments typed from BTF.
	Fentry
	// Fexit fires when it returns.
	Fexit
)

var kindNames = [...]string{Uprobe: "uprobe", Uretprobe: "uretprobe", Kprobe: "kprobe", Kretprobe: "kretprobe", Usdt: "usdt", Fentry: "fentry", Fexit: "fexit"}

func (k Kind) String() string { return kindNames[k] }

// Return reports whether k fires on return.
func (k Kind) Return() bool { return k == Uretprobe || k == Kretprobe || k == Fexit }

// Tracing reports whether k is recorded by a BPF trampoline (fentry,
// fexit) rather than a kprobe or uprobe.
func (k Kind) Tracing() bool { return k == Fentry || k == Fexit }

// User reports whether k probes a user program.
func (k Kind) User() bool { return k == Uprobe || k == Uretprobe || k == Usdt }

// SystemFprobes is the trace event system of fentry and fexit probes,
// ftrace's name for its own fprobe events.
const SystemFprobes = "fprobes"

// System returns the trace event system of p's events: ftrace's own
// group for them, or perf's for a USDT probe (sdt_PROVIDER).
func (p *Probe) System() string {
	switch {
	case p.Kind == Usdt:
		return "sdt_" + p.Provider
	case p.Kind.User():
		return "uprobes"
	case p.Kind.Tracing():
		return SystemFprobes
	}
	return "kprobes"
}

// IsSystem reports whether system is one of the probes' systems.
func IsSystem(system string) bool {
	return system == "uprobes" || system == "kprobes" || system == SystemFprobes || strings.HasPrefix(system, "sdt_")
}

// IsProbe reports whether s names a probe rather than a tracepoint.
func IsProbe(s string) bool {
	for _, n := range kindNames {
		if strings.HasPrefix(s, n+":") {
			return true
		}
	}
	return false
}

// Probe is one probe event: where it fires and what it records.
type Probe struct {
	Kind Kind
	// Path is the ELF file a uprobe is in; Symbol the function (of the
	// file, or of the kernel), Offset bytes into it.
	Path   string
	Symbol string
	Offset uint64
	// Name is the event's name: the symbol, with "__return" after it
	// for a return probe (perf probe's names), or a USDT probe's name.
	Name string
	// Provider is a USDT probe's provider; Sites are its sites in the
	// file, one uprobe each.
	Provider string
	Sites    []Note
	// Group is the glob this probe was made from (Expand), "" for none.
	Group string
	Args  []Arg
	// Spec is the text Parse read.
	Spec string
}

// FullName returns "system:name".
func (p *Probe) FullName() string { return p.System() + ":" + p.Name }

// Parse reads a probe: uprobe:PATH:SYMBOL[+OFFSET],
// uretprobe:PATH:SYMBOL, kprobe:FUNCTION[+OFFSET] or kretprobe:FUNCTION,
// followed by fetch arguments, separated by blanks, each
// [NAME=]FETCHARG[:TYPE] as uprobe_events and kprobe_events take them;
// usdt:PATH:PROVIDER:NAME, whose arguments its note gives; or
// fentry:FUNCTION and fexit:FUNCTION, whose arguments are the
// function's, typed from the kernel's BTF (parseFentry). It fails, wrapping ErrSyntax and naming
// what is wrong, on anything else.
func Parse(spec string) (*Probe, error) {
	words := strings.Fields(spec)
	if len(words) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrSyntax)
	}
	p := &Probe{Spec: strings.Join(words, " ")}
	point := words[0]
	kind, rest, ok := strings.Cut(point, ":")
	k := slices.Index(kindNames[:], kind)
	if !ok || k < 0 {
		return nil, fmt.Errorf("%w %q: want uprobe:PATH:SYMBOL, uretprobe:PATH:SYMBOL, kprobe:FUNCTION or kretprobe:FUNCTION", ErrSyntax, point)
	}
	p.Kind = Kind(k)
	p.Symbol = rest
	if p.Kind == Usdt {
		return parseUSDT(p, point, rest, len(words) > 1)
	}
	if p.Kind.Tracing() {
		if !validName(p.Symbol) {
			return nil, fmt.Errorf("%w %q: function %q: want a C identifier", ErrSyntax, point, p.Symbol)
		}
		return parseFentry(p, point, words[1:])
	}
	if p.Kind.User() {
		i := strings.LastIndexByte(rest, ':')
		if i <= 0 || i == len(rest)-1 {
			return nil, fmt.Errorf("%w %q: want %s:PATH:SYMBOL", ErrSyntax, point, kind)
		}
		p.Path, p.Symbol = rest[:i], rest[i+1:]
		if !strings.HasPrefix(p.Path, "/") {
			return nil, fmt.Errorf("%w %q: the path %q is not absolute", ErrSyntax, point, p.Path)
		}
	}
	if sym, off, ok := strings.Cut(p.Symbol, "+"); ok {
		n, err := strconv.ParseUint(off, 0, 64)
		if err != nil {
			return nil, fmt.Errorf("%w %q: offset %q: want a number", ErrSyntax, point, off)
		}
		if p.Kind.Return() && n != 0 {
			return nil, fmt.Errorf("%w %q: a return probe takes no offset", ErrSyntax, point)
		}
		p.Symbol, p.Offset = sym, n
	}
	if !validName(p.Symbol) {
		return nil, fmt.Errorf("%w %q: symbol %q: want a C identifier", ErrSyntax, point, p.Symbol)
	}
	p.Name = p.Symbol
	if p.Kind.Return() {
		p.Name += "__return"
	}
	seen := map[string]bool{}
	for n, w := range words[1:] {
		a, err := parseArg(w, n+1, p.Kind)
		if name, _, _ := strings.Cut(w, ":"); err != nil && validName(name) && !strings.Contains(w, "=") && p.Kind == Kprobe && p.Offset == 0 {
			// A parameter by its name, as kprobe_events takes it with
			// BTF (Linux 6.6): where the function's BTF knows it.
			a, err = btfParamArg(p.Symbol, w)
		}
		if err != nil {
			return nil, fmt.Errorf("%w %q: argument %q: %w", ErrSyntax, point, w, err)
		}
		if seen[a.Name] || reserved(a.Name) {
			return nil, fmt.Errorf("%w %q: argument name %q is taken", ErrSyntax, point, a.Name)
		}
		seen[a.Name] = true
		p.Args = append(p.Args, a)
	}
	if len(p.Args) > MaxArgs {
		return nil, fmt.Errorf("%w %q: %d arguments, at most %d", ErrSyntax, point, len(p.Args), MaxArgs)
	}
	return p, nil
}

// parseUSDT reads the rest of a USDT probe, PATH:PROVIDER:NAME, and its
// arguments from the file's notes.
func parseUSDT(p *Probe, point, rest string, args bool) (*Probe, error) {
	i := strings.LastIndexByte(rest, ':')
	j := -1
	if i > 0 {
		j = strings.LastIndexByte(rest[:i], ':')
	}
	if j <= 0 || i == len(rest)-1 {
		return nil, fmt.Errorf("%w %q: want usdt:PATH:PROVIDER:NAME", ErrSyntax, point)
	}
	p.Path, p.Provider, p.Symbol = rest[:j], rest[j+1:i], rest[i+1:]
	if !strings.HasPrefix(p.Path, "/") {
		return nil, fmt.Errorf("%w %q: the path %q is not absolute", ErrSyntax, point, p.Path)
	}
	if !validName(p.Provider) || !validName(p.Symbol) {
		return nil, fmt.Errorf("%w %q: want a C identifier for the provider and the name", ErrSyntax, point)
	}
	if args {
		return nil, fmt.Errorf("%w %q: a USDT probe's arguments come from its note, arg1 to argN", ErrSyntax, point)
	}
	p.Name = p.Symbol
	if err := p.resolveUSDT(); err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrSyntax, point, err)
	}
	return p, nil
}

// MaxArgs is the most fetch arguments a probe takes
// (MAX_TRACE_ARGS of kernel/trace/trace_probe.h is 128; the recorder's
// programs walk at most this many).
const MaxArgs = 12

// reserved reports whether name is one of the fields every probe event
// has.
func reserved(name string) bool {
	return strings.HasPrefix(name, "common_") || strings.HasPrefix(name, "__probe_")
}

// validName reports whether s is a C identifier, as the kernel wants
// event and argument names (is_good_name).
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// Format returns the trace event format of p's records, as the kernel
// writes that of its own probe event (trace_uprobe.c:
// uprobe_event_define_fields, trace_kprobe.c: kprobe_event_define_fields): the common fields, __probe_ip (or, for a
// return probe, __probe_func and __probe_ret_ip), then each argument at
// its size, strings as __data_loc fields. common holds the common
// fields, as this kernel's formats have them; id is the event's id.
func (p *Probe) Format(common []tracefs.Field, id uint32) *tracefs.Format {
	f := &tracefs.Format{System: p.System(), Name: p.Name, ID: id, Common: common}
	off := 0
	for _, c := range common {
		off = max(off, c.Offset+c.Size)
	}
	off = (off + 7) &^ 7
	ips := []string{"__probe_ip"}
	switch {
	case p.Kind == Fexit:
		// A trampoline knows the function, not where it returns to.
		ips = []string{"__probe_func"}
	case p.Kind.Return():
		ips = []string{"__probe_func", "__probe_ret_ip"}
	}
	for _, n := range ips {
		f.Fields = append(f.Fields, tracefs.Field{Name: n, Type: "unsigned long", Offset: off, Size: 8})
		off += 8
	}
	for _, a := range p.Args {
		fl := tracefs.Field{Name: a.Name, Type: a.Type.Name, Offset: off, Size: a.Type.Size, Signed: a.Type.Signed}
		if a.Type.String {
			fl.Type, fl.Loc, fl.ArrayLen, fl.Size, fl.Signed = "char", tracefs.DataLoc, -1, 4, true
		}
		f.Fields = append(f.Fields, fl)
		off += fl.Size
	}
	return f
}

// Common returns the common fields of every trace record, struct
// trace_entry of include/linux/trace_events.h: the recorder's ring
// records assume this layout (bpf/kc/event.h).
func Common() []tracefs.Field {
	return []tracefs.Field{
		{Name: "common_type", Type: "unsigned short", Offset: 0, Size: 2},
		{Name: "common_flags", Type: "unsigned char", Offset: 2, Size: 1},
		{Name: "common_preempt_count", Type: "unsigned char", Offset: 3, Size: 1},
		{Name: "common_pid", Type: "int", Offset: 4, Size: 4, Signed: true},
	}
}
