package statedump

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/synth"
	"github.com/prometheus/procfs"
)

// collector keeps what a statedump emits, decoded by the event's own
// relayfmt class.
type collector struct {
	events map[string]*synth.Event
	got    []emitted
}

type emitted struct {
	name   string
	values map[string]relayfmt.Value
}

func newCollector() *collector {
	c := &collector{events: map[string]*synth.Event{}}
	for _, e := range Events() {
		c.events[e.Name] = e
	}
	return c
}

func (c *collector) EmitSynth(cpu int, name string, payload []byte) error {
	e := c.events[name]
	if e == nil {
		return fmt.Errorf("no event %s", name)
	}
	cls, err := relayfmt.NewEventClass(0, name, e.RelayFields())
	if err != nil {
		return err
	}
	vals, err := cls.Decode(append([]byte(nil), payload...), nil)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	m := map[string]relayfmt.Value{}
	for _, v := range vals {
		m[v.Field.Name] = v
	}
	c.got = append(c.got, emitted{name, m})
	return nil
}

// TestDumpSelf: this process, each of its threads and a file it holds
// open are in the dump, with the values /proc gives; start and end
// enclose everything.
func TestDumpSelf(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "held-open.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := newCollector()
	counts, err := (&Dumper{Seq: 3}).Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.got) != counts.Emitted || counts.Lost != 0 {
		t.Fatalf("counts %+v, %d events", counts, len(c.got))
	}
	if c.got[0].name != Start || c.got[len(c.got)-1].name != End || c.got[0].values["seq"].Uint(0) != 3 {
		t.Fatalf("first %s, last %s", c.got[0].name, c.got[len(c.got)-1].name)
	}
	pid := os.Getpid()
	threads, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var mine, fd, kthread, running, lo, cgroup int
	// This process's cgroup v2 directory, whose id the dump must pair
	// with its path.
	pfs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Fatal(err)
	}
	cgRoot := cgroup2Root(pfs)
	var cgPath string
	var cgID uint64
	if cgRoot != "" {
		self, err := pfs.Self()
		if err != nil {
			t.Fatal(err)
		}
		cgs, err := self.Cgroups()
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range cgs {
			if g.HierarchyID == 0 {
				cgPath = g.Path
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(cgRoot, cgPath), &st); err != nil {
			t.Fatal(err)
		}
		cgID = st.Ino
	}
	// lo is 127.0.0.1 when up; a VM test guest's init may leave it down,
	// which lttng-modules writes as address 0.
	loAddr := uint64(0x7f000001)
	if ifc, err := net.InterfaceByName("lo"); err != nil {
		t.Fatal(err)
	} else if ifc.Flags&net.FlagUp == 0 {
		loAddr = 0
	}
	for _, e := range c.got {
		switch e.name {
		case ProcessState:
			if e.values["pid"].Int(0) == int64(pid) {
				mine++
				if e.values["ppid"].Int(0) != int64(os.Getppid()) || e.values["type"].Int(0) != userThread {
					t.Errorf("own thread: %v", e.values)
				}
				if e.values["status"].Int(0) == statusRun {
					running++
				}
			}
			if e.values["tid"].Int(0) == 2 && e.values["type"].Int(0) == kernelThread && e.values["ppid"].Int(0) == 0 {
				kthread++
			}
		case Cgroup:
			if e.values["id"].Uint(0) == cgID && string(e.values["path"].Text()) == cgPath {
				cgroup++
			}
		case NetInterface:
			if string(e.values["name"].Text()) == "lo" && e.values["address_ipv4"].Uint(0) == loAddr {
				lo++
			}
		case FileDescriptor:
			if e.values["pid"].Int(0) == int64(pid) && e.values["fd"].Int(0) == int64(f.Fd()) {
				fd++
				if string(e.values["filename"].Text()) != f.Name() || e.values["fmode"].Uint(0) != 3 {
					t.Errorf("file descriptor %d: %v", f.Fd(), e.values)
				}
			}
		}
	}
	if mine < len(threads)-2 || mine == 0 {
		t.Errorf("%d of this process's %d threads dumped", mine, len(threads))
	}
	if running != 1 {
		t.Errorf("%d threads of this process marked running, want the dumping one", running)
	}
	if fd != 1 {
		t.Errorf("the file held open appears %d times", fd)
	}
	if lo != 1 {
		t.Errorf("lo with address %#x appears %d times (interfaces: %d)", loAddr, lo, counts.NetInterfaces)
	}
	if cgRoot != "" && (cgroup != 1 || counts.Cgroups == 0) {
		t.Errorf("this process's cgroup %s (id %d) appears %d times of %d", cgPath, cgID, cgroup, counts.Cgroups)
	}
	if kthread != 1 {
		t.Errorf("kthreadd (tid 2) as a kernel thread: %d", kthread)
	}
	if counts.BlockDevices == 0 && fileHas("/proc/diskstats") || counts.Interrupts == 0 || counts.CPUs == 0 && strings.Contains(readFile("/proc/cpuinfo"), "vendor_id") {
		t.Errorf("counts %+v", counts)
	}
}

func fileHas(p string) bool { return strings.TrimSpace(readFile(p)) != "" }

func readFile(p string) string { b, _ := os.ReadFile(p); return string(b) }

// TestDumpThroughSession: the statedump goes through a real session's
// injector; a stopped session ends it with ErrStopped.
func TestDumpThroughSession(t *testing.T) {
	testenv.RequireRoot(t)
	s, err := consumer.New(consumer.Config{Events: Patterns(), Synth: Events(), Sink: &relayfmt.DiscardSink{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := &Dumper{Stopped: func(err error) bool { return errors.Is(err, consumer.ErrStopped) }}
	if _, err := d.Run(s); !errors.Is(err, ErrStopped) {
		t.Fatalf("dump into a stopped session: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := d.Run(s)
	if err != nil || c.Lost != 0 || c.Threads == 0 {
		t.Fatalf("dump: %+v %v", c, err)
	}
}

// BenchmarkStatedump1000 dumps a system with 1,000 more processes (each
// with stdin, stdout and stderr open): through a real session (the
// issue's target: under a second per dump), and into a collector that
// decodes each event (the cost of reading /proc alone).
func BenchmarkStatedump1000(b *testing.B) {
	testenv.RequireRoot(b)
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	for i := 0; i < 1000; i++ {
		p := exec.Command("sleep", "600")
		if err := p.Start(); err != nil {
			b.Fatal(err)
		}
		procs = append(procs, p)
	}
	b.Run("session", func(b *testing.B) {
		s, err := consumer.New(consumer.Config{Events: Patterns(), Synth: Events(), Sink: &relayfmt.DiscardSink{}, RingSize: 16 << 20})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if err := s.Start(); err != nil {
			b.Fatal(err)
		}
		dump(b, s)
	})
	b.Run("read", func(b *testing.B) { dump(b, newCollector()) })
}

func dump(b *testing.B, e Emitter) {
	var c Counts
	var err error
	cpu0 := cpuTime(b)
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if col, ok := e.(*collector); ok {
			col.got = col.got[:0]
		}
		if c, err = (&Dumper{}).Run(e); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(time.Since(start).Seconds()/float64(b.N), "s/dump")
	// The CPU time the process spent (the session's drainer included):
	// what the dump costs, which the wall time shows only on a quiet
	// machine.
	b.ReportMetric((cpuTime(b)-cpu0).Seconds()/float64(b.N), "cpu-s/dump")
	b.ReportMetric(float64(c.Processes), "processes")
	b.ReportMetric(float64(c.Emitted), "events")
	b.ReportMetric(float64(c.Lost), "lost")
}

// cpuTime returns the user and system time of this process so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestDumpPidNamespace: a process in a new pid namespace shows at level 1
// with its own ids there (it is pid 1 of its namespace).
func TestDumpPidNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	un, err := exec.LookPath("unshare")
	if err != nil {
		testenv.Missing(t, "unshare (util-linux) is required: %v", err)
	}
	cmd := exec.Command(un, "--pid", "--fork", "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// The sleep is unshare's child.
	var child int
	for i := 0; i < 300 && child == 0; i++ {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		fmt.Sscan(string(b), &child)
		if child == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if child == 0 {
		t.Fatal("unshare started no child")
	}
	c := newCollector()
	if _, err := (&Dumper{}).Run(c); err != nil {
		t.Fatal(err)
	}
	for _, e := range c.got {
		if e.name == ProcessPidNs && e.values["tid"].Int(0) == int64(child) {
			if e.values["ns_level"].Int(0) != 1 || e.values["vtid"].Int(0) != 1 || e.values["vpid"].Int(0) != 1 || e.values["vppid"].Int(0) != 0 {
				t.Fatalf("pid_ns of %d: %v", child, e.values)
			}
			return
		}
	}
	t.Fatalf("no pid_ns event for %d", child)
}

// stopAfter accepts n events, then refuses every one as stopped.
type stopAfter struct {
	n int
	c *collector
}

var errTestStopped = errors.New("test: stopped")

func (s *stopAfter) EmitSynth(cpu int, name string, payload []byte) error {
	if s.n == 0 {
		return errTestStopped
	}
	s.n--
	return s.c.EmitSynth(cpu, name, payload)
}

// TestDumpStopsMidway: recording that stops in the middle of a dump (past
// the first batches) ends it with ErrStopped after exactly the events
// accepted, in order from start, and the reading thread ends too.
func TestDumpStopsMidway(t *testing.T) {
	before := runtime.NumGoroutine()
	e := &stopAfter{n: 300, c: newCollector()}
	d := &Dumper{Stopped: func(err error) bool { return errors.Is(err, errTestStopped) }}
	c, err := d.Run(e)
	if !errors.Is(err, ErrStopped) {
		t.Fatalf("Run: %v, want ErrStopped", err)
	}
	if c.Emitted != 300 || len(e.c.got) != 300 || e.c.got[0].name != Start {
		t.Fatalf("counts %+v, %d events collected, first %v", c, len(e.c.got), e.c.got[0].name)
	}
	for i := 0; runtime.NumGoroutine() > before; i++ {
		if i == 100 {
			t.Fatalf("%d goroutines, %d before the dump: the reader did not end", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
