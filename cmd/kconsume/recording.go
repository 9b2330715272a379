package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/control"
)

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// recorder runs a session to its end and reports on it.
type recorder struct {
	s              *consumer.Session
	srv            *control.Server
	stdout, stderr io.Writer
	start          time.Time
	live           bool
	relay          *relaydOut
	lastRecords    uint64
	lastTick       time.Time
	cmdNice        int // the command's nice value: kconsume's before it raised its own
}

// run records until a signal, the duration, the command's exit or a
// channel failure (a full disk), then closes the session so every file is
// whole, and prints the summary. It returns the command's exit status as
// an exitError when the command failed.
func (r *recorder) run(command []string, duration time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	// Setting up allocated the channel's buffers and the BPF objects'
	// specs: collect that garbage and hand its pages back now, or the
	// collector's workers and the runtime's scavenger would run after the
	// gate opens and put the recorder's own context switches and
	// madvise calls into the trace.
	debug.FreeOSMemory()
	if err := r.s.Start(); err != nil {
		r.s.Close()
		return err
	}
	_ = r.srv.Refresh()
	var cmd *exec.Cmd
	cmdDone := make(chan error, 1)
	if len(command) > 0 {
		cmd = exec.Command(command[0], command[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := startAtNice(cmd, r.cmdNice); err != nil {
			r.s.Close()
			return fmt.Errorf("starting %s: %w", command[0], err)
		}
		go func() { cmdDone <- cmd.Wait() }()
	}
	// The live status line, and a stream to relayd (whose loss and
	// reconnection it reports), tick every second; without them, the
	// control directory is refreshed after the drainer ran for data, at
	// most once a second, so an idle recording wakes nothing here.
	var tick <-chan time.Time
	if r.live || r.relay.enabled() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		tick = t.C
	}
	r.lastTick = r.start
	lastRefresh := time.Now()
	var later *time.Timer
	var refreshLater <-chan time.Time
	var cmdErr, failure error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case cmdErr = <-cmdDone:
			cmd = nil
			break loop
		case <-r.s.Channel().Failed():
			failure = r.s.Channel().Err()
			break loop
		case <-tick:
			_ = r.srv.Refresh()
			lastRefresh = time.Now()
			r.relay.poll(r.stderr, r.live)
			if r.live {
				r.status()
			}
		case <-r.s.Activity():
			if refreshLater != nil || tick != nil {
				continue
			}
			if wait := time.Second - time.Since(lastRefresh); wait > 0 {
				later = time.NewTimer(wait)
				refreshLater = later.C
				continue
			}
			_ = r.srv.Refresh()
			lastRefresh = time.Now()
		case <-refreshLater:
			refreshLater = nil
			_ = r.srv.Refresh()
			lastRefresh = time.Now()
		}
	}
	if later != nil {
		later.Stop()
	}
	if r.live {
		fmt.Fprint(r.stderr, "\r\033[K")
	}
	if cmd != nil {
		// Stopped by a signal or the duration: the command goes on.
		fmt.Fprintf(r.stderr, "kconsume record: stopped; %s (pid %d) keeps running\n", cmd.Path, cmd.Process.Pid)
	}
	closeErr := r.s.Close()
	stats, _ := r.s.Stats()
	r.summary(stats, r.s.Drainer())
	if failure == nil {
		failure = closeErr
	}
	if failure != nil {
		if errors.Is(failure, syscall.ENOSPC) {
			return fmt.Errorf("disk full: recording stopped; every file in the trace is whole and readable: %w", failure)
		}
		return fmt.Errorf("recording stopped: %w", failure)
	}
	var ee *exec.ExitError
	if errors.As(cmdErr, &ee) {
		return exitError{ee.ExitCode()}
	}
	return cmdErr
}

// exitError carries the traced command's exit status out of run.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }
