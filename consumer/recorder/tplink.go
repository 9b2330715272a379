package recorder

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// attachTracepoint attaches prog to the tracepoint group:name, with
// cookie when opts sets one. cilium/ebpf refuses a group or name that
// begins with a digit, which the kernel allows (the 9p module's group is
// "9p"): those are attached here, by the same perf event cilium opens
// (kernel/events/core.c, perf_event_set_bpf_prog), through a BPF link
// where the kernel has them (5.15) and the perf event's ioctl before. It
// fails with the kernel's error.
func attachTracepoint(group, name string, prog *ebpf.Program, opts *link.TracepointOptions) (link.Link, error) {
	if leadingLetter(group) && leadingLetter(name) {
		return link.Tracepoint(group, name, prog, opts)
	}
	id, err := tracepointID(group, name)
	if err != nil {
		return nil, err
	}
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_TRACEPOINT,
		Config:      id,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample_type: unix.PERF_SAMPLE_RAW,
		Sample:      1,
		Wakeup:      1,
	}
	pfd, err := unix.PerfEventOpen(&attr, -1, 0, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("opening tracepoint %s:%s: %w", group, name, err)
	}
	var cookie uint64
	if opts != nil {
		cookie = opts.Cookie
	}
	lfd, err := perfEventLinkCreate(prog.FD(), pfd, cookie)
	if err == nil {
		// The link holds the perf event's file (bpf_perf_link_attach).
		_ = unix.Close(pfd)
		return link.NewFromFD(lfd)
	}
	if cookie != 0 {
		_ = unix.Close(pfd)
		return nil, fmt.Errorf("attaching to tracepoint %s:%s with a cookie: %w", group, name, err)
	}
	if err := unix.IoctlSetInt(pfd, unix.PERF_EVENT_IOC_SET_BPF, prog.FD()); err != nil {
		_ = unix.Close(pfd)
		return nil, fmt.Errorf("attaching to tracepoint %s:%s: %w", group, name, err)
	}
	if err := unix.IoctlSetInt(pfd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		_ = unix.Close(pfd)
		return nil, fmt.Errorf("enabling tracepoint %s:%s: %w", group, name, err)
	}
	return &perfIoctlLink{fd: pfd}, nil
}

// leadingLetter reports whether s begins as cilium/ebpf's tracefs names
// must: with a letter or an underscore.
func leadingLetter(s string) bool {
	return s != "" && (s[0] == '_' || s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z')
}

// tracepointID returns the id of the tracepoint group:name, from its
// format in tracefs, after checking that neither part leaves its
// directory.
func tracepointID(group, name string) (uint64, error) {
	for _, p := range []string{group, name} {
		if p == "" || p == "." || p == ".." || strings.ContainsAny(p, "/\x00") {
			return 0, fmt.Errorf("tracepoint %q:%q: not a tracefs name", group, name)
		}
	}
	fs, err := tracefs.Find()
	if err != nil {
		return 0, fmt.Errorf("tracepoint %s:%s: %w", group, name, err)
	}
	f, err := fs.Format(tracefs.Event{System: group, Name: name})
	if err != nil {
		return 0, err
	}
	return uint64(f.ID), nil
}

// perfEventLinkCreate makes a BPF link of program fd prog to the perf
// event pfd with cookie (BPF_LINK_CREATE, BPF_PERF_EVENT; struct
// bpf_attr's link_create, include/uapi/linux/bpf.h) and returns its fd.
// It fails with the kernel's error: EINVAL before 5.15.
func perfEventLinkCreate(prog, pfd int, cookie uint64) (int, error) {
	const bpfPerfEvent = 41 // enum bpf_attach_type BPF_PERF_EVENT
	attr := struct {
		progFD, targetFD, attachType, flags uint32
		cookie                              uint64
		_                                   [32]byte // the rest of link_create, zero
	}{progFD: uint32(prog), targetFD: uint32(pfd), attachType: bpfPerfEvent, cookie: cookie}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_LINK_CREATE, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// perfIoctlLink is a program attached to a perf event by its ioctl, on
// kernels without perf event links: closing the event detaches it. Its
// methods besides Close are refused; embedding link.Link (nil) makes it
// one, whose unexported method cilium never calls.
type perfIoctlLink struct {
	link.Link
	fd int
}

// errIoctlLink is what perfIoctlLink's methods besides Close return.
var errIoctlLink = errors.New("a program attached by the perf event's ioctl supports only Close")

func (l *perfIoctlLink) Close() error {
	if l.fd < 0 {
		return nil
	}
	err := unix.Close(l.fd)
	l.fd = -1
	return err
}

func (l *perfIoctlLink) Update(*ebpf.Program) error { return errIoctlLink }
func (l *perfIoctlLink) Pin(string) error           { return errIoctlLink }
func (l *perfIoctlLink) Unpin() error               { return errIoctlLink }
func (l *perfIoctlLink) Info() (*link.Info, error)  { return nil, errIoctlLink }
