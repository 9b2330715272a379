package consumer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/internal/testenv"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// TestPreemptedTasksKeepAll runs two, four, then eight busy tasks a CPU, each
// pinned and making getpid calls, under a session and an ftrace instance
// at once, on each syscall path (the function path on kprobes where
// trampolines run preemptibly). Where tracing programs run preemptibly
// (Linux 7.x: preempt.go; in vmtest's newest guest, its default lazy
// preemption and a full one), a task preempted inside a recorder program
// made the kernel skip the other tasks' events on its CPU: a paths that
// Session.Preemptible does not name must keep every event ftrace keeps,
// and one that it names must count what it did not keep as missed. On
// kernels that call tracing programs with preemption off, every path
// must keep them all.
func TestPreemptedTasksKeepAll(t *testing.T) {
	if !rawSysExpected(t) {
		t.Skip("the raw syscall path needs x86_64, Linux 5.8 and kernel BTF")
	}
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	ncpu := runtime.NumCPU()
	const event, n = "syscalls:sys_enter_getpid", 20000
	t.Logf("preemptible: %+v", recorder.Preemptibility())
	// Each syscall path, and the default one without packet mode (the
	// programs write records, the consumer packets) and on perf buffers.
	ways := []struct {
		name      string
		path      Syscalls
		transport Transport
		noPackets bool
	}{
		{"auto", SyscallsAuto, Ringbuf, false}, {"raw", SyscallsRaw, Ringbuf, false},
		{"tracepoint", SyscallsTracepoint, Ringbuf, false}, {"fentry", SyscallsFentry, Ringbuf, false},
		{"auto-records", SyscallsAuto, Ringbuf, true}, {"auto-perf", SyscallsAuto, Perf, false},
	}
	for _, perCPU := range []int{2, 4, 8} {
		for _, way := range ways {
			path := way.path
			t.Run(fmt.Sprintf("%d-a-cpu/%s", perCPU, way.name), func(t *testing.T) {
				if way.noPackets {
					recorder.Testing.NoPackets = true
					t.Cleanup(func() { recorder.Testing.NoPackets = false })
				}
				var kids []*tracedChild
				var pids []int
				for i := range perCPU * ncpu {
					c := startChild(t, "getpid", n, "KC_CHILD_CPU="+strconv.Itoa(i%ncpu))
					kids = append(kids, c)
					pids = append(pids, c.tid)
				}
				want := len(kids) * n
				inst, enable := ftraceInstance(t, fs, "preempt", []string{event})
				var filter []string
				for _, p := range pids {
					filter = append(filter, "common_pid == "+strconv.Itoa(p))
				}
				ev := filepath.Join(inst, "events", "syscalls", "sys_enter_getpid")
				if err := os.WriteFile(filepath.Join(ev, "filter"), []byte(strings.Join(filter, " || ")), 0); err != nil {
					t.Fatal(err)
				}
				// 16 bytes a record and its header, with room to spare:
				// an instance's buffer, not the machine's.
				kb := max(1024, 3*want*16/ncpu/1024)
				if err := os.WriteFile(filepath.Join(inst, "buffer_size_kb"), []byte(strconv.Itoa(kb)), 0); err != nil {
					t.Fatal(err)
				}
				// The rings as large as ftrace's buffers, at least: with
				// eight busy tasks a CPU the consumer may not run
				// before the children end, as ftrace's reader does not.
				ring := DefaultRingSize
				for ring < kb<<10 {
					ring <<= 1
				}
				cfg := Config{Events: []string{event}, PIDs: pids, Transport: way.transport, Syscalls: path, Dir: t.TempDir(), RingSize: ring}
				s, err := New(cfg)
				if path == SyscallsFentry && errors.Is(err, unix.EPERM) && !testenv.InGuest() {
					for _, c := range kids {
						_ = c.finish()
					}
					t.Skipf("this kernel refuses fentry programs to root (a security policy of the machine): %v", err)
				}
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				dir := cfg.Dir
				_, lossy := s.Preemptible()
				// Packet mode needs the recorder's own rings: BPF_CMPXCHG.
				if major, minor, _ := testenv.KernelRelease(); way.transport == Ringbuf && !way.noPackets && (major > 5 || major == 5 && minor >= 12) {
					if err := s.Packets(); err != nil {
						t.Errorf("packet mode off: %v", err)
					}
				}
				if path == SyscallsFentry && recorder.Preemptibility().On && !s.rec.Kprobes() {
					t.Errorf("the function path is on trampolines, which lose events here: %v", recorder.Preemptibility().Why)
				}
				if s.rec.Kprobes() && len(lossy) > 0 {
					t.Errorf("events on the function path's kprobes named preemptible: %v", lossy)
				}
				if err := enable("1"); err != nil {
					t.Fatal(err)
				}
				if err := s.Start(); err != nil {
					t.Fatal(err)
				}
				errs := make(chan error, len(kids))
				for _, c := range kids {
					go func() { errs <- c.finish() }()
				}
				for range kids {
					if err := <-errs; err != nil {
						t.Fatalf("child: %v", err)
					}
				}
				if err := enable("0"); err != nil {
					t.Fatal(err)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				st, err := s.Stats()
				if err != nil {
					t.Fatal(err)
				}
				var missed uint64
				for _, c := range st {
					missed += c.Missed
				}
				ft, overrun := ftraceEntries(t, inst)
				counts, lost := countEvents(t, dir)
				got := counts[event]
				t.Logf("%d tasks of %d calls: kconsume %d (%d discarded, %d runs missed; programs named preemptible: %v), ftrace %d (overrun %d)", len(kids), n, got, lost, missed, lossy, ft, overrun)
				if ft != want || overrun != 0 {
					t.Fatalf("ftrace kept %d of %d events (overrun %d)", ft, want, overrun)
				}
				switch {
				case len(lossy) == 0 && got != want:
					t.Errorf("kept %d of the %d events ftrace kept, on a path that should keep them all (%d runs missed)", got, want, missed)
				case len(lossy) > 0 && uint64(got)+missed < uint64(want):
					t.Errorf("kept %d of %d events and counted %d runs missed: %d lost uncounted", got, want, missed, uint64(want)-uint64(got)-missed)
				case len(lossy) > 0 && !recorder.Preemptibility().On:
					t.Errorf("events %v named preemptible on a kernel that is not", lossy)
				}
			})
		}
	}
}

// ftraceEntries returns the events an ftrace instance's buffers hold and
// those overwritten, summed over the CPUs (per_cpu/cpuN/stats).
func ftraceEntries(t testing.TB, inst string) (entries, overrun int) {
	t.Helper()
	stats, err := filepath.Glob(filepath.Join(inst, "per_cpu", "cpu*", "stats"))
	if err != nil || len(stats) == 0 {
		t.Fatalf("ftrace instance %s: no per-CPU stats (%v)", inst, err)
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if !ok || err != nil {
				continue
			}
			switch k {
			case "entries":
				entries += n
			case "overrun":
				overrun += n
			}
		}
	}
	return entries, overrun
}
