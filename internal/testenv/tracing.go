package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SaveTracing records the tracefs settings trace-cmd changes and returns
// a function that puts them back, so a benchmark that runs trace-cmd
// leaves the host's tracing state as it found it.
func SaveTracing(b testing.TB) func() {
	b.Helper()
	root := "/sys/kernel/tracing"
	files := []string{"tracing_on", "buffer_size_kb", "current_tracer", "trace_clock"}
	saved := map[string]string{}
	for _, f := range files {
		v, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			b.Fatal(err)
		}
		s := strings.TrimSpace(string(v))
		switch f {
		case "buffer_size_kb":
			// "7 (expanded: 1408)": the ring buffer was never used, and
			// its first user grows it to 1408 KiB (tracing_entries_read
			// in kernel/trace/trace.c). trace-cmd does grow it; writing
			// back 7 would leave the next user 7 KiB, so 1408 it is.
			if _, exp, ok := strings.Cut(s, "(expanded: "); ok {
				s = strings.TrimSuffix(exp, ")")
			}
		case "trace_clock":
			if i := strings.Index(s, "["); i >= 0 {
				s = s[i+1 : strings.Index(s, "]")]
			}
		}
		saved[f] = s
	}
	return func() {
		for _, f := range []string{"current_tracer", "trace_clock", "buffer_size_kb", "tracing_on"} {
			if err := os.WriteFile(filepath.Join(root, f), []byte(saved[f]), 0); err != nil {
				b.Errorf("restoring %s: %v", f, err)
			}
		}
	}
}
