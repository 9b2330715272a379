package mounts_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/mounts"
	"github.com/kconsume/kconsume/internal/testenv"
)

// The tests run their scenario in a child of the test binary started in
// a mount namespace of its own (CLONE_NEWNS, mounts made private by
// os/exec), so unmounting tracefs there leaves the host's mounts alone.
const childEnv = "KCONSUME_MOUNTS_CHILD"

func TestMain(m *testing.M) {
	if sc := os.Getenv(childEnv); sc != "" {
		if err := child(sc); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runChild runs scenario sc in a private mount namespace and returns its
// output lines.
func runChild(t *testing.T, sc string) []string {
	t.Helper()
	testenv.RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+sc)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", sc, err, out)
	}
	// The host still has its tracefs: the child's unmounts stayed in its
	// namespace.
	if _, err := tracefs.Find(); err != nil {
		t.Fatalf("host after child %s: %v", sc, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
}

func TestTracefsMountsWhenMissing(t *testing.T) {
	got := runChild(t, "mount")
	want := []string{
		"before: " + tracefs.ErrNotMounted.Error(),
		"did: tracefs at /sys/kernel/tracing",
		"root: /sys/kernel/tracing",
		"sched:sched_switch has prev_pid: true",
		"again: ",
		"root again: /sys/kernel/tracing",
		"in mounts: true",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("child said\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestTracefsWithoutCapSysAdmin(t *testing.T) {
	got := runChild(t, "nocap")
	want := []string{
		"is ErrPrivilege: true",
		"message: tracefs is not mounted and mounting it needs root (CAP_SYS_ADMIN): run as root, or mount -t tracefs tracefs /sys/kernel/tracing",
		"after: " + tracefs.ErrNotMounted.Error(),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("child said\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestTracefsThroughDebugfs(t *testing.T) {
	got := runChild(t, "debugfs")
	want := []string{
		"did: debugfs at /sys/kernel/debug",
		"root: /sys/kernel/debug/tracing",
		"sched:sched_switch has prev_pid: true",
		"again: ",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("child said\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func child(sc string) error {
	if err := unmountTracing(); err != nil {
		return err
	}
	switch sc {
	case "mount":
		_, err := tracefs.Find()
		fmt.Println("before:", err)
		root, did, err := mounts.Tracefs()
		if err != nil {
			return err
		}
		fmt.Println("did:", did)
		report(tracefs.FS{Root: root})
		root, did, err = mounts.Tracefs()
		if err != nil {
			return err
		}
		fmt.Println("again:", did)
		fmt.Println("root again:", root)
		types, err := mountTypes()
		if err != nil {
			return err
		}
		fmt.Println("in mounts:", types[mounts.TracefsDir] == "tracefs")
	case "nocap":
		// Capabilities are per thread: drop CAP_SYS_ADMIN from this one
		// and ask from it.
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return err
		}
		data[0].Effective &^= 1 << 21
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return err
		}
		_, _, err := mounts.Tracefs()
		fmt.Println("is ErrPrivilege:", errors.Is(err, mounts.ErrPrivilege))
		fmt.Println("message:", err)
		_, err = tracefs.Find()
		fmt.Println("after:", err)
	case "debugfs":
		// What Tracefs does on a kernel without tracefs.
		did, err := mounts.MountAt("debugfs", mounts.DebugfsDir)
		if err != nil {
			return err
		}
		fmt.Println("did:", did)
		fs, err := tracefs.Find()
		if err != nil {
			return err
		}
		report(fs)
		did, err = mounts.MountAt("debugfs", mounts.DebugfsDir)
		if err != nil {
			return err
		}
		fmt.Println("again:", did)
	default:
		return fmt.Errorf("unknown scenario %q", sc)
	}
	return nil
}

// report prints where fs is and whether it reads a real event's format.
func report(fs tracefs.FS) {
	fmt.Println("root:", fs.Root)
	f, err := fs.Format(tracefs.Event{System: "sched", Name: "sched_switch"})
	has := err == nil && slices.ContainsFunc(f.Fields, func(fl tracefs.Field) bool { return fl.Name == "prev_pid" })
	fmt.Println("sched:sched_switch has prev_pid:", has)
}

// unmountTracing detaches every tracefs and debugfs mount of this
// namespace, deepest first, until none is left (a debugfs holds the
// tracefs automount at tracing/).
func unmountTracing() error {
	for range 10 {
		types, err := mountTypes()
		if err != nil {
			return err
		}
		var dirs []string
		for dir, typ := range types {
			if typ == "tracefs" || typ == "debugfs" {
				dirs = append(dirs, dir)
			}
		}
		if len(dirs) == 0 {
			return nil
		}
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			if err := unix.Unmount(d, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("umount %s: %w", d, err)
			}
		}
	}
	return errors.New("tracing mounts keep coming back")
}

// mountTypes returns this namespace's mount points and their types.
func mountTypes() (map[string]string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fl := strings.Fields(sc.Text()); len(fl) >= 3 {
			out[filepath.Clean(fl[1])] = fl[2]
		}
	}
	return out, sc.Err()
}
