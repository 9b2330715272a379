// Package timerfd is a one-shot timer on a Linux timerfd(2), waited for
// in the Go runtime's network poller.
//
// A Go timer (time.Timer, a context deadline, SetReadDeadline) makes the
// runtime's monitor thread (sysmon) sleep only until the timer is due and
// then poll every 20 µs until a P has run it, because the netpoller
// sleeps in whole milliseconds; each poll is a context switch of the
// recorder in the trace it records, some tens of them per expiry. A
// timerfd in the netpoller wakes exactly one thread when it fires and
// leaves sysmon asleep.
package timerfd

import (
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Timer is a one-shot timer whose expiries arrive on C. Reset and Stop
// may be called from any goroutine; Close ends it.
type Timer struct {
	fd   int
	file *os.File
	c    chan struct{}
	done chan struct{}
}

// New returns a stopped timer, or the kernel's error when no timerfd can
// be created.
func New() (*Timer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	t := &Timer{fd: fd, file: os.NewFile(uintptr(fd), "timerfd"), c: make(chan struct{}, 1), done: make(chan struct{})}
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
		// An expiry makes the timerfd readable; Close ends the read
		// with os.ErrClosed.
		if _, err := t.file.Read(buf[:]); err != nil {
			return
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
