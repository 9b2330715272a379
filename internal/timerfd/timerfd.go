// Package timerfd is a one-shot timer on a Linux timerfd(2), waited for
// in the Go runtime's network poller.
//
// A Go timer (time.Timer, a context deadline, SetReadDeadline) makes the
// runtime's monitor thread (sysmon) sleep only until the timer is due and
// then poll every 20 µs until a P has run it, because the netpoller
// sleeps in whole milliseconds; each poll is a context switch of the
// recorder in the trace it records, some tens of them per expiry. A
// timerfd in the netpoller wakes exactly one thread when it fires and
// leaves sysmon asleep. Its expiry is read with a raw system call for the
// same reason: an ordinary one, on entry, wakes a sysmon that sleeps
// (runtime.entersyscallWakeSysmon).
package timerfd

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Timer is a one-shot timer whose expiries arrive on C. Reset and Stop
// may be called from any goroutine; Close ends it.
type Timer struct {
	fd   int
	file *os.File
	rc   syscall.RawConn
	fn   func()
	c    chan struct{}
	done chan struct{}
}

// New returns a stopped timer, or the kernel's error when no timerfd can
// be created.
func New() (*Timer, error) { return NewFunc(nil) }

// NewFunc returns a stopped timer that calls fn, when not nil, at each
// expiry on the timer's own goroutine, before C receives. fn must not
// block. Where fn is all the expiry has to do, nothing else runs: the
// one thread the netpoller wakes calls it and goes back to sleep, with
// no goroutine readied on another. It fails with the kernel's error when
// no timerfd can be created.
func NewFunc(fn func()) (*Timer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	t := &Timer{fd: fd, file: os.NewFile(uintptr(fd), "timerfd"), fn: fn, c: make(chan struct{}, 1), done: make(chan struct{})}
	if t.rc, err = t.file.SyscallConn(); err != nil {
		_ = t.file.Close()
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	go t.wait()
	return t, nil
}

// C returns the channel that receives a value at each expiry; an expiry
// not yet received is not repeated.
func (t *Timer) C() <-chan struct{} { return t.c }

// Reset arms the timer to fire once after d (at least a nanosecond),
// replacing any earlier setting. It returns the kernel's error.
func (t *Timer) Reset(d time.Duration) error {
	return Set(t.fd, max(d, 1))
}

// Stop disarms the timer; an expiry already sent on C stays there. It
// returns the kernel's error.
func (t *Timer) Stop() error { return Set(t.fd, 0) }

// Close disarms the timer and releases it; C receives nothing after
// Close returns.
func (t *Timer) Close() {
	_ = t.file.Close()
	<-t.done
}

func (t *Timer) wait() {
	defer close(t.done)
	var buf [8]byte
	for {
		// An expiry makes the timerfd readable; Close ends the wait
		// with os.ErrClosed.
		var errno syscall.Errno
		err := t.rc.Read(func(fd uintptr) bool {
			_, _, errno = unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
			return errno != unix.EAGAIN
		})
		if err != nil {
			return
		}
		// EAGAIN (a Set cleared the expiry after the poller saw it)
		// waits again, inside Read.
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return
		}
		if t.fn != nil {
			t.fn()
		}
		select {
		case t.c <- struct{}{}:
		default:
		}
	}
}

// Set arms the timerfd fd to fire once after d, or disarms it when d is
// 0; either way a pending expiry is cleared. It is a raw system call,
// which returns at once and so needs none of the runtime's bookkeeping
// (an ordinary one can wake a sleeping sysmon). It returns the kernel's
// error.
func Set(fd int, d time.Duration) error {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	_, _, errno := unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(fd), 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("timerfd_settime: %w", errno)
	}
	return nil
}
