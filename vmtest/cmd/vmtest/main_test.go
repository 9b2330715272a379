package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestConsoleLogLines: lines of guests writing at once come out whole,
// each under its guest's name, and a write of several lines is split.
func TestConsoleLogLines(t *testing.T) {
	var b strings.Builder
	c := &consoleLog{w: &b}
	var wg sync.WaitGroup
	for _, name := range []string{"5.10", "newest"} {
		w := c.prefixed(name, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				fmt.Fprintf(w, "line %d of %s\n", i, name)
			}
			fmt.Fprintf(w, "a\nb\n")
		}()
	}
	wg.Wait()
	got := map[string]int{}
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "["), "] ")
		if !ok || !strings.HasPrefix(line, "[") {
			t.Fatalf("line %q has no guest's name", line)
		}
		if rest != "a" && rest != "b" && !strings.HasSuffix(rest, " of "+name) {
			t.Fatalf("line %q is not whole, or under another guest's name", line)
		}
		got[name]++
	}
	for _, name := range []string{"5.10", "newest"} {
		if got[name] != 202 {
			t.Errorf("%s: %d lines, want 202", name, got[name])
		}
	}
}
