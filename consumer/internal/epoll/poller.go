// Package epoll is a small poller over epoll(7) and an eventfd: the
// drainer sleeps in Wait until a ring's producer wakes it, a timeout
// passes, or another goroutine calls Wake.
package epoll

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// WakeID is the id Wait reports for a Wake.
const WakeID = -1

// Poller waits for readiness of the file descriptors added to it. Wait
// and Add are for one goroutine (the drainer); Wake may be called from
// any goroutine, also concurrently with Wait. Close is idempotent.
type Poller struct {
	mu   sync.RWMutex // guards the descriptors against Close during Wake
	epfd int
	evfd int
	buf  [8]byte
}

// New returns a poller with its eventfd already added, or the kernel's
// error when epoll or eventfd cannot be created.
func New() (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	p := &Poller{epfd: epfd, evfd: evfd}
	if err := p.add(evfd, WakeID, unix.EPOLLIN); err != nil {
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
// msec milliseconds pass (-1: no timeout), and returns the ids ready,
// written into ids. A Wake is reported as WakeID and consumed. An
// interrupted wait returns no ids and no error.
func (p *Poller) Wait(events []unix.EpollEvent, ids []int32, msec int) ([]int32, error) {
	n, err := unix.EpollWait(p.epfd, events, msec)
	if err != nil {
		if errors.Is(err, unix.EINTR) {
			return ids[:0], nil
		}
		return ids[:0], fmt.Errorf("epoll_wait: %w", err)
	}
	ids = ids[:0]
	for _, ev := range events[:n] {
		if ev.Fd == WakeID {
			_, _ = unix.Read(p.evfd, p.buf[:])
		}
		ids = append(ids, ev.Fd)
	}
	return ids, nil
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
	if p.epfd >= 0 {
		_ = unix.Close(p.epfd)
		p.epfd = -1
	}
	if p.evfd >= 0 {
		_ = unix.Close(p.evfd)
		p.evfd = -1
	}
}
