package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

func list(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("list", "list [PATTERN]\n\nLists the tracepoints PATTERN matches (default all): system:name, globs allowed.", "kconsume list 'sched:*'", stderr)
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
	t, err := tracefs.Find()
	if err != nil {
		return err
	}
	evs, err := t.Events(pattern)
	if err != nil {
		return usageError{err}
	}
	if len(evs) == 0 {
		return usageError{fmt.Errorf("no tracepoint matches %q", pattern)}
	}
	for _, e := range evs {
		fmt.Fprintln(stdout, e)
	}
	return nil
}
