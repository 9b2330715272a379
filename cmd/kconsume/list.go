package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path"

	"github.com/kconsume/kconsume/consumer"
)

func list(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("list", "list [PATTERN]\n\nLists the tracepoints and synthetic events PATTERN matches (default all):\nsystem:name, globs allowed; synthetic events are synthetic:NAME.", "kconsume list 'sched:*'", stderr)
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
