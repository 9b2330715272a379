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
// suite script's FAIL line for each package.
type failureLog struct {
	kept    []string
	dropped int
	detail  int // log lines still to keep after the last "--- FAIL"
}

// add looks at one console line, with or without its newline.
func (f *failureLog) add(line string) {
	line = strings.TrimRight(line, "\r\n")
	trimmed := strings.TrimLeft(line, " \t")
	switch {
	case strings.HasPrefix(trimmed, "--- FAIL"):
		f.detail = failureDetail
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
