package probe

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// Functions returns the names of the functions of the ELF file at file
// that a uprobe can name, those of its .symtab and .dynsym defined in
// it, which match the glob pattern, sorted, each once. It fails when the
// file cannot be read, is not ELF or pattern is malformed.
func Functions(file, pattern string) ([]string, error) {
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, fmt.Errorf("pattern %q: %w", pattern, err)
	}
	f, err := elf.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	var names []string
	for _, read := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, err := read()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || s.Name == "" {
				continue
			}
			if ok, _ := path.Match(pattern, s.Name); ok {
				names = append(names, s.Name)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// IsGlob reports whether a probe spec's function is a glob (vfs_*): a
// kprobe, kretprobe, fentry or fexit on every function it matches.
func IsGlob(spec string) bool {
	_, ok := GlobName(spec)
	return ok
}

// GlobName returns the events a glob spec (IsGlob) makes, as a glob of
// their full names (kprobes:vfs_*, fprobes:tcp_*__return), and whether
// spec is such a glob.
func GlobName(spec string) (string, bool) {
	point, _, _ := strings.Cut(strings.TrimSpace(spec), " ")
	kind, glob, _ := strings.Cut(point, ":")
	k := slices.Index(kindNames[:], kind)
	if k < 0 || !strings.ContainsAny(glob, "*?[") {
		return "", false
	}
	p := &Probe{Kind: Kind(k)}
	switch p.Kind {
	case Kprobe, Fentry:
	case Kretprobe, Fexit:
		glob += "__return"
	default:
		return "", false
	}
	return p.System() + ":" + glob, true
}

// Expand parses spec, and where its function is a glob (IsGlob) one
// probe for each function it matches, with the same arguments: the
// kernel's traceable functions (kprobeFuncs, available_filter_functions)
// for kprobes, those of its BTF for fentry and fexit. Probes made from
// one glob share Group. It fails when spec does not parse, the glob
// matches nothing or more than MaxGlob functions, or a function's
// arguments do not parse (naming it).
func Expand(spec string, kprobeFuncs func() ([]string, error)) ([]*Probe, error) {
	if !IsGlob(spec) {
		p, err := Parse(spec)
		if err != nil {
			return nil, err
		}
		return []*Probe{p}, nil
	}
	words := strings.Fields(spec)
	kind, glob, _ := strings.Cut(words[0], ":")
	var names []string
	var err error
	if kind == "fentry" || kind == "fexit" {
		names, err = BTFFunctions(glob)
	} else {
		names, err = matchFuncs(kprobeFuncs, glob)
	}
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrSyntax, words[0], err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w %q: no function matches (kconsume list '%s')", ErrSyntax, words[0], words[0])
	}
	if len(names) > MaxGlob {
		return nil, fmt.Errorf("%w %q: %d functions match, at most %d: narrow the glob", ErrSyntax, words[0], len(names), MaxGlob)
	}
	var out []*Probe
	for _, n := range names {
		p, err := Parse(strings.Join(append([]string{kind + ":" + n}, words[1:]...), " "))
		if err != nil {
			return nil, err
		}
		p.Group = words[0]
		out = append(out, p)
	}
	return out, nil
}

// MaxGlob is the most functions one glob may probe.
const MaxGlob = 1000

// matchFuncs returns the functions of list that match glob, sorted,
// each once.
func matchFuncs(list func() ([]string, error), glob string) ([]string, error) {
	if _, err := path.Match(glob, ""); err != nil {
		return nil, fmt.Errorf("pattern %q: %w", glob, err)
	}
	all, err := list()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range all {
		if ok, _ := path.Match(glob, f); ok {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// BTFFunctions returns the kernel functions of its BTF whose names match
// glob, sorted: those fentry and fexit may name.
func BTFFunctions(glob string) ([]string, error) {
	return matchFuncs(func() ([]string, error) {
		spec, err := KernelBTF()
		if err != nil {
			return nil, fmt.Errorf("the kernel's BTF: %w", err)
		}
		var out []string
		for t, err := range spec.All() {
			if err != nil {
				return nil, err
			}
			if fn, ok := t.(*btf.Func); ok {
				out = append(out, fn.Name)
			}
		}
		return out, nil
	}, glob)
}

// TraceableFunctions reads the kernel's available_filter_functions file
// (root is tracefs's mount): the functions kprobes may name.
func TraceableFunctions(root string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(root, "available_filter_functions"))
	if err != nil {
		return nil, fmt.Errorf("the kernel's traceable functions: %w", err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		// "name" or "name [module]"
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out, nil
}

// KprobeBlacklist is where debugfs shows the kernel's kprobe blacklist:
// the functions kprobes refuse, as a probe there would recurse or break
// the kernel (NOKPROBE_SYMBOL, the kprobes and entry text; kernel/kprobes.c).
const KprobeBlacklist = "/sys/kernel/debug/kprobes/blacklist"

// ReadBlacklist returns the functions of the kprobe blacklist at path
// (KprobeBlacklist where debugfs is mounted). It fails when the file
// cannot be read.
func ReadBlacklist(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the kernel's kprobe blacklist: %w", err)
	}
	out := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		// "0xSTART-0xEND\tname" or "0xSTART-0xEND\tname [module]"
		if f := strings.Fields(l); len(f) >= 2 {
			out[f[1]] = true
		}
	}
	return out, nil
}

// Blacklisted reports whether the kprobe blacklist at path holds
// function sym (ReadBlacklist). It fails when the file cannot be read.
func Blacklisted(path, sym string) (bool, error) {
	bl, err := ReadBlacklist(path)
	return bl[sym], err
}
