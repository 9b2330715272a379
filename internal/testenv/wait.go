package testenv

import (
	"fmt"
	"os/exec"
	"time"
)

// WaitExit waits for cmd, started, to exit, for d at most: a command
// that does not exit by then is killed. It returns cmd.Wait's error, or
// one naming what and d when the command had to be killed, so that a
// test stuck on a helper process fails saying so instead of running to
// the test binary's timeout.
func WaitExit(cmd *exec.Cmd, d time.Duration, what string) error {
	if cmd.WaitDelay == 0 {
		// A child that keeps the output pipes open must not hold Wait.
		cmd.WaitDelay = 10 * time.Second
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit in %v: killed", what, d)
	}
}
