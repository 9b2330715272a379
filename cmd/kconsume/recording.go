package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/internal/timerfd"
)

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// recorder runs a session to its end and reports on it.
type recorder struct {
	s              *consumer.Session
	srv            *control.Server
	h              *handler
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
	// The duration and the refresh below wait on timerfds, not Go
	// timers: a Go timer wakes the runtime's sysmon thread when due,
	// which then polls every 20 µs until the timer has run, tens of the
	// recorder's own context switches in its trace.
	var ends <-chan struct{}
	if duration > 0 {
		t, err := timerfd.New()
		if err == nil {
			err = t.Reset(duration)
		}
		if err != nil {
			r.s.Close()
			return err
		}
		defer t.Close()
		ends = t.C()
	}
	later, err := timerfd.New()
	if err != nil {
		r.s.Close()
		return err
	}
	defer later.Close()
	// Setting up allocated the channel's buffers and the BPF objects'
	// specs: collect that garbage and hand its pages back now, or the
	// collector's workers and the runtime's scavenger would run after the
	// gate opens and put the recorder's own context switches and
	// madvise calls into the trace.
	//
	// One P while it does: the collection's end wakes the runtime's
	// background scavenger, which on a second P would race the call to
	// return pages, and having returned any, sleeps a second
	// (runtime/mgcscavenge.go: 1 ms of work at a ratio of 0.001) and
	// wakes into the trace, sysmon polling with it. On one P it runs
	// after the call has returned everything, finds nothing and parks.
	procs := runtime.GOMAXPROCS(1)
	debug.FreeOSMemory()
	runtime.GOMAXPROCS(procs)
	// The control directory is written before the gate opens, all but
	// its state, which must not say running before the programs record;
	// after it, only the state file changes, written by this thread
	// alone.
	_ = r.srv.Refresh()
	var cmd *exec.Cmd
	var release func() error
	if len(command) > 0 {
		var err error
		if cmd, release, err = startHeld(command, r.cmdNice); err != nil {
			r.s.Close()
			return err
		}
	}
	if err := r.s.Start(); err != nil {
		if cmd != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		r.s.Close()
		return err
	}
	r.h.withoutStats(func() { _ = r.srv.Refresh() })
	cmdDone := make(chan error, 1)
	if cmd != nil {
		if err := release(); err != nil {
			if cmd.Process != nil { // the held shell; a direct start failed
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			r.s.Close()
			return fmt.Errorf("starting %s: %w", command[0], err)
		}
		go func() { cmdDone <- waitExit(cmd) }()
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
	refreshing := false
	var cmdErr, failure error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-ends:
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
			if refreshing || tick != nil {
				continue
			}
			if wait := time.Second - time.Since(lastRefresh); wait > 0 {
				if later.Reset(wait) == nil {
					refreshing = true
				}
				continue
			}
			_ = r.srv.Refresh()
			lastRefresh = time.Now()
		case <-later.C():
			refreshing = false
			_ = r.srv.Refresh()
			lastRefresh = time.Now()
		}
	}
	if r.live {
		fmt.Fprint(r.stderr, "\r\033[K")
	}
	if cmd != nil {
		// Stopped by a signal or the duration: the command goes on.
		fmt.Fprintf(r.stderr, "kconsume record: stopped; %s (pid %d) keeps running\n", command[0], cmd.Process.Pid)
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

// startHeld starts the command held before its exec, and returns it and
// the function that lets it exec. Go's fork and exec takes milliseconds
// of system calls that hold a P, and the runtime's sysmon polls all that
// while: done after the gate opened, tens of the recorder's own context
// switches would open its trace. Held, the command is a shell waiting on
// a pipe, which execs the command (whose exec the trace then shows) when
// release writes to it. Without /bin/sh it is started at release. Either
// way it runs at the nice value nice (startAtNice). It fails, starting
// nothing, when the command is not found.
func startHeld(command []string, nice int) (*exec.Cmd, func() error, error) {
	if _, err := exec.LookPath(command[0]); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", command[0], err)
	}
	direct := exec.Command(command[0], command[1:]...)
	direct.Stdin, direct.Stdout, direct.Stderr = os.Stdin, os.Stdout, os.Stderr
	sh, err := exec.LookPath("/bin/sh")
	if err != nil {
		return direct, func() error { return startAtNice(direct, nice) }, nil
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", command[0], err)
	}
	// The shell reads its go-ahead from descriptor 3, closes it, and
	// becomes the command: same pid, arguments, environment and exit
	// status. Should the recorder die first, the pipe's end makes the
	// shell exit without running the command.
	held := exec.Command(sh, append([]string{"-c", `read -r _ <&3 || exit 126; exec 3<&-; exec "$@"`, "sh"}, command...)...)
	held.Stdin, held.Stdout, held.Stderr = os.Stdin, os.Stdout, os.Stderr
	held.ExtraFiles = []*os.File{rd}
	err = startAtNice(held, nice)
	rd.Close()
	if err != nil {
		wr.Close()
		return nil, nil, fmt.Errorf("starting %s: %w", command[0], err)
	}
	release := func() error {
		_, err := wr.Write([]byte("\n"))
		wr.Close()
		return err
	}
	return held, release, nil
}

// waitExit waits for cmd to exit and returns cmd.Wait's result. The wait
// itself is on a pidfd in the runtime's netpoller: cmd.Wait blocks in
// waitid, a system call that holds a P, and the runtime's sysmon then
// polls for milliseconds after the recording starts and after the
// command ends, the recorder's own context switches in its trace. Where
// pidfds are missing (before Linux 5.3) it is cmd.Wait alone.
func waitExit(cmd *exec.Cmd) error {
	if fd, err := unix.PidfdOpen(cmd.Process.Pid, 0); err == nil {
		if unix.SetNonblock(fd, true) == nil {
			f := os.NewFile(uintptr(fd), "pidfd")
			if rc, err := f.SyscallConn(); err == nil {
				_ = rc.Read(func(fd uintptr) bool {
					var info unix.Siginfo
					err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
					// WNOHANG leaves info zero while the child runs.
					return err != nil || info.Signo != 0
				})
			}
			_ = f.Close()
		} else {
			_ = unix.Close(fd)
		}
	}
	return cmd.Wait()
}
