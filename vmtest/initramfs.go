package vmtest

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// GuestModules are the modules the guest's init loads, with their
// dependencies, before it mounts the host's root: virtio PCI, 9p over
// virtio, and overlayfs; and loop, the guest's only block devices (tests
// of block events). Debian builds them as modules; a kernel that has them
// built in needs none.
var GuestModules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay", "loop"}

// Busybox is the static busybox copied into the initramfs (Debian package
// busybox-static).
var Busybox = "/bin/busybox"

// module is one kernel module file found under a modules directory.
type module struct {
	name string // canonical name: dashes become underscores
	path string
}

// moduleOrder returns the modules in wanted and everything they depend
// on, in load order (dependencies first), with their uncompressed
// objects. Dependencies come from each module's .modinfo "depends="
// entry, the way depmod finds them, because Debian's package ships no
// modules.dep. A module absent from dir must be listed in
// modules.builtin, when the kernel ships that list, or it fails.
func moduleOrder(ctx context.Context, dir string, wanted []string) ([]module, map[string][]byte, error) {
	index := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n, ok := moduleName(d.Name()); ok && !d.IsDir() {
			index[n] = p
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("modules of %s: %w", dir, err)
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			if n, ok := moduleName(filepath.Base(l)); ok {
				builtin[n] = true
			}
		}
	}
	var order []module
	data := map[string][]byte{}
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		name = strings.ReplaceAll(name, "-", "_")
		switch state[name] {
		case 1:
			return fmt.Errorf("module dependency cycle at %s", name)
		case 2:
			return nil
		}
		path, ok := index[name]
		if !ok {
			// Without a modules.builtin list (7.x packages ship none)
			// a missing module is taken as built in; the guest says
			// so if a mount then fails.
			if builtin[name] || len(builtin) == 0 {
				state[name] = 2
				return nil
			}
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) not found under %s", name, from, dir)
			}
			return fmt.Errorf("module %s not found under %s and not built in", name, dir)
		}
		state[name] = 1
		b, err := readModule(ctx, path)
		if err != nil {
			return err
		}
		deps, err := modDepends(b)
		if err != nil {
			return fmt.Errorf("module %s: %w", path, err)
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		data[name] = b
		order = append(order, module{name: name, path: path})
		return nil
	}
	for _, w := range wanted {
		if err := visit(w, ""); err != nil {
			return nil, nil, err
		}
	}
	return order, data, nil
}

// moduleName returns the canonical module name of a file name such as
// "9pnet_virtio.ko.xz", and whether it is a module at all.
func moduleName(file string) (string, bool) {
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
		if strings.HasSuffix(file, ext) {
			return strings.ReplaceAll(strings.TrimSuffix(file, ext), "-", "_"), true
		}
	}
	return "", false
}

// readModule returns the uncompressed ELF object of a module file. The
// guest's busybox insmod cannot read compressed modules, so 6.12+'s
// .ko.xz are decompressed here with the host's xz (or zstd, gzip).
func readModule(ctx context.Context, path string) ([]byte, error) {
	var tool string
	switch {
	case strings.HasSuffix(path, ".xz"):
		tool = "xz"
	case strings.HasSuffix(path, ".zst"):
		tool = "zstd"
	case strings.HasSuffix(path, ".gz"):
		tool = "gzip"
	default:
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("module: %w", err)
		}
		return b, nil
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, tool, "-dc", path)
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompress %s with %s: %w: %s", path, tool, err, strings.TrimSpace(stderr.String()))
	}
	return b, nil
}

// modDepends returns the "depends=" list of a module's .modinfo section.
func modDepends(obj []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(obj))
	if err != nil {
		return nil, fmt.Errorf("not an ELF object: %w", err)
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	info, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf(".modinfo: %w", err)
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(string(v), ","), nil
		}
	}
	return nil, nil
}

// BuildInitramfs writes to w an uncompressed newc cpio archive holding
// busybox, the guest init and the modules it loads for k. It fails when
// busybox or a module is missing.
func BuildInitramfs(ctx context.Context, w io.Writer, k *Kernel) error {
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return fmt.Errorf("initramfs: static busybox (apt-get install busybox-static): %w", err)
	}
	if f, err := elf.NewFile(bytes.NewReader(bb)); err != nil {
		return fmt.Errorf("initramfs: %s: %w", Busybox, err)
	} else if f.Section(".interp") != nil {
		f.Close()
		return fmt.Errorf("initramfs: %s is dynamically linked; install busybox-static", Busybox)
	} else {
		f.Close()
	}
	var mods []module
	var data map[string][]byte
	if k.Modules != "" {
		mods, data, err = moduleOrder(ctx, k.Modules, GuestModules)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	a := newCpio(w)
	for _, d := range []string{"bin", "dev", "proc", "sys", "mnt", "modules"} {
		a.dir(d)
	}
	a.file("bin/busybox", 0o755, bb)
	a.symlink("bin/sh", "busybox")
	a.file("init", 0o755, []byte(initScript))
	var list strings.Builder
	for _, m := range mods {
		f := m.name + ".ko"
		a.file("modules/"+f, 0o644, data[m.name])
		list.WriteString(f + "\n")
	}
	a.file("modules/order", 0o644, []byte(list.String()))
	if err := a.close(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return nil
}

// cpio writes the "newc" format the kernel unpacks into its rootfs (see
// Documentation/driver-api/early-userspace/buffer-format.rst).
type cpio struct {
	w   io.Writer
	ino int
	err error
}

func newCpio(w io.Writer) *cpio { return &cpio{w: w, ino: 1} }

func (c *cpio) entry(name string, mode uint32, body []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(name)+1, 0)
	var b bytes.Buffer
	b.WriteString(hdr)
	b.WriteString(name)
	b.WriteByte(0)
	pad4(&b)
	b.Write(body)
	pad4(&b)
	_, c.err = c.w.Write(b.Bytes())
}

func pad4(b *bytes.Buffer) {
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}

func (c *cpio) dir(name string)                         { c.entry(name, 0o040755, nil) }
func (c *cpio) file(name string, perm uint32, b []byte) { c.entry(name, 0o100000|perm, b) }
func (c *cpio) symlink(name, target string)             { c.entry(name, 0o120777, []byte(target)) }

func (c *cpio) close() error {
	c.entry("TRAILER!!!", 0, nil)
	return c.err
}
