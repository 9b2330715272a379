package consumer

import (
	"sync/atomic"
	"time"

	"github.com/kconsume/kconsume/relayfmt"
)

// CPUStats counts what happened to one CPU's records.
type CPUStats struct {
	CPU int
	// Emitted records left the BPF program into the ring; KernelLost
	// failed to (ring full). PerfLost is the part of KernelLost that perf
	// also reported with lost records (perf transport).
	Emitted    uint64
	KernelLost uint64
	PerfLost   uint64
	// Channel is the CPU's relayfmt buffer (in global mode, the one
	// buffer is reported on CPU 0).
	Channel relayfmt.Stats
	// Undecodable records reached the consumer but could not be decoded
	// (a corrupt header or a dynamic field pointing outside its record);
	// they are written into the stream as discarded.
	Undecodable uint64
	// Missed counts tracepoint hits the kernel did not run the recorder
	// for because a BPF program was already running on that CPU
	// (bpf_prog_active in kernel/trace/bpf_trace.c:trace_call_bpf; for
	// the raw syscall path, the program itself, __bpf_trace_run; the
	// programs' recursion_misses). The kernel does not say on which CPU
	// nor for which task, so they are reported on CPU 0. Without filters
	// each miss of a tracepoint's recorder was an event lost, placed in
	// stream 0 and counted in Discarded. With filters some would have
	// been filtered out, and the raw syscall programs run for syscalls
	// that are not recorded too, so those misses are an upper bound and
	// stay out of the stream.
	Missed uint64
	// UserUnread counts the user-space values of syscall events
	// (Linux 6.19+: the path of an openat, the bytes of a write) the
	// recorder could not read: those of a bad pointer, empty in the
	// kernel's own events too, and, where the recorder cannot page user
	// memory in (Session.UserFault), memory not in RAM, which the
	// kernel's own events would hold. Those events are recorded with
	// the value empty.
	UserUnread uint64
	Reordered  uint64 // records written before a record that reached the ring earlier
	Wakeups    uint64 // times the consumer was woken for this ring
	Disabled   bool   // recording stopped on this CPU alone
	// missedPlaced is the part of Missed placed in the stream.
	missedPlaced uint64
}

// Discarded returns the records of this CPU lost at any layer.
func (s CPUStats) Discarded() uint64 {
	return s.KernelLost + s.missedPlaced + s.Undecodable + s.Channel.Dropped + s.Channel.TooLarge + s.Channel.Invalid + s.Channel.Overwritten + s.Channel.Unwritten
}

// stats returns the per-CPU counts of the recorder, the accounting, the
// streams and the channel; it runs on the drainer goroutine.
func (d *drainer) stats(ch *relayfmt.Channel) []CPUStats {
	out := make([]CPUStats, d.rec.CPUs())
	for cpu := range out {
		out[cpu] = CPUStats{
			CPU:        cpu,
			Emitted:    d.rec.Emitted(cpu),
			KernelLost: d.rec.KernelLost(cpu),
			Disabled:   d.rec.CPUDisabled(cpu),
		}
	}
	d.loss.fill(out)
	for cpu, n := range d.rec.UserUnread() {
		if cpu < len(out) {
			out[cpu].UserUnread = n
		}
	}
	for _, st := range d.streams {
		o := &out[st.idx]
		o.Channel, _ = ch.StatsCPU(st.idx)
		o.Undecodable = st.undecodable
		o.Reordered = st.win.reordered
		o.Wakeups = st.wakeups
		o.PerfLost = st.src.lost()
		if n, ok := st.src.taken(); ok {
			// Writers that do not count: what the drainer read
			// (records still in the ring are not counted yet).
			o.Emitted = n
		}
	}
	return out
}

// DrainerStats tells how promptly the drainer ran. Records reach the
// rings whether or not it runs, so a drainer not run for longer than a
// ring holds loses records however fast it drains: these counts tell that
// loss apart from one a faster drain would have avoided.
type DrainerStats struct {
	// Waits counts the times the drainer was due to run: a producer's
	// wakeup or the end of a timed sleep.
	Waits uint64
	// Late counts the times it ran more than Config.Latency (1 ms
	// without one) after it was due: its CPU busy with other work or, on
	// a virtual machine, not run by the host.
	Late uint64
	// LongestOverrun is the most it ran after it was due.
	LongestOverrun time.Duration
}

// drainerCounts are DrainerStats as the drainer keeps them: atomic, so
// they can be read while it is late.
type drainerCounts struct {
	waits, late atomic.Uint64
	longest     atomic.Int64
}

// ran counts a run of the drainer over its time by over, late when that
// is more than lateness.
func (c *drainerCounts) ran(over, lateness time.Duration) {
	c.waits.Add(1)
	if over > time.Duration(c.longest.Load()) {
		c.longest.Store(int64(over)) // the drainer is the only writer
	}
	if over > lateness {
		c.late.Add(1)
	}
}

// load returns the counts so far.
func (c *drainerCounts) load() DrainerStats {
	return DrainerStats{
		Waits:          c.waits.Load(),
		Late:           c.late.Load(),
		LongestOverrun: time.Duration(c.longest.Load()),
	}
}

// MissedPlaced returns the part of Missed known to be events lost and
// placed in the stream, within Discarded: none where a skipped run may
// have been of an event not recorded (filters, the raw syscall path).
func (s CPUStats) MissedPlaced() uint64 { return s.missedPlaced }
