package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestFailureLog: from a console such as a guest prints, the failure
// log keeps each failed test with the head of its log, panics and the
// suite's FAIL lines, and nothing of the passing tests.
func TestFailureLog(t *testing.T) {
	console := `vmtest: testing example.com/a
PASS
ok   example.com/a 3s
vmtest: testing example.com/b
--- FAIL: TestOne (1.20s)
    one_test.go:10: got 3 events, want 4
    one_test.go:11: second line
        continued
    one_test.go:12: fourth line
    one_test.go:13: fifth line, dropped
--- FAIL: TestTwo (0.00s)
    --- FAIL: TestTwo/sub (0.00s)
        two_test.go:5: sub failed
=== RUN   TestThree
    three_test.go:1: a passing test's log
FAIL
FAIL example.com/b 12s (exit 1)
vmtest: testing example.com/c
panic: test timed out after 15m0s
	running tests:
		TestSlow (15m0s)
FAIL example.com/c 900s (exit 2)
vmtest: failed: example.com/b example.com/c
`
	want := []string{
		"--- FAIL: TestOne (1.20s)",
		"    one_test.go:10: got 3 events, want 4",
		"    one_test.go:11: second line",
		"        continued",
		"    one_test.go:12: fourth line",
		"--- FAIL: TestTwo (0.00s)",
		"    --- FAIL: TestTwo/sub (0.00s)",
		"        two_test.go:5: sub failed",
		"FAIL example.com/b 12s (exit 1)",
		"panic: test timed out after 15m0s",
		"\trunning tests:",
		"\t\tTestSlow (15m0s)",
		"FAIL example.com/c 900s (exit 2)",
	}
	checkFailureLog(t, console, want)
}

// TestFailureLogVerbose: with -v a failed test's log, printed before its
// "--- FAIL" line, is kept under it; a passing test's is not.
func TestFailureLogVerbose(t *testing.T) {
	console := `=== RUN   TestPass
    pass_test.go:3: a passing test's log
--- PASS: TestPass (0.01s)
=== RUN   TestOwnCPU
    e2e_test.go:260: own 103.1 ms, the rest 22.3s
    e2e_test.go:267: a summary line
--- FAIL: TestOwnCPU (31.35s)
=== RUN   TestNext
--- PASS: TestNext (0.00s)
FAIL
FAIL example.com/b 800s (exit 1)
`
	want := []string{
		"--- FAIL: TestOwnCPU (31.35s)",
		"    e2e_test.go:260: own 103.1 ms, the rest 22.3s",
		"    e2e_test.go:267: a summary line",
		"FAIL example.com/b 800s (exit 1)",
	}
	checkFailureLog(t, console, want)
}

// TestFailureLogBounded: a guest whose every test fails leaves at most
// failureLines lines and a count of the rest.
func TestFailureLogBounded(t *testing.T) {
	var f failureLog
	for i := 0; i < 100; i++ {
		f.add(fmt.Sprintf("--- FAIL: Test%d (0.00s)\n", i))
	}
	got := f.lines()
	if len(got) != failureLines+1 || got[failureLines] != "(60 more lines in the console above)" {
		t.Errorf("kept %d lines, last %q", len(got), got[len(got)-1])
	}
}

// checkFailureLog feeds console to a failureLog a line at a time and
// fails t unless it kept want.
func checkFailureLog(t *testing.T, console string, want []string) {
	t.Helper()
	var f failureLog
	for _, line := range strings.SplitAfter(console, "\n") {
		f.add(line)
	}
	if got := f.lines(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("kept:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFailureLogTimeoutStack: after a timeout's panic, the goroutine of
// the test still running is kept, where it waits on top; the other
// goroutines are not.
func TestFailureLogTimeoutStack(t *testing.T) {
	console := `=== RUN   TestStacks
panic: test timed out after 30m0s
	running tests:
		TestStacks (23m54s)

goroutine 40 [running]:
testing.(*M).startAlarm.func1()
	/usr/local/go/src/testing/testing.go:2484 +0x345
created by time.goFunc
	/usr/local/go/src/time/sleep.go:215 +0x2d

goroutine 7 [syscall, 23 minutes]:
syscall.Syscall6(0xf7, 0x1, 0x1c6, 0xc0000c3d78, 0x1000004, 0x0, 0x0)
	/usr/local/go/src/syscall/syscall_linux.go:95 +0x39
os/exec.(*Cmd).Wait(0xc0001c8000)
	/usr/local/go/src/os/exec/exec.go:906 +0x45
example.com/c.TestStacks(0xc000103a00)
	/src/c/stack_test.go:800 +0x5a5
testing.tRunner(0xc000103a00, 0x6b2f48)
	/usr/local/go/src/testing/testing.go:1792 +0xf4

goroutine 9 [chan receive, 23 minutes]:
example.com/c.(*saver).loop(0xc0000ae000)
	/src/c/save.go:70 +0x10
FAIL example.com/c 1801s (exit 2)
`
	want := []string{
		"panic: test timed out after 30m0s",
		"\trunning tests:",
		"\t\tTestStacks (23m54s)",
		"goroutine 7 [syscall, 23 minutes]:",
		"syscall.Syscall6(0xf7, 0x1, 0x1c6, 0xc0000c3d78, 0x1000004, 0x0, 0x0)",
		"\t/usr/local/go/src/syscall/syscall_linux.go:95 +0x39",
		"os/exec.(*Cmd).Wait(0xc0001c8000)",
		"\t/usr/local/go/src/os/exec/exec.go:906 +0x45",
		"example.com/c.TestStacks(0xc000103a00)",
		"\t/src/c/stack_test.go:800 +0x5a5",
		"testing.tRunner(0xc000103a00, 0x6b2f48)",
		"\t/usr/local/go/src/testing/testing.go:1792 +0xf4",
		"FAIL example.com/c 1801s (exit 2)",
	}
	checkFailureLog(t, console, want)
}
