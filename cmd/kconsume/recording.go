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
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/internal/timerfd"
)

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// recordRun runs a session to its end and reports on it.
type recordRun struct {
	s              *consumer.Session
	srv            *control.Server
	h              *handler
	stdout, stderr io.Writer
	start          time.Time
	live           bool
	relay          *relaydOut
	rot            *rotateFlags
	lastRecords    uint64
	lastTick       time.Time
	cmdNice        int       // the command's nice value: kconsume's before it raised its own
	prio           *niceness // what raisePriority set, for the threads started since; nil when nothing
	// cpuAtGate is kconsume's own CPU time (all its threads, not the
	// command's) when the gate opened; set on the gate's thread.
	cpuAtGate atomic.Pointer[cpuTime]
}

// cpuTime is a process's CPU time, user and system.
type cpuTime struct{ user, sys time.Duration }

// ownCPU returns the CPU time of kconsume's threads so far, or false
// when the kernel refuses it. It is a raw system call, as the gate's
// callback makes no other kind (see run).
func ownCPU() (cpuTime, bool) {
	var ru unix.Rusage
	if _, _, errno := unix.RawSyscall(unix.SYS_GETRUSAGE, uintptr(unix.RUSAGE_SELF), uintptr(unsafe.Pointer(&ru)), 0); errno != 0 {
		return cpuTime{}, false
	}
	return cpuTime{time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())}, true
}

// gatePause is how long the recorder idles before its gate opens: longer
// than sysmon's longest poll interval (10 ms, runtime.sysmon), so that it
// has seen every P idle and gone to sleep.
const gatePause = 15 * time.Millisecond

// run records until a signal, the duration, the command's exit or a
// channel failure (a full disk), then closes the session so every file is
// whole, and prints the summary. It returns the command's exit status as
// an exitError when the command failed.
func (r *recordRun) run(command []string, duration time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer func() {
		// From here to the exit a Ctrl-C has nothing left to stop:
		// ignored, it cannot kill the process by its default action
		// between the summary and the exit status (a recording that
		// stopped itself on a full disk, say). Ignore before stop,
		// so that no moment has the default action.
		signal.Ignore(os.Interrupt, syscall.SIGTERM)
		stop()
	}()
	// Threads started since raisePriority (the session's setup), before
	// the trace starts: one the monitor started, while the spare threads
	// settled, would have its value. Best effort, as at each refresh.
	_ = r.prio.apply()
	w := &runWait{command: command, duration: duration, cmdDone: make(chan error, 1), opened: make(chan error, 1)}
	defer w.close()
	if err := r.prepare(w); err != nil {
		r.s.Close()
		return err
	}
	if err := r.armGate(w); err != nil {
		return r.abort(w, err)
	}
	cmdErr, failure, err := r.wait(ctx, w)
	if err != nil {
		return r.abort(w, err)
	}
	return r.finish(w, cmdErr, failure)
}

// runWait is what run's steps share: the timers, the held command and
// the gate.
type runWait struct {
	command  []string
	duration time.Duration
	end      *timerfd.Timer // the duration's, which closes the gate itself
	ends     <-chan struct{}
	later    *timerfd.Timer // a refresh put off
	held     *heldCmd
	gate     *timerfd.Timer
	opened   chan error  // the gate's callback: nil when this goroutine starts the command
	released atomic.Bool // the held command has its go-ahead
	cmd      *exec.Cmd   // the command, once it runs
	cmdDone  chan error
}

// close releases the timers and the held command's pipe.
func (w *runWait) close() {
	for _, t := range []*timerfd.Timer{w.gate, w.end, w.later} {
		if t != nil {
			t.Close()
		}
	}
	if w.held != nil {
		w.held.closePipe()
	}
}

// abort kills the held command, closes the session and returns err.
func (r *recordRun) abort(w *runWait, err error) error {
	if w.held != nil && w.held.cmd.Process != nil {
		_ = w.held.cmd.Process.Kill()
		_ = w.held.cmd.Wait()
	}
	r.s.Close()
	return err
}

// prepare makes the timers, hands the setup's garbage back, writes the
// control directory and starts the command held before its exec.
func (r *recordRun) prepare(w *runWait) error {
	// The duration and the refresh below wait on timerfds, not Go
	// timers: a Go timer wakes the runtime's sysmon thread when due,
	// which then polls every 20 µs until the timer has run, tens of the
	// recorder's own context switches in its trace.
	//
	// The duration's timer closes the gate itself, on the one thread its
	// expiry wakes: handing that to this goroutine would first wake a
	// second thread inside the trace.
	var err error
	if w.duration > 0 {
		if w.end, err = timerfd.NewFunc(r.closeGate); err != nil {
			return err
		}
		w.ends = w.end.C()
	}
	if w.later, err = timerfd.New(); err != nil {
		return err
	}
	freeSetup()
	// The control directory is written before the gate opens, all but
	// its state, which must not say running before the programs record:
	// the gate's callback renames a staged one into place.
	_ = r.srv.Refresh()
	if len(w.command) > 0 {
		if w.held, err = startHeld(w.command, r.cmdNice); err != nil {
			return err
		}
	}
	return nil
}

// closeGate stops recording; it runs on a timer's thread or the command
// waiter's.
func (r *recordRun) closeGate() { _ = r.s.Stop() }

// freeSetup collects the setup's garbage and hands its pages back.
//
// Setting up allocated the channel's buffers and the BPF objects' specs:
// collected now, or the collector's workers and the runtime's scavenger
// would run after the gate opens and put the recorder's own context
// switches and madvise calls into the trace.
//
// One P while it does: the collection's end wakes the runtime's
// background scavenger, which on a second P would race the call to
// return pages, and having returned any, sleeps a second
// (runtime/mgcscavenge.go: 1 ms of work at a ratio of 0.001) and wakes
// into the trace, sysmon polling with it. On one P it runs after the
// call has returned everything, finds nothing and parks.
//
// Twice: the scavenger may have done work during the setup, before the
// first call, and then sleeps its second on a timer that would fire into
// the trace. The second call's collection starts by waking it
// (finishsweep_m calls scavenger.wake, which readies a sleeping
// scavenger too); with nothing left to return it parks without a timer.
func freeSetup() {
	procs := runtime.GOMAXPROCS(1)
	debug.FreeOSMemory()
	debug.FreeOSMemory()
	runtime.GOMAXPROCS(procs)
}

// armGate sets the timer whose callback opens the gate.
//
// The gate opens on a timer's thread after a pause, with no system call
// of the runtime's on the way: the setup's calls left the runtime's
// sysmon polling every 20 µs, and each poll inside the trace is two of
// the recorder's context switches. Paused, every P idles, and sysmon,
// which looks at least every 10 ms, goes to sleep until a goroutine next
// enters a system call. The gate's callback then makes raw ones alone
// (the state file's rename, the duration's timer, the held command's
// go-ahead), and its thread goes back to the poller: one switch of the
// recorder's own opens the trace.
func (r *recordRun) armGate(w *runWait) error {
	r.s.Prepare()
	running, err := r.srv.Stage("state", "running")
	if err != nil {
		return err
	}
	held := w.held
	w.gate, err = timerfd.NewFunc(func() {
		if err := r.s.Start(); err != nil {
			w.opened <- err
			return
		}
		if c, ok := ownCPU(); ok {
			r.cpuAtGate.Store(&c)
		}
		if w.end != nil {
			_ = w.end.Reset(w.duration)
		}
		_ = running()
		switch {
		case held == nil:
		case held.pipe != nil:
			if err := held.release(); err != nil {
				w.opened <- fmt.Errorf("starting %s: %w", w.command[0], err)
				return
			}
			w.released.Store(true)
		default:
			w.opened <- nil // this goroutine starts it: no /bin/sh to hold it
		}
	})
	if err == nil {
		err = w.gate.Reset(gatePause)
	}
	if err != nil {
		return err
	}
	if held != nil && held.pipe != nil {
		w.cmd = held.cmd
		go func() { w.cmdDone <- waitExit(w.cmd, r.closeGate) }()
	}
	return nil
}

// wait runs until a signal (ctx), the duration, the command's exit or a
// channel failure, keeping the control directory, the status line and
// the relayd stream up to date. It returns the command's error, the
// channel's failure, or an error that aborts the recording.
func (r *recordRun) wait(ctx context.Context, w *runWait) (cmdErr, failure, err error) {
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
	refresh := func() {
		refreshing = false
		r.refresh()
		lastRefresh = time.Now()
	}
	for {
		// The drainer signals activity after each pass for data, into a
		// one-slot channel. Received only while it can lead to a refresh,
		// it wakes this goroutine at most once a second under load; taken
		// at every pass, it cost a wakeup and a thread handoff each.
		activity := r.s.Activity()
		if refreshing || tick != nil {
			activity = nil
		}
		select {
		case err := <-w.opened:
			// nil: the gate is open and the command, not held, is
			// this goroutine's to start.
			if err != nil {
				return nil, nil, err
			}
			if err := startAtNice(w.held.cmd, r.cmdNice); err != nil {
				return nil, nil, fmt.Errorf("starting %s: %w", w.command[0], err)
			}
			w.cmd = w.held.cmd
			go func() { w.cmdDone <- waitExit(w.cmd, r.closeGate) }()
		case <-ctx.Done():
			return nil, nil, nil
		case <-w.ends:
			return nil, nil, nil
		case cmdErr = <-w.cmdDone:
			w.cmd = nil
			return cmdErr, nil, nil
		case <-r.s.Channel().Failed():
			return nil, r.s.Channel().Err(), nil
		case <-tick:
			refresh()
			r.relay.poll(r.stderr, r.live)
			if r.live {
				r.status()
			}
		case <-activity:
			if wait := time.Second - time.Since(lastRefresh); wait > 0 {
				if w.later.Reset(wait) == nil {
					refreshing = true
				}
				continue
			}
			refresh()
		case <-w.later.C():
			refresh()
		}
	}
}

// finish closes the gate and the session, prints the summary and
// returns the recording's outcome: a channel failure, the command's
// exit status (an exitError), or nil.
func (r *recordRun) finish(w *runWait, cmdErr, failure error) error {
	// No gate may open after this.
	w.gate.Close()
	w.gate = nil
	if w.cmd != nil && w.held.pipe != nil && !w.released.Load() {
		// Stopped before the gate opened: the held shell never ran the
		// command, and would only exit when its pipe closes. waitExit
		// reaps it.
		_ = w.cmd.Process.Kill()
		w.cmd = nil
	}
	if r.live {
		fmt.Fprint(r.stderr, "\r\033[K")
	}
	if w.cmd != nil {
		// Stopped by a signal or the duration: the command goes on.
		fmt.Fprintf(r.stderr, "kconsume record: stopped; %s (pid %d) keeps running\n", w.command[0], w.cmd.Process.Pid)
	}
	closeErr := r.s.Close()
	stats, _ := r.s.Stats()
	r.summary(stats, r.s.Drainer())
	if c0 := r.cpuAtGate.Load(); c0 != nil {
		if c1, ok := ownCPU(); ok {
			r.footprint(stats, cpuTime{c1.user - c0.user, c1.sys - c0.sys})
		}
	}
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

// refresh updates the control directory and gives the threads the
// runtime started since the last refresh their nice value. Both are best
// effort: the next refresh tries again.
func (r *recordRun) refresh() {
	_ = r.srv.Refresh()
	_ = r.prio.apply()
}

// exitError carries the traced command's exit status out of run.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }

// heldCmd is a command started held before its exec (startHeld).
type heldCmd struct {
	cmd *exec.Cmd
	// pipe is the write end of the held shell's go-ahead; nil when there
	// is no /bin/sh, and cmd is started by startAtNice at the gate.
	pipe *os.File
}

// startHeld starts the command held before its exec. Go's fork and exec
// takes milliseconds of system calls that hold a P, and the runtime's
// sysmon polls all that while: done after the gate opened, tens of the
// recorder's own context switches would open its trace. Held, the
// command is a shell waiting on a pipe, which execs the command (whose
// exec the trace then shows) when release writes to it. Without /bin/sh
// nothing is started: the caller starts cmd at the gate. Either way it
// runs at the nice value nice (startAtNice). It fails, starting nothing,
// when the command is not found.
func startHeld(command []string, nice int) (*heldCmd, error) {
	if _, err := exec.LookPath(command[0]); err != nil {
		return nil, fmt.Errorf("starting %s: %w", command[0], err)
	}
	direct := exec.Command(command[0], command[1:]...)
	direct.Stdin, direct.Stdout, direct.Stderr = os.Stdin, os.Stdout, os.Stderr
	sh, err := exec.LookPath("/bin/sh")
	if err != nil {
		return &heldCmd{cmd: direct}, nil
	}
	// A blocking pipe, outside the runtime's netpoller: os.Pipe's would
	// be in it, and the shell's closing its end would wake a thread of
	// the recorder inside the trace.
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("starting %s: %w", command[0], err)
	}
	rd, wr := os.NewFile(uintptr(fds[0]), "go-ahead"), os.NewFile(uintptr(fds[1]), "go-ahead")
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
		return nil, fmt.Errorf("starting %s: %w", command[0], err)
	}
	return &heldCmd{cmd: held, pipe: wr}, nil
}

// release lets the held shell exec the command: one raw write(2), which
// wakes no sleeping sysmon (see the gate in run). It returns the
// kernel's error.
func (h *heldCmd) release() error {
	nl := [1]byte{'\n'}
	_, _, errno := unix.RawSyscall(unix.SYS_WRITE, h.pipe.Fd(), uintptr(unsafe.Pointer(&nl[0])), 1)
	if errno != 0 {
		return fmt.Errorf("releasing the held command: %w", errno)
	}
	return nil
}

// closePipe closes the go-ahead's pipe, if any.
func (h *heldCmd) closePipe() {
	if h.pipe != nil {
		_ = h.pipe.Close()
	}
}

// waitExit waits for cmd to exit, calls exited (when not nil) as soon as
// it knows, and returns cmd.Wait's result. The wait itself is on a pidfd
// in the runtime's netpoller, its test a raw waitid: cmd.Wait blocks in
// waitid, a system call that holds a P, and an ordinary call wakes a
// sleeping sysmon, which then polls every 20 µs, the recorder's own
// context switches in its trace. exited runs on the thread the exit
// woke, before any other is: the recorder closes its gate there. Where
// pidfds are missing (before Linux 5.3) it is cmd.Wait, then exited.
func waitExit(cmd *exec.Cmd, exited func()) error {
	if f := pidfd(cmd.Process.Pid); f != nil {
		if rc, err := f.SyscallConn(); err == nil {
			_ = rc.Read(func(fd uintptr) bool {
				var info unix.Siginfo
				_, _, errno := unix.RawSyscall6(unix.SYS_WAITID, unix.P_PIDFD, fd, uintptr(unsafe.Pointer(&info)),
					unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
				// WNOHANG leaves info zero while the child runs.
				if errno != 0 || info.Signo != 0 {
					if exited != nil {
						exited()
						exited = nil
					}
					return true
				}
				return false
			})
		}
		_ = f.Close()
	}
	err := cmd.Wait()
	if exited != nil {
		exited()
	}
	return err
}

// pidfd returns a non-blocking pidfd of pid as a file in the runtime's
// netpoller, or nil where there is none (before Linux 5.3).
func pidfd(pid int) *os.File {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil
	}
	return os.NewFile(uintptr(fd), "pidfd")
}
