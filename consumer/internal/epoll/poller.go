// Package epoll is a small poller over epoll(7), an eventfd and a
// timerfd: the drainer sleeps in Wait until a ring's producer wakes it, a
// timeout passes, or another goroutine calls Wake.
//
// The epoll set itself waits in the Go runtime's network poller, not in
// a blocking epoll_wait: a goroutine blocked in a system call keeps its
// P, and the runtime's monitor thread (sysmon) then polls every 20 µs to
// 10 ms until it takes the P back, some sixty wakeups of its own per
// sleep, each a context switch in the trace being recorded. Parked in
// the netpoller, the drainer leaves every P idle and sysmon asleep. The
// timeout is a timerfd in the set, not a read deadline: a Go timer wakes
// sysmon when it is due (see internal/timerfd).
package epoll

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/timerfd"
)

// WakeID is the id Wait reports for a Wake.
const WakeID = -1

// timerID is the timerfd's id in the set; Wait reports its expiry as a
// timeout, with no ids.
const timerID = -2

// Poller waits for readiness of the file descriptors added to it. Wait
// and Add are for one goroutine (the drainer); Wake may be called from
// any goroutine, also concurrently with Wait. Close is idempotent.
type Poller struct {
	mu    sync.RWMutex // guards the descriptors against Close during Wake
	epfd  int
	evfd  int
	tfd   int      // the timeout
	armed bool     // tfd is set
	file  *os.File // epfd, in the runtime's netpoller
	rc    syscall.RawConn
	buf   [8]byte
}

// New returns a poller with its eventfd already added, or the kernel's
// error when epoll or eventfd cannot be created.
func New() (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(evfd)
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	// os.NewFile registers a non-blocking descriptor with the netpoller;
	// an epoll set is readable while it holds ready descriptors.
	p := &Poller{epfd: epfd, evfd: evfd, tfd: tfd, file: os.NewFile(uintptr(epfd), "epoll")}
	if p.rc, err = p.file.SyscallConn(); err != nil {
		p.Close()
		return nil, fmt.Errorf("epoll: %w", err)
	}
	if err := p.add(evfd, WakeID, unix.EPOLLIN); err != nil {
		p.Close()
		return nil, err
	}
	if err := p.add(tfd, timerID, unix.EPOLLIN); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Add watches fd for input, edge-triggered, reported with id (which must
// not be negative): a ring stays readable while its records wait in a
// reorder window, and the drainer must not spin on that. It returns the
// kernel's error.
func (p *Poller) Add(fd int, id int32) error {
	if id < 0 {
		return fmt.Errorf("epoll add: negative id %d", id)
	}
	return p.add(fd, id, unix.EPOLLIN|unix.EPOLLET)
}

func (p *Poller) add(fd int, id int32, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: id}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	return nil
}

// Wait sleeps until a watched descriptor is ready, Wake is called or
// timeout passes (negative: no timeout; 0: do not sleep), and returns the
// ids ready, written into ids. A Wake is reported as WakeID and
// consumed. It returns no ids and no error at the timeout, and the
// kernel's error otherwise.
func (p *Poller) Wait(events []unix.EpollEvent, ids []int32, timeout time.Duration) ([]int32, error) {
	n, err := p.poll(events)
	if err == nil && n == 0 && timeout != 0 {
		if timeout > 0 {
			if err = timerfd.Set(p.tfd, timeout); err == nil {
				p.armed = true
			}
		}
		if err == nil {
			err = p.rc.Read(func(uintptr) bool {
				n, err = p.poll(events)
				return n > 0 || err != nil
			})
		}
	}
	ids = ids[:0]
	if err != nil {
		return ids, fmt.Errorf("epoll_wait: %w", err)
	}
	expired := false
	for _, ev := range events[:n] {
		switch ev.Fd {
		case timerID:
			expired = true
			continue
		case WakeID:
			_, _ = unix.Read(p.evfd, p.buf[:])
		}
		ids = append(ids, ev.Fd)
	}
	if p.armed || expired {
		// Disarmed, which also clears an expiry not read: a timeout
		// left set would end a later Wait early.
		if err := timerfd.Set(p.tfd, 0); err != nil {
			return ids, err
		}
		p.armed = false
	}
	return ids, nil
}

// poll returns the events ready now, without sleeping. It is a raw
// system call: an ordinary one wakes the runtime's sysmon when it sleeps
// (reentersyscall), and sysmon then polls for milliseconds; one that
// returns at once needs none of the runtime's bookkeeping.
func (p *Poller) poll(events []unix.EpollEvent) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, uintptr(p.epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return 0, errno
	}
}

// Wake makes a Wait in progress, or the next one, return at once. It
// does nothing after Close.
func (p *Poller) Wake() {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.evfd < 0 {
		return
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(p.evfd, one[:])
}

// Close releases the epoll set and the eventfd.
func (p *Poller) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.file != nil {
		_ = p.file.Close() // closes epfd
		p.file, p.epfd = nil, -1
	} else if p.epfd >= 0 {
		_ = unix.Close(p.epfd)
		p.epfd = -1
	}
	if p.evfd >= 0 {
		_ = unix.Close(p.evfd)
		p.evfd = -1
	}
	if p.tfd >= 0 {
		_ = unix.Close(p.tfd)
		p.tfd = -1
	}
}
