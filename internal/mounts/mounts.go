// Package mounts makes the kernel's tracing filesystem available to the
// commands that need it: it finds tracefs and, when none is mounted and
// the process may mount, mounts it and leaves it mounted, as trace-cmd
// (libtracefs, tracefs_tracing_dir) does.
package mounts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/prometheus/procfs"
)

// Where tracefs and debugfs are mounted when missing: the kernel creates
// these mount points in sysfs (fs/tracefs/inode.c, fs/debugfs/inode.c).
const (
	TracefsDir = "/sys/kernel/tracing"
	DebugfsDir = "/sys/kernel/debug"
)

// capSysAdmin is CAP_SYS_ADMIN (include/uapi/linux/capability.h), which
// mount(2) needs.
const capSysAdmin = 21

// ErrNotMounted is returned by FindTracefs when no tracefs is mounted.
var ErrNotMounted = errors.New("tracefs is not mounted (mount -t tracefs tracefs /sys/kernel/tracing)")

// FindTracefs returns the root of the mounted tracefs: a tracefs mount,
// or the tracing directory of a debugfs mount on kernels that only have
// that. It fails with ErrNotMounted when there is neither.
func FindTracefs() (string, error) {
	mounts, err := procfs.GetMounts()
	if err != nil {
		return "", fmt.Errorf("tracefs: reading mounts: %w", err)
	}
	var debugfs string
	for _, m := range mounts {
		switch m.FSType {
		case "tracefs":
			if hasEvents(m.MountPoint) {
				return m.MountPoint, nil
			}
		case "debugfs":
			if debugfs == "" && hasEvents(filepath.Join(m.MountPoint, "tracing")) {
				debugfs = filepath.Join(m.MountPoint, "tracing")
			}
		}
	}
	if debugfs != "" {
		return debugfs, nil
	}
	return "", ErrNotMounted
}

func hasEvents(root string) bool {
	_, err := os.Stat(filepath.Join(root, "events"))
	return err == nil
}

// ErrPrivilege is returned by Tracefs when tracefs is missing and the
// process lacks CAP_SYS_ADMIN to mount it.
var ErrPrivilege = errors.New("mounting it needs root (CAP_SYS_ADMIN)")

// Tracefs returns the root of the mounted tracefs. When none is mounted
// and the process has CAP_SYS_ADMIN, it mounts tracefs at /sys/kernel/tracing,
// or, on a kernel without tracefs (before 4.1), debugfs at
// /sys/kernel/debug whose tracing directory then serves, and leaves it
// mounted. did says what it mounted ("tracefs at /sys/kernel/tracing"),
// empty when nothing was. It fails, mounting nothing, with ErrPrivilege
// when the process may not mount, or when the kernel has no tracing
// filesystem (naming CONFIG_TRACING) or the mount fails.
func Tracefs() (root, did string, err error) {
	root, err = FindTracefs()
	if !errors.Is(err, ErrNotMounted) {
		return root, "", err
	}
	if !hasCap(capSysAdmin) {
		return "", "", fmt.Errorf("tracefs is not mounted and %w: run as root, or mount -t tracefs tracefs %s", ErrPrivilege, TracefsDir)
	}
	kinds, err := filesystems()
	if err != nil {
		return "", "", err
	}
	switch {
	case kinds["tracefs"]:
		did, err = mountAt("tracefs", TracefsDir)
	case kinds["debugfs"]:
		did, err = mountAt("debugfs", DebugfsDir)
	default:
		return "", "", errors.New("this kernel has neither tracefs nor debugfs: it needs CONFIG_TRACING (trace events) and CONFIG_DEBUG_FS or tracefs")
	}
	if err != nil {
		return "", "", err
	}
	root, err = FindTracefs()
	if err != nil {
		return "", did, fmt.Errorf("mounted %s, but it holds no trace events (CONFIG_EVENT_TRACING): %w", did, err)
	}
	return root, did, nil
}

// mountAt mounts a filesystem of type kind at dir unless one of that
// type is mounted there already (debugfs without tracefs events, say),
// and returns "KIND at DIR" when it mounted.
func mountAt(kind, dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("%s: %w", dir, err)
	}
	magic := map[string]int64{"tracefs": unix.TRACEFS_MAGIC, "debugfs": unix.DEBUGFS_MAGIC}[kind]
	if int64(st.Type) == magic {
		return "", nil
	}
	if err := unix.Mount(kind, dir, kind, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return "", fmt.Errorf("mount -t %s %s %s: %w", kind, kind, dir, err)
	}
	return kind + " at " + dir, nil
}

// filesystems returns the filesystem types the kernel knows
// (/proc/filesystems), built in or from loaded modules.
func filesystems() (map[string]bool, error) {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return nil, fmt.Errorf("tracefs: %w", err)
	}
	out := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out[f[len(f)-1]] = true
		}
	}
	return out, nil
}

// hasCap reports whether the calling thread has capability c in its
// effective set. Capabilities are per thread; a process started as root
// or with file capabilities has the same set on every thread.
func hasCap(c uint) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return os.Geteuid() == 0
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}
