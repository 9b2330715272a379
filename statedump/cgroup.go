package statedump

import (
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// cgroups emits kconsume_statedump_cgroup for every directory of the
// cgroup v2 hierarchy (none where it is not mounted): its id, the inode
// number, and its path from the hierarchy's root ("/" for the root).
func (d *Dumper) cgroups(c *Counts, pfs procfs.FS) error {
	root := cgroup2Root(pfs)
	if root == "" {
		return nil
	}
	var werr error
	_ = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return nil // gone meanwhile, or a file
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil {
			return nil
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(path, root), "/")
		if werr = d.put(c, Cgroup, st.Ino, rel); werr != nil {
			return werr
		}
		c.Cgroups++
		return nil
	})
	return werr
}

// cgroup2Root returns where the cgroup v2 hierarchy is mounted, or "".
func cgroup2Root(fs procfs.FS) string {
	mounts, err := fs.Self()
	if err != nil {
		return ""
	}
	infos, err := mounts.MountInfo()
	if err != nil {
		return ""
	}
	for _, m := range infos {
		if m.FSType == "cgroup2" {
			return m.MountPoint
		}
	}
	return ""
}
