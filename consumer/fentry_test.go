package consumer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
	"golang.org/x/sys/unix"
)

// TestFentryMatchesSyscall records a child's failing opens through
// fentry and fexit on do_sys_openat2, arguments typed from BTF, beside
// the openat syscall tracepoints in the same session: each call's dfd
// and file name, from the function's arguments, and the value it
// returned, must be the syscall events' own (the name the kernel's
// event copies on Linux 6.19+, the name the child opened before).
func TestFentryMatchesSyscall(t *testing.T) {
	testenv.RequireRoot(t)
	if major, minor, _ := testenv.KernelRelease(); major < 5 || major == 5 && minor < 17 {
		t.Skipf("Linux %d.%d: kconsume's fentry probes need bpf_get_func_arg (Linux 5.17)", major, minor)
	}
	const n = 30
	c := startChild(t, "openat", n)
	cfg := Config{Events: []string{
		"fentry:do_sys_openat2 dfd filename:ustring", "fexit:do_sys_openat2 $retval",
		"syscalls:sys_enter_openat", "syscalls:sys_exit_openat",
	}, PIDs: []int{c.tid}}
	cfg.Dir = t.TempDir()
	s, err := New(cfg)
	if errors.Is(err, unix.EPERM) && !testenv.InGuest() {
		t.Skipf("this kernel refuses fentry programs to root: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	// Trampolines run preemptibly where tracepoints do: the probes are
	// named as events the kernel may skip there, and only there.
	p, lossy := s.Preemptible()
	var fprobes []string
	for _, e := range lossy {
		if strings.HasPrefix(e, probe.SystemFprobes+":") {
			fprobes = append(fprobes, e)
		}
	}
	if p.On != (len(fprobes) == 2) {
		t.Errorf("preemptible %v (%s), fentry and fexit probes named: %v", p.On, p.Why, fprobes)
	}
	recordChild(t, s, c)
	var fentry, enter, fexit, exit []string
	walkTrace(t, cfg.Dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind != relayfmt.EventItem {
			t.Errorf("%v in the trace", it.Kind)
			return
		}
		switch it.Class.Name {
		case "fprobes:do_sys_openat2":
			fentry = append(fentry, fmt.Sprintf("%d %s", field(vals, "dfd").Int(0), field(vals, "filename").Text()))
		case "syscalls:sys_enter_openat":
			// The kernel's copy of the name (Linux 6.19+), else the
			// name the child opened.
			name := fmt.Sprintf("/nonexistent-kcprobe/%d", len(enter))
			if v := field(vals, "__filename_val"); v.Field != nil {
				name = string(v.Text())
			}
			enter = append(enter, fmt.Sprintf("%d %s", int32(field(vals, "dfd").Int(0)), name))
		case "fprobes:do_sys_openat2__return":
			fexit = append(fexit, fmt.Sprint(field(vals, "retval").Int(0)))
		case "syscalls:sys_exit_openat":
			exit = append(exit, fmt.Sprint(field(vals, "ret").Int(0)))
		}
	})
	if len(fentry) != n || fmt.Sprint(fentry) != fmt.Sprint(enter) || fmt.Sprint(fexit) != fmt.Sprint(exit) {
		t.Fatalf("fentry %q\nsys_enter_openat %q\nfexit %q\nsys_exit_openat %q", fentry, enter, fexit, exit)
	}
	t.Logf("%d calls alike: %s, returning %s", n, fentry[0], fexit[0])
}
