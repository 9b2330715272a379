// Package statedump describes the system as it is when a trace begins, in
// the events lttng-modules' statedump writes (lttng-statedump.h): every
// thread with its process, parent and namespaces, every open file
// descriptor, block device, interrupt action and CPU. Analyses need it to
// know the processes and files that existed before tracing began.
//
// The events are synthetic events (kconsume's synth package), injected
// through the recording session, so they get kernel timestamps and sort
// among the kernel's events. Everything is read from /proc and /sys with
// github.com/prometheus/procfs.
package statedump

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"github.com/prometheus/procfs/blockdevice"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/synth"
)

// Event names, as the lttng profile shows them (the ftrace profile
// prefixes "synthetic:").
const (
	Start          = "lttng_statedump_start"
	End            = "lttng_statedump_end"
	ProcessState   = "lttng_statedump_process_state"
	ProcessPidNs   = "lttng_statedump_process_pid_ns"
	FileDescriptor = "lttng_statedump_file_descriptor"
	BlockDevice    = "lttng_statedump_block_device"
	NetInterface   = "lttng_statedump_network_interface"
	Interrupt      = "lttng_statedump_interrupt"
	CPUTopology    = "lttng_statedump_cpu_topology"
	// Cgroup is kconsume's own: each cgroup v2 directory's id (its
	// inode, what the cgroup context and bpf_get_current_cgroup_id give)
	// and its path under the hierarchy's root.
	Cgroup = "kconsume_statedump_cgroup"
)

// Simple namespace events: tid and the namespace's inode number.
var nsEvents = map[string]string{
	"cgroup": "lttng_statedump_process_cgroup_ns",
	"ipc":    "lttng_statedump_process_ipc_ns",
	"mnt":    "lttng_statedump_process_mnt_ns",
	"net":    "lttng_statedump_process_net_ns",
	"uts":    "lttng_statedump_process_uts_ns",
	"time":   "lttng_statedump_process_time_ns",
}

// definitions mirror lttng-modules' field names, order and types.
// lttng-modules' start and end have no field; a synthetic event needs
// one, so they carry the statedump's number in the trace (from 1).
// file_descriptor keeps the pid field lttng-modules had before 2.11 (which
// LTTng's analyses read) next to file_table_address, the newer key.
var definitions = map[string][]string{
	Start:                               {"unsigned int seq"},
	End:                                 {"unsigned int seq"},
	ProcessState:                        {"pid_t tid", "pid_t pid", "pid_t ppid", "char name[16]", "int type", "int mode", "int submode", "int status", "unsigned int cpu", "u64 file_table_address"},
	ProcessPidNs:                        {"pid_t tid", "pid_t vtid", "pid_t vpid", "pid_t vppid", "int ns_level", "unsigned int ns_inum"},
	FileDescriptor:                      {"u64 file_table_address", "pid_t pid", "int fd", "unsigned int flags", "unsigned int fmode", "char filename[]"},
	BlockDevice:                         {"u32 dev", "char diskname[]"},
	NetInterface:                        {"char name[]", "u32 address_ipv4"},
	Interrupt:                           {"unsigned int irq", "char name[]", "char action[]", "pid_t tid"},
	"lttng_statedump_process_cgroup_ns": nsFields,
	"lttng_statedump_process_ipc_ns":    nsFields,
	"lttng_statedump_process_mnt_ns":    nsFields,
	"lttng_statedump_process_net_ns":    nsFields,
	"lttng_statedump_process_uts_ns":    nsFields,
	"lttng_statedump_process_time_ns":   nsFields,
	Cgroup:                              {"u64 id", "char path[]"},
	CPUTopology:                         {"char architecture[]", "u16 cpu_id", "char vendor[]", "u8 family", "u8 model", "char model_name[]", "u16 physical_id", "u16 core_id", "u16 cores"},
}

var nsFields = []string{"pid_t tid", "unsigned int ns_inum"}

// nsKinds are the namespaces a statedump writes, pid first, then in the
// order of the events (lttng-statedump-impl.c's).
var nsKinds = [...]string{"pid", "cgroup", "ipc", "mnt", "net", "uts", "time"}

// Events returns the statedump's synthetic event definitions, finalized,
// in a fixed order. Start must be recorded for any other to be emitted.
func Events() []*synth.Event {
	names := []string{Start, End, ProcessState, ProcessPidNs, FileDescriptor, BlockDevice, Interrupt, CPUTopology, NetInterface, Cgroup}
	for _, k := range []string{"cgroup", "ipc", "mnt", "net", "uts", "time"} {
		names = append(names, nsEvents[k])
	}
	var out []*synth.Event
	for _, n := range names {
		e, err := synth.Create(n, definitions[n]...)
		if err != nil {
			panic(fmt.Sprintf("statedump: definition of %s: %v", n, err)) // fixed table: a bug
		}
		out = append(out, e)
	}
	return out
}

// Patterns returns the event patterns (consumer.Config.Events) that record
// the statedump's events.
func Patterns() []string {
	return []string{"synthetic:lttng_statedump_*", "synthetic:" + Cgroup}
}

// Emitter injects one synthetic event; consumer.Session.EmitSynth is one.
type Emitter interface {
	EmitSynth(cpu int, name string, payload []byte) error
}

// ErrStopped is returned when the emitter refused an event because
// recording is stopped (errors.Is also matches the emitter's own error).
var ErrStopped = errors.New("statedump: recording stopped")

// Counts says what a statedump emitted.
type Counts struct {
	Threads, Processes, FDs, BlockDevices, NetInterfaces, Interrupts, CPUs, Cgroups int
	// Lost counts events the emitter could not write (ring full, an
	// event too large); they are counted in the trace like any loss.
	Lost int
	// Gone counts threads or processes that exited while being read.
	Gone int
	// Emitted counts the events written, start and end included.
	Emitted int
}

// Dumper reads the system and emits the statedump.
type Dumper struct {
	// Proc and Sys are the procfs and sysfs mount points (default /proc
	// and /sys).
	Proc, Sys string
	// CPU is the stream the events go to; all go to one stream, so they
	// stay in the order lttng-modules writes them.
	CPU int
	// Seq numbers this statedump in the trace (start and end carry it).
	Seq uint32
	// Stopped, when not nil, tells whether an emit error means recording
	// stopped (consumer.ErrStopped); the dump then ends with ErrStopped.
	Stopped func(error) bool

	emit Emitter
	defs map[string]*synth.Event
	r    *procReader
	// self is the emitting thread, which runs while it dumps.
	self int
	// out carries batches to the emitting thread, which closes stop
	// when it ends early; free returns used batches.
	out, free chan *batch
	stop      chan struct{}
	cur       *batch
	// rootPidNs is the inode of the pid namespace of /proc's init.
	rootPidNs uint32
}

// Run emits one statedump through e: start, the processes and their
// threads, their file descriptors, block devices, interrupts, CPUs, end.
// A process that exits meanwhile is skipped (counted in Gone). It fails
// when /proc cannot be read, or with ErrStopped when recording stopped;
// an emit error of another kind is counted in Lost.
func (d *Dumper) Run(e Emitter) (Counts, error) {
	var c Counts
	if d.Proc == "" {
		d.Proc = procfs.DefaultMountPoint
	}
	if d.Sys == "" {
		d.Sys = "/sys"
	}
	d.emit = e
	// The injector runs the event on d.CPU: from another CPU that is an
	// IPI and a wait per event (kernel bpf_prog_test_run_raw_tp), which on
	// a VM costs hundreds of microseconds. Running on d.CPU makes it a
	// local call. Where the CPU is not allowed, the dump runs unpinned.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if unix.SchedGetaffinity(0, &old) == nil {
		var one unix.CPUSet
		one.Set(d.CPU)
		if unix.SchedSetaffinity(0, &one) == nil {
			defer func() { _ = unix.SchedSetaffinity(0, &old) }()
		}
	}
	d.defs = map[string]*synth.Event{}
	for _, ev := range Events() {
		d.defs[ev.Name] = ev
	}
	fs, err := procfs.NewFS(d.Proc)
	if err != nil {
		return c, fmt.Errorf("statedump: %w", err)
	}
	d.r = newProcReader()
	d.rootPidNs = d.procPidNs(fs)
	d.self = unix.Gettid()
	// /proc is read and the events encoded on another thread while this
	// one, pinned, injects them: the two halves of the work overlap on
	// two CPUs. Batches keep the order; a full channel holds the reader.
	d.out, d.stop, d.free = make(chan *batch, 4), make(chan struct{}), make(chan *batch, 6)
	d.cur = nil
	var rc Counts
	var rerr error
	go func() {
		defer close(d.out)
		rerr = d.read(&rc, fs)
		if rerr == nil {
			rerr = d.send()
		}
	}()
	var err2 error
	for b := range d.out {
		if err2 == nil {
			if err2 = d.emitBatch(&c, b); err2 != nil {
				close(d.stop)
			}
		}
		select {
		case d.free <- b:
		default:
		}
	}
	rc.Emitted, rc.Lost = c.Emitted, c.Lost
	if err2 != nil {
		return rc, err2
	}
	return rc, rerr
}

// read reads the system and queues the statedump's events in order.
func (d *Dumper) read(c *Counts, fs procfs.FS) error {
	if err := d.put(c, Start, d.Seq); err != nil {
		return err
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return fmt.Errorf("statedump: processes: %w", err)
	}
	for _, p := range procs {
		if err := d.process(c, fs, p); err != nil {
			return err
		}
	}
	if err := d.blockDevices(c); err != nil {
		return err
	}
	if err := d.netInterfaces(c); err != nil {
		return err
	}
	if err := d.interrupts(c, fs); err != nil {
		return err
	}
	if err := d.cpus(c, fs); err != nil {
		return err
	}
	if err := d.cgroups(c, fs); err != nil {
		return err
	}
	return d.put(c, End, d.Seq)
}

// procPidNs returns the inode of the pid namespace /proc shows ids of
// (where NSpid has one entry), or 0 when it cannot tell: /proc/1 may be
// closed to us, so it is this process's own namespace when this process
// is at /proc's level.
func (d *Dumper) procPidNs(fs procfs.FS) uint32 {
	if ino, ok := d.r.nsInode(d.Proc + "/1/ns/pid"); ok {
		return ino
	}
	self, err := fs.Self()
	if err != nil {
		return 0
	}
	if st, err := self.NewStatus(); err != nil || len(st.NSpids) != 1 {
		return 0
	}
	ino, _ := d.r.nsInode(d.Proc + "/self/ns/pid")
	return ino
}

// batch is events encoded by the reading thread for the emitting one.
type batch struct {
	names []string
	ends  []int // where each event's payload ends in data
	data  []byte
}

// batchEvents events make a batch: few enough that the emitting thread
// starts early, enough that the channel is not touched per event.
const batchEvents = 128

// errCanceled ends the reading thread when the emitting one stopped.
var errCanceled = errors.New("statedump: canceled")

// put encodes one event and queues it. It fails only on a value of a
// wrong type (a bug here) or when the emitting thread has stopped.
func (d *Dumper) put(_ *Counts, name string, values ...any) error {
	if d.cur == nil {
		select {
		case d.cur = <-d.free:
			d.cur.names, d.cur.ends, d.cur.data = d.cur.names[:0], d.cur.ends[:0], d.cur.data[:0]
		default:
			d.cur = &batch{}
		}
	}
	b := d.cur
	var err error
	b.data, err = d.defs[name].Encode(b.data, values...)
	if err != nil {
		return fmt.Errorf("statedump: %w", err)
	}
	b.names = append(b.names, name)
	b.ends = append(b.ends, len(b.data))
	if len(b.names) >= batchEvents {
		return d.send()
	}
	return nil
}

// send hands the current batch to the emitting thread.
func (d *Dumper) send() error {
	if d.cur == nil || len(d.cur.names) == 0 {
		return nil
	}
	select {
	case d.out <- d.cur:
		d.cur = nil
		return nil
	case <-d.stop:
		return errCanceled
	}
}

// emitBatch emits the events of b in order; an event the emitter refused
// is counted lost, unless recording stopped, which ends the dump.
func (d *Dumper) emitBatch(c *Counts, b *batch) error {
	start := 0
	for i, name := range b.names {
		payload := b.data[start:b.ends[i]]
		start = b.ends[i]
		if err := d.emit.EmitSynth(d.CPU, name, payload); err != nil {
			if d.Stopped != nil && d.Stopped(err) {
				return fmt.Errorf("%w: %w", ErrStopped, err)
			}
			c.Lost++
			continue
		}
		c.Emitted++
	}
	return nil
}

// lttng-statedump-impl.c's enums.
const (
	userThread    = 0
	kernelThread  = 1
	modeUnknown   = 5 // LTTNG_MODE_UNKNOWN: /proc does not say
	submodeUnk    = 1 // LTTNG_UNKNOWN
	statusWaitCPU = 2
	statusZombie  = 4
	statusWait    = 5
	statusRun     = 6
	statusDead    = 7
	statusUnnamed = 0
	pfKthread     = 0x00200000 // include/linux/sched.h PF_KTHREAD
)

// status maps a /proc state letter to lttng_process_status the way
// lttng-statedump-impl.c maps the task state.
func status(state string) int {
	switch state {
	case "R":
		return statusWaitCPU
	case "S", "D", "I":
		return statusWait
	case "Z":
		return statusZombie
	case "X":
		return statusDead
	}
	return statusUnnamed
}

// process emits process_state and the namespace events for every thread
// of p, then its file descriptors.
func (d *Dumper) process(c *Counts, fs procfs.FS, p procfs.Proc) error {
	threads, err := fs.AllThreads(p.PID)
	if err != nil {
		c.Gone++
		return nil
	}
	// Threads share their process's namespaces. A namespace that cannot
	// be read (a kernel thread's may not) is not written; the pid
	// namespace's inode is then 0.
	dir := d.Proc + "/" + strconv.Itoa(p.PID)
	var inodes [len(nsKinds)]uint32
	var have [len(nsKinds)]bool
	for i, k := range nsKinds {
		inodes[i], have[i] = d.r.nsInode(dir + "/ns/" + k)
	}
	// NSpid (/proc/PID/status, which the kernel takes long to write)
	// matters only for a task outside the pid namespace of /proc's
	// init, where it has more than one entry.
	var status0 procfs.ProcStatus
	if !have[0] || inodes[0] != d.rootPidNs {
		status0, _ = p.NewStatus()
	}
	self := d.self
	c.Processes++
	for _, t := range threads {
		st, err := t.Stat()
		if err != nil {
			c.Gone++
			continue
		}
		typ := userThread
		if st.Flags&pfKthread != 0 {
			typ = kernelThread
		}
		stt := status(st.State)
		if t.PID == self { // the dumping thread runs
			stt = statusRun
		}
		err = d.put(c, ProcessState, int32(t.PID), int32(p.PID), int32(st.PPID), st.Comm, int32(typ), int32(modeUnknown), int32(submodeUnk), int32(stt), uint32(st.Processor), uint64(p.PID))
		if err != nil {
			return err
		}
		c.Threads++
		// The pid namespace: NSpid lists the ids from the root's
		// namespace down to the task's own; its level is the depth.
		// Threads share their process's pid namespace: a thread's own
		// status is read only when that is not the root one.
		level, vtid, vpid := 0, t.PID, p.PID
		if len(status0.NSpids) > 1 {
			level = len(status0.NSpids) - 1
			vpid = int(status0.NSpids[level])
			if t.PID == p.PID {
				vtid = vpid
			} else if ts, err := t.NewStatus(); err == nil && len(ts.NSpids) > level {
				vtid = int(ts.NSpids[level])
			}
		}
		vppid := st.PPID
		if level > 0 {
			vppid = 0 // the parent may live in another namespace
		}
		if err := d.put(c, ProcessPidNs, int32(t.PID), int32(vtid), int32(vpid), int32(vppid), int32(level), inodes[0]); err != nil {
			return err
		}
		for i, k := range nsKinds[1:] {
			if have[i+1] {
				if err := d.put(c, nsEvents[k], int32(t.PID), inodes[i+1]); err != nil {
					return err
				}
			}
		}
	}
	return d.fds(c, p)
}

// fds emits one file_descriptor per open descriptor of p. fmode is
// derived from the access mode (FMODE_READ 1, FMODE_WRITE 2): /proc does
// not show the other f_mode bits.
func (d *Dumper) fds(c *Counts, p procfs.Proc) error {
	fds, err := p.FileDescriptors()
	if err != nil {
		return nil // exited, or a kernel thread
	}
	dir := d.Proc + "/" + strconv.Itoa(p.PID)
	for _, fd := range fds {
		n := strconv.Itoa(int(fd))
		target, ok := d.r.readlink(dir + "/fd/" + n)
		if !ok {
			continue // closed meanwhile
		}
		flags, _ := d.r.fdFlags(dir + "/fdinfo/" + n)
		fmode := uint32(1)
		switch flags & 3 {
		case 1:
			fmode = 2
		case 2:
			fmode = 3
		}
		if err := d.put(c, FileDescriptor, uint64(p.PID), int32(p.PID), int32(fd), uint32(flags), fmode, target); err != nil {
			return err
		}
		c.FDs++
	}
	return nil
}

// blockDevices emits one block_device per disk and partition of
// /proc/diskstats; dev is the kernel's dev_t (major << 20 | minor,
// include/linux/kdev_t.h), as block tracepoints carry it.
func (d *Dumper) blockDevices(c *Counts) error {
	bfs, err := blockdevice.NewFS(d.Proc, d.Sys)
	if err != nil {
		return nil
	}
	disks, err := bfs.ProcDiskstats()
	if err != nil {
		return nil // no block layer
	}
	for _, s := range disks {
		dev := s.MajorNumber<<20 | s.MinorNumber
		if err := d.put(c, BlockDevice, uint32(dev), s.DeviceName); err != nil {
			return err
		}
		c.BlockDevices++
	}
	return nil
}

// netInterfaces emits network_interface as lttng-statedump-impl.c's
// lttng_enumerate_device does, for this process's network namespace
// (lttng-modules reads the initial one): one event per IPv4 address of
// an interface that is up, one with address 0 for an interface that is
// down. address_ipv4 is the address as a number (127.0.0.1 is
// 0x7f000001), the value lttng-modules' network-order field decodes to.
func (d *Dumper) netInterfaces(c *Counts) error {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil // no netlink: nothing to say
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 {
			if err := d.put(c, NetInterface, ifc.Name, uint32(0)); err != nil {
				return err
			}
			c.NetInterfaces++
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue // gone meanwhile
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip4 := ipn.IP.To4()
			if ip4 == nil {
				continue
			}
			if err := d.put(c, NetInterface, ifc.Name, binary.BigEndian.Uint32(ip4)); err != nil {
				return err
			}
			c.NetInterfaces++
		}
	}
	return nil
}

// interrupts emits one interrupt per action of each numbered IRQ of
// /proc/interrupts: name is the chip, action the handler's device name.
// The handler thread's id is not in /proc: tid is 0.
func (d *Dumper) interrupts(c *Counts, fs procfs.FS) error {
	self, err := fs.Self()
	if err != nil {
		return nil
	}
	irqs, err := self.Interrupts()
	if err != nil {
		return nil
	}
	for key, irq := range irqs {
		n, err := strconv.ParseUint(key, 10, 32)
		if err != nil {
			continue // NMI, LOC...: not IRQ lines
		}
		chip, _, _ := strings.Cut(strings.TrimSpace(irq.Info), " ")
		for _, action := range strings.Split(irq.Devices, ",") {
			if err := d.put(c, Interrupt, uint32(n), chip, strings.TrimSpace(action), int32(0)); err != nil {
				return err
			}
			c.Interrupts++
		}
	}
	return nil
}

// cpus emits cpu_topology for each CPU of /proc/cpuinfo; lttng-modules
// writes it on x86 only, where cpuinfo has these fields.
func (d *Dumper) cpus(c *Counts, fs procfs.FS) error {
	infos, err := fs.CPUInfo()
	if err != nil {
		return nil
	}
	for _, ci := range infos {
		if ci.VendorID == "" {
			continue
		}
		num := func(s string) uint64 { v, _ := strconv.ParseUint(s, 10, 16); return v }
		vendor, model := ci.VendorID, ci.ModelName
		if model == "" {
			model = "unknown"
		}
		err := d.put(c, CPUTopology, "x86", uint16(ci.Processor), vendor, uint8(num(ci.CPUFamily)), uint8(num(ci.Model)), model,
			uint16(num(ci.PhysicalID)), uint16(num(ci.CoreID)), uint16(ci.CPUCores))
		if err != nil {
			return err
		}
		c.CPUs++
	}
	return nil
}
