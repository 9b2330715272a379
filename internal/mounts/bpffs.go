package mounts

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// BPFFSDir is where the BPF filesystem is mounted, by systemd on most
// distributions and by the tools that pin BPF objects (bpftool, cilium).
const BPFFSDir = "/sys/fs/bpf"

// BPFFS returns BPFFSDir once the BPF filesystem is mounted there. When it
// is not and the process has CAP_SYS_ADMIN, it mounts it and leaves it
// mounted, as Tracefs does tracefs; did then says so. It fails when the
// process may not mount (ErrPrivilege) or the mount fails.
func BPFFS() (dir, did string, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(BPFFSDir, &st); err != nil {
		return "", "", fmt.Errorf("bpffs: %w", err)
	}
	if int64(st.Type) == unix.BPF_FS_MAGIC {
		return BPFFSDir, "", nil
	}
	if !hasCap(capSysAdmin) {
		return "", "", fmt.Errorf("bpffs is not mounted at %s and %w", BPFFSDir, ErrPrivilege)
	}
	if err := unix.Mount("bpf", BPFFSDir, "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=700"); err != nil {
		return "", "", fmt.Errorf("mount -t bpf bpf %s: %w", BPFFSDir, err)
	}
	return BPFFSDir, "bpffs at " + BPFFSDir, nil
}
