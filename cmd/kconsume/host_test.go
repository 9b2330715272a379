package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/testenv"
)

func TestKernelCheck(t *testing.T) {
	noRing := errors.New("map type RingBuf not supported")
	btfObj := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{"on_fork": {Name: "on_fork", SectionName: "tp_btf/sched_process_fork"}}}
	tpObj := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{"on_fork": {Name: "on_fork", SectionName: "tracepoint/sched/sched_process_fork"}}}
	for _, tc := range []struct {
		name string
		k    kernel
		cfg  consumer.Config
		want string // "" : no error
	}{
		{"modern", kernel{release: "6.1.0", btf: true}, consumer.Config{Transport: consumer.Ringbuf, Syscalls: consumer.SyscallsRaw, Objects: []*ebpf.CollectionSpec{btfObj}}, ""},
		{"old auto", kernel{release: "5.4.0", ringbuf: noRing}, consumer.Config{}, ""},
		{"old ringbuf", kernel{release: "5.4.0", btf: true, ringbuf: noRing}, consumer.Config{Transport: consumer.Ringbuf}, "--transport ringbuf needs BPF ring buffers (BPF_MAP_TYPE_RINGBUF, Linux 5.8 with CONFIG_BPF_SYSCALL), which this kernel (5.4.0) lacks"},
		{"old global", kernel{release: "5.4.0", btf: true, ringbuf: noRing}, consumer.Config{Global: true}, "--global needs BPF ring buffers"},
		{"no btf raw", kernel{release: "6.1.0"}, consumer.Config{Syscalls: consumer.SyscallsRaw}, "--syscalls raw: this kernel (6.1.0) has no BTF (/sys/kernel/btf/vmlinux is missing): it needs one built with CONFIG_DEBUG_INFO_BTF=y"},
		{"no btf fentry", kernel{release: "6.1.0"}, consumer.Config{Syscalls: consumer.SyscallsFentry}, "--syscalls fentry: this kernel (6.1.0) has no BTF (/sys/kernel/btf/vmlinux is missing): it needs one built with CONFIG_DEBUG_INFO_BTF=y"},
		{"no btf auto", kernel{release: "6.1.0"}, consumer.Config{}, ""},
		{"no btf tp_btf object", kernel{release: "6.1.0"}, consumer.Config{Objects: []*ebpf.CollectionSpec{tpObj, btfObj}}, "BPF object 2: program on_fork (tp_btf): this kernel (6.1.0) has no BTF"},
		{"no btf tracepoint object", kernel{release: "6.1.0"}, consumer.Config{Objects: []*ebpf.CollectionSpec{tpObj}}, ""},
	} {
		err := tc.k.check(&tc.cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, consumer.ErrNotSupported)):
			t.Errorf("%s: got %v, want ErrNotSupported with %q", tc.name, err, tc.want)
		}
	}
	why := errors.New("kernel BTF: not supported")
	if got := (kernel{release: "6.1.0"}).explain(why).Error(); !strings.Contains(got, "CONFIG_DEBUG_INFO_BTF=y") {
		t.Errorf("explain without BTF: %s", got)
	}
	if got := (kernel{release: "6.1.0", btf: true}).explain(why); got != why {
		t.Errorf("explain with BTF: %v", got)
	}
}

// unmountTracing is a shell line that detaches every tracefs and debugfs
// mount, deepest first; run only in a private mount namespace.
const unmountTracing = `for m in $(awk '$3=="tracefs"||$3=="debugfs"{print $2}' /proc/self/mounts | sort -r); do umount -l "$m" || exit 1; done; `

// inPrivateMounts runs line in sh in a mount namespace of its own (made
// private by os/exec), so unmounting there leaves the host alone.
func inPrivateMounts(t *testing.T, line string) (string, int) {
	t.Helper()
	cmd := exec.Command("sh", "-c", line)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	return runShell(t, cmd)
}

// TestCommandsMountTracefs runs list and record where tracefs is not
// mounted: each mounts it, says so in one line, and works; a user
// without CAP_SYS_ADMIN gets the reason and nothing mounted.
func TestCommandsMountTracefs(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.KconsumeBin(t)
	dir := filepath.Join(t.TempDir(), "t")
	const said = "mounted tracefs at /sys/kernel/tracing (left mounted, as trace-cmd does)"
	out, code := inPrivateMounts(t, unmountTracing+bin+" list sched:sched_switch && grep -c ' /sys/kernel/tracing tracefs ' /proc/self/mounts")
	if code != 0 || out != "kconsume list: "+said+"\nsched:sched_switch\n1\n" {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	out, code = inPrivateMounts(t, unmountTracing+bin+" record -q -o "+dir+" --session mnt"+filepath.Base(filepath.Dir(dir))+" -e sched:sched_switch -- sleep 0.1")
	if code != 0 || !strings.HasPrefix(out, "kconsume record: "+said+"\n") {
		t.Fatalf("record: exit %d\n%s", code, out)
	}
	// A sleeping command switches out at least once: a quiet machine and
	// recorder may switch no task in a fixed 300 ms.
	if lines, _ := testenv.RunBT2(t, dir); len(lines) == 0 {
		t.Fatal("record after mounting: no events")
	}
	// setpriv drops every capability; nobody may not mount.
	out, code = inPrivateMounts(t, unmountTracing+"setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all "+bin+" list sched:sched_switch; echo exit $?; grep -c tracefs /proc/self/mounts")
	want := "kconsume list: tracefs is not mounted and mounting it needs root (CAP_SYS_ADMIN): run as root, or mount -t tracefs tracefs /sys/kernel/tracing\nexit 1\n0\n"
	if code != 1 || out != want {
		t.Fatalf("list without CAP_SYS_ADMIN: exit %d\n%s\nwant\n%s", code, out, want)
	}
}
