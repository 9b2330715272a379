package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/tracefs"
)

func list(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("list", "list [-v] [PATTERN]\n\nLists the tracepoints and synthetic events PATTERN matches (default all):\nsystem:name, globs allowed; synthetic events are synthetic:NAME.\nuprobe:PATH[:GLOB] lists the functions of an ELF file a uprobe can name,\nusdt:PATH[:PROVIDER[:NAME]] its USDT probes (globs allowed);\nkprobe:GLOB the kernel functions kprobes can name (available_filter_functions),\nfentry:GLOB those of the kernel's BTF.", "kconsume list -v sched:sched_switch", stderr)
	verbose := fs.Bool("v", false, "also list each tracepoint's fields, which -f expressions compare (docs/filters.md), and an fentry or fexit probe's arguments")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	pattern := "*:*"
	switch fs.NArg() {
	case 0:
	case 1:
		pattern = fs.Arg(0)
	default:
		return usageError{fmt.Errorf("want at most one pattern, got %d", fs.NArg())}
	}
	if kind, rest, ok := strings.Cut(pattern, ":"); ok && (kind == "uprobe" || kind == "uretprobe") {
		return listProbes(stdout, kind, rest)
	} else if ok && kind == "usdt" {
		return listUSDT(stdout, rest)
	} else if ok && (kind == "kprobe" || kind == "kretprobe" || kind == "fentry" || kind == "fexit") {
		return listFunctions(stdout, stderr, kind, rest, *verbose)
	}
	t, err := needTracefs("list", stderr)
	if err != nil {
		return err
	}
	evs, err := t.Events(pattern)
	if err != nil {
		return usageError{err}
	}
	for _, e := range evs {
		fmt.Fprintln(stdout, e)
		if *verbose {
			if err := listFields(stdout, t, e); err != nil {
				return err
			}
		}
	}
	defs, err := synthStore.List()
	if err != nil {
		return err
	}
	n := len(evs)
	for _, d := range defs {
		full := consumer.SynthSystem + ":" + d.Name
		if ok, _ := path.Match(pattern, full); ok || pattern == d.Name {
			fmt.Fprintf(stdout, "%s\t%s\n", full, d)
			n++
		}
	}
	if n == 0 {
		return usageError{fmt.Errorf("no tracepoint or synthetic event matches %q", pattern)}
	}
	return nil
}

// listFields prints the fields of tracepoint e a filter expression can
// name: the record's, common ones first, with their C types, and the
// pseudo fields the kernel's filters add.
func listFields(w io.Writer, t tracefs.FS, e tracefs.Event) error {
	f, err := t.Format(e)
	if err != nil {
		return err
	}
	for _, fl := range f.All() {
		typ := fl.Type
		switch {
		case fl.Loc != tracefs.Inline:
			typ = "__data_loc " + typ + "[]"
		case fl.ArrayLen > 0:
			typ = fmt.Sprintf("%s[%d]", typ, fl.ArrayLen)
		}
		fmt.Fprintf(w, "\t%-24s %s\n", fl.Name, typ)
	}
	fmt.Fprintf(w, "\t%-24s %s\n", "COMM (comm)", "the task's name, a string")
	fmt.Fprintf(w, "\t%-24s %s\n", "CPU (cpu, common_cpu)", "the CPU, an int")
	return nil
}

// listProbes prints the functions of the ELF file in rest
// ("PATH[:GLOB]") that a probe of kind can name, as -e takes them.
func listProbes(w io.Writer, kind, rest string) error {
	file, glob := rest, "*"
	if i := strings.LastIndexByte(rest, ':'); i > 0 {
		file, glob = rest[:i], rest[i+1:]
	}
	names, err := probe.Functions(file, glob)
	if err != nil {
		return usageError{err}
	}
	if len(names) == 0 {
		return usageError{fmt.Errorf("no function of %s matches %q", file, glob)}
	}
	for _, n := range names {
		fmt.Fprintf(w, "%s:%s:%s\n", kind, file, n)
	}
	return nil
}

// listUSDT prints the USDT probes of the ELF file in rest
// ("PATH[:PROVIDER[:NAME]]", globs allowed), as -e takes them.
func listUSDT(w io.Writer, rest string) error {
	file, pattern := rest, "*:*"
	if i := strings.IndexByte(rest, ':'); i > 0 {
		file, pattern = rest[:i], rest[i+1:]
		if !strings.Contains(pattern, ":") {
			pattern += ":*"
		}
	}
	names, err := probe.ListUSDT(file, pattern)
	if err != nil {
		return usageError{err}
	}
	if len(names) == 0 {
		return usageError{fmt.Errorf("no USDT probe of %s matches %q", file, pattern)}
	}
	for _, n := range names {
		fmt.Fprintln(w, n)
	}
	return nil
}

// listFunctions prints the kernel functions matching glob that a probe
// of kind can name: the traceable ones for kprobes, those of the BTF
// for fentry and fexit.
func listFunctions(w, stderr io.Writer, kind, glob string, verbose bool) error {
	var names []string
	var err error
	if kind == "fentry" || kind == "fexit" {
		names, err = probe.BTFFunctions(glob)
	} else {
		t, terr := needTracefs("list", stderr)
		if terr != nil {
			return terr
		}
		var all []string
		if all, err = probe.TraceableFunctions(t.Root); err == nil {
			names = matchAll(all, glob)
		}
	}
	if err != nil {
		return usageError{err}
	}
	if len(names) == 0 {
		return usageError{fmt.Errorf("no kernel function matches %q", glob)}
	}
	for _, n := range names {
		fmt.Fprintf(w, "%s:%s\n", kind, n)
		if verbose && (kind == "fentry" || kind == "fexit") {
			// The fields the probe records by default, typed from BTF.
			p, err := probe.Parse(kind + ":" + n)
			if err != nil {
				fmt.Fprintf(w, "\t(%v)\n", err)
				continue
			}
			for _, a := range p.Args {
				fmt.Fprintf(w, "\t%-24s %s\n", a.Name, a.Type.Name)
			}
		}
	}
	return nil
}

// matchAll returns the names of all that match glob, sorted, each once.
func matchAll(all []string, glob string) []string {
	var out []string
	for _, n := range all {
		if ok, _ := path.Match(glob, n); ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
