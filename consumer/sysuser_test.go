package consumer

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/kconsume/kconsume/consumer/recorder"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// The "sysuser" child's paths. sysLong is longer than the 63 bytes the
// kernel keeps by default, sys63 as long and sys64 one more.
var (
	sysPath  = "/nonexistent-kc/user-path"
	sysLong  = "/nonexistent-kc/" + strings.Repeat("a-long-path-", 8)
	sys63    = "/nonexistent-kc/" + strings.Repeat("x", 63-16)
	sys64    = sys63 + "y"
	sysOdd   = "/nonexistent-kc/\x01\t\x7f\x80\x9f\xa0\xff-odd"
	sysMemfd = "/nonexistent-kc/memfd-path"
)

// sysUserCalls makes the "sysuser" child's syscalls, each failing or
// harmless, with user-space data of every kind the kernel copies: write
// buffers short, long with NULs and none, strings short, cut, with
// unprintable bytes, two and three to a call, memory the task never
// touched (an anonymous page, and a file page not mapped in yet), and
// bad pointers. It returns the child's exit code.
func sysUserCalls() int {
	cstr := func(s string) unsafe.Pointer { return unsafe.Pointer(&append([]byte(s), 0)[0]) }
	fd, err := unix.Open("/dev/null", unix.O_WRONLY, 0)
	if err != nil {
		return 20
	}
	// Every byte below 0x20 and from 0x80: nothing the kernel prints as
	// text after the bytes' hex.
	var odd []byte
	for c := 0; c < 256; c++ {
		if c < 0x20 || c >= 0x80 {
			odd = append(odd, byte(c))
		}
	}
	anon, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 21
	}
	mfd, err := unix.MemfdCreate("kc-sysuser", 0)
	if err != nil {
		return 22
	}
	if _, err := unix.Write(mfd, append([]byte(sysMemfd), 0)); err != nil {
		return 23
	}
	file, err := unix.Mmap(mfd, 0, 4096, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 24
	}
	bad := uintptr(0x10)
	write := func(p uintptr, n int) {
		_, _, _ = unix.Syscall(unix.SYS_WRITE, uintptr(fd), p, uintptr(n))
	}
	openat := func(p uintptr) {
		dirfd := unix.AT_FDCWD
		if fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), p, unix.O_RDONLY, 0, 0, 0); errno == 0 {
			_ = unix.Close(int(fd))
		}
	}
	hello := []byte("hello\n")
	write(uintptr(unsafe.Pointer(&hello[0])), len(hello))
	write(uintptr(unsafe.Pointer(&odd[0])), len(odd))
	write(uintptr(unsafe.Pointer(&odd[0])), 0)
	write(bad, 5)
	write(uintptr(unsafe.Pointer(&anon[0])), 10)
	for _, s := range []string{sysPath, sysLong, sys63, sys64, sysOdd} {
		openat(uintptr(cstr(s)))
	}
	openat(bad)
	openat(uintptr(unsafe.Pointer(&file[0])))
	_, _, _ = unix.Syscall(unix.SYS_RENAME, uintptr(cstr(sysPath)), uintptr(cstr(sysLong)), 0)
	_, _, _ = unix.Syscall6(unix.SYS_MOUNT, uintptr(cstr("kc-dev")), uintptr(cstr(sysPath)), uintptr(cstr("kc-nofs")), 0, 0, 0)
	// A host name of the child's own: a new UTS namespace, for this
	// thread alone.
	if err := unix.Unshare(unix.CLONE_NEWUTS); err != nil {
		return 25
	}
	_, _, _ = unix.Syscall(unix.SYS_SETHOSTNAME, uintptr(cstr("kc-host")), 7, 0)
	return 0
}

// sysUserEvents are the events TestSyscallUserFields records.
var sysUserEvents = []string{"syscalls:sys_enter_write", "syscalls:sys_enter_openat", "syscalls:sys_enter_rename", "syscalls:sys_enter_mount", "syscalls:sys_enter_sethostname"}

// ftraceSysLine matches a syscall event's line in an ftrace instance's
// trace file (kernel/trace/trace_syscalls.c: print_syscall_enter): its
// syscall and its arguments.
var ftraceSysLine = regexp.MustCompile(`: sys_(\w+)\((.*)\)$`)

// ftraceUserVal matches one argument with user-space data in such a
// line: a string ("NAME: VALUE \"TEXT\"") or bytes ("NAME: VALUE (HEX:HEX)").
var ftraceUserVal = regexp.MustCompile(`(\w+): (?:0x[0-9a-f]+|\d+) (?:"([^"]*)"|\(([0-9a-f:]*)(?:, \.\.\.)?\))`)

// TestSyscallUserFields records the syscall events whose user-space
// fields the kernel fills (Linux 6.19+) while an ftrace instance records
// them too, and compares the values, call by call: the kernel's own
// printing of its events is the judge. With packet mode and without.
func TestSyscallUserFields(t *testing.T) {
	testenv.RequireRoot(t)
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	write, err := fs.Format(tracefs.Event{System: "syscalls", Name: "sys_enter_write"})
	if err != nil {
		t.Fatal(err)
	}
	buf, hasBuf, err := fs.SyscallUserBufSize()
	if err != nil {
		t.Fatal(err)
	}
	if u, err := recorder.SysUserOf(write); err != nil || u == nil {
		if hasBuf {
			t.Fatalf("the kernel has syscall_user_buf_size, but sys_enter_write's user-space field: %+v, %v", u, err)
		}
		_, _, rel := testenv.KernelRelease()
		t.Skipf("Linux %s: syscall events without user-space fields (Linux 6.19+)", rel)
	}
	if buf != recorder.SysUserDefault {
		t.Fatalf("syscall_user_buf_size is %d: the test expects the default %d", buf, recorder.SysUserDefault)
	}
	// kc_sys_user_fault records the events, or, with --syscalls
	// tracepoint, a cgroup filter (which it cannot test) or on a
	// preemptible kernel, their tracepoints do; "fault-records" has it
	// record them there too (one task: no other run to skip).
	// "chains" records a kernel call chain and contexts with each event,
	// which only their tracepoints' program writes: they keep their
	// tracepoints even where kc_sys_user_fault would record them.
	for _, v := range []struct {
		name                string
		sys                 Syscalls
		cgroup, rec, chains bool
	}{{"auto", SyscallsAuto, false, false, false}, {"tracepoint", SyscallsTracepoint, false, false, false}, {"cgroup", SyscallsAuto, true, false, false},
		{"fault-records", SyscallsAuto, false, true, false}, {"chains", SyscallsAuto, false, true, true}} {
		if v.rec && !v.chains && !recorder.Preemptibility().On {
			continue // "auto" records that way here
		}
		for _, pkt := range []bool{true, false} {
			if v.chains && pkt {
				continue // call chains and contexts take packet mode off
			}
			t.Run(fmt.Sprintf("%s/packets=%v", v.name, pkt), func(t *testing.T) {
				recorder.Testing.NoPackets, recorder.Testing.UserFaultRecords = !pkt, v.rec
				defer func() { recorder.Testing.NoPackets, recorder.Testing.UserFaultRecords = false, false }()
				testSyscallUserFields(t, fs, v.sys, v.cgroup, v.chains)
			})
		}
	}
}

func testSyscallUserFields(t *testing.T, fs tracefs.FS, sys Syscalls, cgroup, chains bool) {
	var cg string
	if cgroup {
		cg = filepath.Join(cgroup2Root(t), fmt.Sprintf("kconsume-sysuser-%d", os.Getpid()))
		if err := os.Mkdir(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		// Registered first, so run last: after the child is gone.
		t.Cleanup(func() { _ = os.Remove(cg) })
	}
	c := startChild(t, "sysuser", 1)
	if cgroup {
		if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(fmt.Sprint(c.cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	inst, enableAll := ftraceInstance(t, fs, "sysuser", sysUserEvents)
	enable := func(v string) {
		t.Helper()
		if err := enableAll(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(inst, "set_event_pid"), []byte(fmt.Sprint(c.tid)), 0); err != nil {
		t.Fatal(err)
	}
	enable("1")
	// Both filters a sleepable program can test.
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c.tid))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Events: sysUserEvents, PIDs: []int{c.tid}, Comms: []string{strings.TrimSpace(string(comm))}, Syscalls: sys, Cgroup: cg}
	if chains {
		cfg.Stacks, cfg.Contexts = []EventStack{{Stack: StackKernel}}, []string{"procname", "tid"}
	}
	s, dir := newTestSession(t, cfg)
	if got := s.Packets() == nil; got != !recorder.Testing.NoPackets && pktExpected(t, s) {
		t.Fatalf("packet mode %v, want %v: %v", got, !recorder.Testing.NoPackets, s.Packets())
	}
	// Where the kernel takes sleepable programs on sys_enter, the
	// recorder pages user memory in as the kernel does.
	paging := recorder.UserFaultProbe() == nil
	if why := s.UserFault(); paging && why != nil {
		t.Fatalf("the kernel takes sleepable programs on sys_enter, but the recorder does not page user memory in: %v", why)
	}
	// There the program that pages memory in records the events too,
	// unless they are to keep their tracepoints.
	byFault := paging && sys != SyscallsTracepoint && !cgroup && !chains && (!s.rec.Preempt().On || recorder.Testing.UserFaultRecords)
	for i, p := range s.rec.Progs()[:len(s.events)] {
		if (p == gen.RingbufProgKcSysUserFault) != byFault {
			t.Fatalf("%s recorded by %q; by kc_sys_user_fault: %v, want %v", s.events[i].FullName(), p, !byFault, byFault)
		}
	}
	if raw, _ := s.RawSyscalls(); byFault && len(raw) != len(s.events) {
		t.Fatalf("raw syscall path: %v, want all of %d events", raw, len(s.events))
	}
	stats := recordChild(t, s, c)
	enable("0")

	var ours []string
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Fatalf("%v in the trace", it.Kind)
		}
		line := strings.TrimPrefix(it.Class.Name, "syscalls:sys_enter_")
		if chains {
			// The thread's, and a chain through the syscall's entry.
			tid, name := field(vals, "tid").Int(0), string(field(vals, "procname").Text())
			if n := field(vals, "callstack_kernel").Len(); tid != int64(c.tid) || name != strings.TrimSpace(string(comm)) || n < 2 {
				t.Errorf("%s: tid %d procname %q and a kernel chain of %d frames; want %d, %q and 2 or more", it.Class.Name, tid, name, n, c.tid, strings.TrimSpace(string(comm)))
			}
		}
		for _, v := range vals {
			name, suffixed := strings.CutSuffix(v.Field.Name, "_val")
			name, prefixed := strings.CutPrefix(name, "__")
			if !suffixed || !prefixed {
				continue
			}
			if v.Field.Kind == relayfmt.Sequence {
				hex := make([]string, v.Len())
				for i := range hex {
					hex[i] = fmt.Sprintf("%02x", v.Uint(i))
				}
				line += fmt.Sprintf(" %s=(%s)", name, strings.Join(hex, ":"))
			} else {
				line += fmt.Sprintf(" %s=%q", name, v.Text())
			}
		}
		ours = append(ours, line)
	})
	text, err := os.ReadFile(filepath.Join(inst, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	var theirs []string
	for _, l := range strings.Split(string(text), "\n") {
		m := ftraceSysLine.FindStringSubmatch(l)
		if m == nil || strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		line := m[1]
		args := m[2]
		for _, v := range ftraceUserVal.FindAllStringSubmatchIndex(args, -1) {
			if name := args[v[2]:v[3]]; v[4] >= 0 {
				line += fmt.Sprintf(" %s=%q", name, args[v[4]:v[5]])
			} else {
				line += fmt.Sprintf(" %s=(%s)", name, args[v[6]:v[7]])
			}
		}
		theirs = append(theirs, line)
	}
	if len(ours) != len(theirs) || len(ours) < 15 {
		t.Fatalf("%d events recorded, the ftrace instance %d (want 15 or more):\nours:   %q\ntheirs: %q", len(ours), len(theirs), ours, theirs)
	}
	for i := range ours {
		if ours[i] != theirs[i] {
			t.Errorf("call %d: recorded %s, the kernel's event %s", i, ours[i], theirs[i])
		}
	}
	// The values themselves, apart from the kernel's.
	for _, want := range []string{
		`write buf=(68:65:6c:6c:6f:0a)`,
		`write buf=()`,
		`write buf=(00:00:00:00:00:00:00:00:00:00)`,
		fmt.Sprintf(`openat filename=%q`, sysPath),
		fmt.Sprintf(`openat filename=%q`, sysLong[:63]+"..."),
		fmt.Sprintf(`openat filename=%q`, sys63),
		fmt.Sprintf(`openat filename=%q`, sys64[:63]+"..."),
		fmt.Sprintf(`openat filename=%q`, "/nonexistent-kc/.....\xa0\xff-odd"),
		fmt.Sprintf(`openat filename=%q`, sysMemfd),
		fmt.Sprintf(`rename oldname=%q newname=%q`, sysPath, sysLong[:63]+"..."),
		fmt.Sprintf(`mount dev_name="kc-dev" dir_name=%q type="kc-nofs"`, sysPath),
		`sethostname name="kc-host"`,
	} {
		if !slices.Contains(ours, want) {
			t.Errorf("no %s among %q", want, ours)
		}
	}
	var odd bytes.Buffer
	for c := 0; c < 63; c++ {
		if odd.Len() > 0 {
			odd.WriteByte(':')
		}
		b := c
		if c >= 0x20 {
			b = c - 0x20 + 0x80
		}
		fmt.Fprintf(&odd, "%02x", b)
	}
	if w := "write buf=(" + odd.String() + ")"; !slices.Contains(ours, w) {
		t.Errorf("no %s", w)
	}
	var unread uint64
	for _, st := range stats {
		unread += st.UserUnread
	}
	// The two bad pointers; where user memory is not paged in, the
	// untouched pages too, recorded empty.
	if paging && unread != 2 || unread < 2 {
		t.Errorf("%d user-space values unread, want 2 (paging in: %v)", unread, paging)
	}
	if lines, _ := testenv.RunBT2(t, dir); len(lines) != len(ours) {
		t.Fatalf("babeltrace2 read %d events, our reader %d", len(lines), len(ours))
	}
}
