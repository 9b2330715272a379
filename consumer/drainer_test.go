package consumer

import (
	"errors"
	"testing"
	"time"
)

// TestCommandAfterClose checks that a command sent to a closed session's
// drainer fails with ErrClosed instead of waiting for a reply that never
// comes, and that a sleeping drainer (latency a minute) answers a command
// at once.
func TestCommandAfterClose(t *testing.T) {
	s, _ := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, Latency: time.Minute})
	start := time.Now()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("flush waited %v for a drainer asleep for a minute", d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var err error
		for range 20 {
			if err = s.Flush(); !errors.Is(err, ErrClosed) {
				break
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("flush after close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("flush after close hangs")
	}
}
