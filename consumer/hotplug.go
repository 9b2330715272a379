package consumer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// hotplugPeriod is how often the perf transport looks for CPUs that came
// online when the kernel's uevents cannot tell it. BPF ring buffers exist
// for every possible CPU and need no check.
const hotplugPeriod = 100 * time.Millisecond

// perfCPUs is what the perf transport knows of CPU hotplug (a perf event
// exists only for a CPU online when it was opened) and how the drainer
// learns of it: from the kernel's uevents, a socket in its epoll set, or
// where that cannot be had, by looking every hotplugPeriod.
type perfCPUs struct {
	online    []bool // at the last check
	checked   time.Time
	ringSize  int
	watermark int
	ufd       int   // NETLINK_KOBJECT_UEVENT socket, or -1
	id        int32 // its id in the poller
	polled    bool  // no uevents: look every hotplugPeriod
	tick      time.Duration
	buf       []byte
}

// openPerf opens a perf ring on every online CPU. A CPU that comes
// online later gets its ring from checkHotplug, told by a uevent. The
// perf transport cannot wake the drainer at a record's arrival, so a
// latency bound ticks.
func (d *drainer) openPerf(ringSize, watermark int, latency time.Duration) error {
	d.perf = &perfCPUs{ringSize: ringSize, watermark: watermark, ufd: -1, id: int32(len(d.streams)), tick: latency}
	if fd, err := openUevents(); err == nil {
		d.perf.ufd = fd
		if err := d.poll.Add(fd, d.perf.id); err != nil {
			return err
		}
	} else {
		d.perf.polled = true
		if d.perf.tick == 0 || d.perf.tick > hotplugPeriod {
			d.perf.tick = hotplugPeriod
		}
	}
	online, err := onlineCPUs(d.rec.CPUs())
	if err != nil {
		return err
	}
	for cpu := 0; cpu < d.rec.CPUs(); cpu++ {
		if online[cpu] {
			if err := d.openPerfCPU(cpu); err != nil {
				return err
			}
		}
	}
	d.perf.online = online
	return nil
}

// openPerfCPU opens cpu's perf ring, points the recorder at it and makes
// it the source of cpu's stream in place of the old one.
func (d *drainer) openPerfCPU(cpu int) error {
	p, err := openPerfRing(cpu, d.perf.ringSize, d.perf.watermark)
	if err != nil {
		return err
	}
	if err := d.rec.SetPerf(cpu, p.fd); err != nil {
		p.close()
		return err
	}
	if err := d.poll.Add(p.fd, int32(cpu)); err != nil {
		p.close()
		return err
	}
	st := d.streams[cpu]
	st.src.close()
	st.src, st.data, st.wrap = p, p.data, &p.wrap
	return nil
}

// checkHotplug reopens the perf rings of CPUs that came online: a perf
// event stops counting when its CPU goes offline and is not re-enabled
// when it returns (kernel/events/core.c:perf_event_exit_cpu_context).
// The old ring is drained first, so nothing it held is lost.
func (d *drainer) checkHotplug() error {
	d.perf.checked = time.Now()
	online, err := onlineCPUs(d.rec.CPUs())
	if err != nil {
		return err
	}
	for cpu := 0; cpu < d.rec.CPUs(); cpu++ {
		if online[cpu] && !d.perf.online[cpu] {
			st := d.streams[cpu]
			st.src.drain(d.w, d.loss, st, ^uint64(0))
			if err := d.openPerfCPU(cpu); err != nil {
				return err
			}
		}
	}
	d.perf.online = online
	return nil
}

// openUevents returns a socket that receives the kernel's uevents
// (lib/kobject_uevent.c broadcasts them to netlink group 1 whether or not
// udev runs), among them a CPU's "online", or the error.
func openUevents() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return -1, fmt.Errorf("uevent socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("uevent socket: %w", err)
	}
	return fd, nil
}

// cpuEvent reads every waiting uevent and reports whether one was of a
// CPU ("SUBSYSTEM=cpu").
func (p *perfCPUs) cpuEvent() bool {
	if p.buf == nil {
		p.buf = make([]byte, 8192)
	}
	cpu := false
	for {
		n, _, err := unix.Recvfrom(p.ufd, p.buf, unix.MSG_DONTWAIT)
		if err != nil || n <= 0 {
			return cpu
		}
		cpu = cpu || bytes.Contains(p.buf[:n], []byte("\x00SUBSYSTEM=cpu\x00"))
	}
}

// close closes the uevent socket.
func (p *perfCPUs) close() {
	if p.ufd >= 0 {
		_ = unix.Close(p.ufd)
		p.ufd = -1
	}
}

// onlineCPUs parses /sys/devices/system/cpu/online ("0-3,5") into at
// least n flags: the list ends at the last online CPU, so a trailing
// offline one is absent.
func onlineCPUs(n int) ([]bool, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, fmt.Errorf("online CPUs: %w", err)
	}
	on, err := parseCPUList(strings.TrimSpace(string(b)))
	for len(on) < n {
		on = append(on, false)
	}
	return on, err
}

func parseCPUList(s string) ([]bool, error) {
	var out []bool
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err := errors.Join(err1, err2); err != nil || a < 0 || b < a || b > 1<<16 {
			return nil, fmt.Errorf("cpu list %q: bad part %q", s, part)
		}
		for len(out) <= b {
			out = append(out, false)
		}
		for i := a; i <= b; i++ {
			out[i] = true
		}
	}
	return out, nil
}
