package main

import (
	"fmt"
	"slices"
	"strings"
)

// Limits of a failureLog: the log lines kept after each "--- FAIL", and
// the lines kept in all, so that a guest whose every test fails still
// leaves a summary a reader can take in.
const (
	failureDetail = 4
	failureLines  = 40
	// failureStack bounds the stack kept of a test that timed out.
	failureStack = 16
)

// failureLog keeps, from one guest's console, the lines that say what
// failed and why: go test's "--- FAIL" lines with the first lines of
// each one's log, panics (a test binary's timeout among them), and the
// suite script's FAIL line for each package. With -v a test's log comes
// before its "--- FAIL" line, after its "=== RUN": the first lines of it
// are held until the test ends, and kept if it failed. After a
// timeout's panic, the goroutine of each test still running is kept too
// (its first failureStack lines): it says where the test waits.
type failureLog struct {
	kept    []string
	dropped int
	detail  int      // log lines still to keep after the last "--- FAIL"
	held    []string // log lines since the last "=== RUN" line (-v)
	running bool     // a "=== RUN" or "=== CONT" line came, and no "--- " since
	// timedOut holds the tests a timeout's panic named as running;
	// stack, the lines of the goroutine being read after it.
	timedOut []string
	stack    []string
	inPanic  bool
}

// add looks at one console line, with or without its newline.
func (f *failureLog) add(line string) {
	line = strings.TrimRight(line, "\r\n")
	trimmed := strings.TrimLeft(line, " \t")
	if f.inPanic && f.goroutine(line, trimmed) {
		return
	}
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
		// lines, a tab-indented line each after "running tests:".
		f.detail = 2
		f.inPanic = strings.HasPrefix(line, "panic: test timed out")
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

// goroutine reads the lines after a timeout's panic: it notes the tests
// it names as running, and keeps the goroutine of each (the one whose
// frames call the test's function). It returns whether it took the line.
func (f *failureLog) goroutine(line, trimmed string) bool {
	switch {
	case strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "exit status") || strings.HasPrefix(line, "vmtest:"):
		// The dump is over: the suite's lines follow.
		if f.stack != nil {
			f.endGoroutine()
		}
		f.inPanic = false
		return false
	case strings.HasPrefix(line, "\t\t") && strings.HasPrefix(trimmed, "Test"):
		name, _, _ := strings.Cut(trimmed, " ")
		name, _, _ = strings.Cut(name, "/") // a subtest runs in a function literal of its test's
		f.timedOut = append(f.timedOut, name)
		f.detail++ // kept below, as the panic's other lines
		return false
	case strings.HasPrefix(line, "goroutine "):
		f.stack = []string{line}
		return true
	case f.stack != nil && line != "":
		f.stack = append(f.stack, line)
		return true
	case f.stack != nil:
		f.endGoroutine()
		return true
	}
	return false
}

// endGoroutine keeps the goroutine just read if it runs a test that
// timed out, at most failureStack lines of it.
func (f *failureLog) endGoroutine() {
	st := f.stack
	f.stack = nil
	for _, name := range f.timedOut {
		if !slices.ContainsFunc(st, func(l string) bool { return strings.Contains(l, "."+name+"(") }) {
			continue
		}
		if len(st) > failureStack {
			st = append(st[:failureStack:failureStack], "\t...")
		}
		for _, l := range st {
			f.keep(l)
		}
		return
	}
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
