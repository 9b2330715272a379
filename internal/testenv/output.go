package testenv

import (
	"bytes"
	"sync"
)

// Output collects a running command's output (its Stdout or Stderr) for
// a test that reads it meanwhile; the zero value is ready.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String returns what was written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
