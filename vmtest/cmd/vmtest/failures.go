package main

import (
	"fmt"
	"strings"
)

// Limits of a failureLog: the log lines kept after each "--- FAIL", and
// the lines kept in all, so that a guest whose every test fails still
// leaves a summary a reader can take in.
const (
	failureDetail = 4
	failureLines  = 40
)

// failureLog keeps, from one guest's console, the lines that say what
// failed and why: go test's "--- FAIL" lines with the first lines of
// each one's log, panics (a test binary's timeout among them), and the
// suite script's FAIL line for each package. With -v a test's log comes
// before its "--- FAIL" line, after its "=== RUN": the first lines of it
// are held until the test ends, and kept if it failed.
type failureLog struct {
	kept    []string
	dropped int
	detail  int      // log lines still to keep after the last "--- FAIL"
	held    []string // log lines since the last "=== RUN" line (-v)
	running bool     // a "=== RUN" or "=== CONT" line came, and no "--- " since
}

// add looks at one console line, with or without its newline.
func (f *failureLog) add(line string) {
	line = strings.TrimRight(line, "\r\n")
	trimmed := strings.TrimLeft(line, " \t")
	switch {
	case strings.HasPrefix(line, "=== RUN") || strings.HasPrefix(line, "=== CONT"):
		f.running, f.held = true, nil
	case strings.HasPrefix(trimmed, "--- "):
		f.running = false
	case f.running && trimmed != line && len(f.held) < failureDetail:
		f.held = append(f.held, line)
	}
	switch {
	case strings.HasPrefix(trimmed, "--- FAIL"):
		f.keep(line)
		for _, l := range f.held {
			f.keep(l)
		}
		f.held = nil
		f.detail = failureDetail
		return
	case strings.HasPrefix(line, "panic:"):
		// A timeout's panic names the tests still running on the next
		// two lines.
		f.detail = 2
	case strings.HasPrefix(line, "FAIL "):
		f.detail = 0
	case f.detail > 0 && trimmed != line && !strings.HasPrefix(trimmed, "--- "):
		// go test indents a test's log under its "--- FAIL" line.
		f.detail--
	default:
		f.detail = 0
		return
	}
	f.keep(line)
}

func (f *failureLog) keep(line string) {
	if len(f.kept) == failureLines {
		f.dropped++
		return
	}
	f.kept = append(f.kept, line)
}

// lines returns the kept lines, and a last line counting those left out.
func (f *failureLog) lines() []string {
	if f.dropped == 0 {
		return f.kept
	}
	return append(f.kept[:len(f.kept):len(f.kept)], fmt.Sprintf("(%d more lines in the console above)", f.dropped))
}
