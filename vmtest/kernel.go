package vmtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Kernel is a Debian kernel unpacked on the host, never installed.
type Kernel struct {
	Spec    string // what was asked for: "6.1", "newest" or a bzImage path
	Package string // Debian package, "linux-image-6.1.0-50-amd64"; empty for a path
	Release string // uname -r, "6.1.0-50-amd64"
	Image   string // bzImage path
	Modules string // lib/modules/<release> directory; empty if unknown
}

// Suites are the Debian suites searched for kernels: bullseye has 5.10,
// bookworm 6.1, trixie 6.12 and trixie-backports the newest.
var Suites = []string{"bullseye", "bookworm", "trixie", "trixie-backports"}

// Mirror is the Debian archive kernels are downloaded from.
var Mirror = "http://deb.debian.org/debian"

// listsMaxAge is how long downloaded package lists are trusted.
const listsMaxAge = 24 * time.Hour

// Cache fetches Debian kernels into Dir through a private APT
// configuration (its own sources list, lists and state), leaving the
// system's APT untouched.
type Cache struct {
	Dir string
	Log io.Writer // progress messages; nil discards them
}

// DefaultCacheDir returns $KCONSUME_VMTEST_CACHE, or kconsume/vmtest
// under the user cache directory.
func DefaultCacheDir() string {
	if d := os.Getenv("KCONSUME_VMTEST_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kconsume", "vmtest")
	}
	return filepath.Join(os.TempDir(), "kconsume-vmtest")
}

// imagePkg matches the kernel image packages worth booting: the generic
// amd64 flavour, signed or not, without debug symbols.
var imagePkg = regexp.MustCompile(`^linux-image-(\d+\.\d+)[0-9.]*(-\d+)?(\+deb\d+)?-amd64$`)

// Kernel returns the kernel for spec, downloading and unpacking it on
// first use. spec is a series ("5.10", "6.1"), a full release
// ("6.1.0-50-amd64"), "newest", or the path of a bzImage (used as is, with
// modules looked up next to it). It fails when the archive has no such
// kernel or when APT or dpkg-deb fail.
func (c *Cache) Kernel(ctx context.Context, spec string) (*Kernel, error) {
	if strings.ContainsRune(spec, '/') {
		return localKernel(spec)
	}
	if err := c.updateLists(ctx); err != nil {
		return nil, err
	}
	names, err := c.aptOut(ctx, "apt-cache", "pkgnames", "linux-image-")
	if err != nil {
		return nil, err
	}
	pkg, err := pickKernel(strings.Fields(names), spec)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(c.Dir, "kernels", pkg)
	if k, err := unpacked(spec, pkg, dir); err == nil {
		return k, nil
	}
	if err := c.unpack(ctx, pkg, dir); err != nil {
		return nil, err
	}
	return unpacked(spec, pkg, dir)
}

// pickKernel returns the newest package in names that matches spec.
func pickKernel(names []string, spec string) (string, error) {
	var match []string
	for _, n := range names {
		m := imagePkg.FindStringSubmatch(n)
		if m == nil {
			continue
		}
		release := strings.TrimPrefix(n, "linux-image-")
		if spec == "newest" || spec == m[1] || spec == release {
			match = append(match, n)
		}
	}
	if len(match) == 0 {
		return "", fmt.Errorf("no Debian kernel %q in %s (%s): give a series such as 6.1, a release such as 6.1.0-50-amd64, or newest", spec, Mirror, strings.Join(Suites, ", "))
	}
	sort.Slice(match, func(i, j int) bool { return versionLess(match[i], match[j]) })
	return match[len(match)-1], nil
}

// versionLess compares the numbers in a and b left to right, which orders
// Debian kernel package names by version (6.12.94 < 6.12.107).
func versionLess(a, b string) bool {
	na, nb := numbers(a), numbers(b)
	for i := 0; i < len(na) && i < len(nb); i++ {
		if na[i] != nb[i] {
			return na[i] < nb[i]
		}
	}
	return len(na) < len(nb)
}

var digits = regexp.MustCompile(`\d+`)

func numbers(s string) []int {
	var n []int
	for _, d := range digits.FindAllString(s, -1) {
		v, _ := strconv.Atoi(d)
		n = append(n, v)
	}
	return n
}

// updateLists refreshes the private package lists when older than a day.
// It holds the cache's lock meanwhile: two vmtest commands updating at
// once leave lists missing (apt's partial files removed under the other),
// and a series then resolves to an older release.
func (c *Cache) updateLists(ctx context.Context) error {
	apt := filepath.Join(c.Dir, "apt")
	for _, d := range []string{"lists/partial", "cache/archives/partial", "etc/apt.conf.d", "etc/preferences.d", "etc/sources.list.d"} {
		if err := os.MkdirAll(filepath.Join(apt, d), 0o755); err != nil {
			return fmt.Errorf("vmtest cache: %w", err)
		}
	}
	lock, err := os.OpenFile(filepath.Join(apt, "vmtest.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("vmtest cache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("vmtest cache: locking %s: %w", lock.Name(), err)
	}
	var src strings.Builder
	for _, s := range Suites {
		fmt.Fprintf(&src, "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n", Mirror, s)
	}
	srcPath := filepath.Join(apt, "etc", "sources.list")
	old, _ := os.ReadFile(srcPath)
	if err := os.WriteFile(srcPath, []byte(src.String()), 0o644); err != nil {
		return fmt.Errorf("vmtest cache: %w", err)
	}
	if err := touch(filepath.Join(apt, "status")); err != nil {
		return err
	}
	stamp := filepath.Join(apt, "updated")
	if st, err := os.Stat(stamp); err == nil && string(old) == src.String() && time.Since(st.ModTime()) < listsMaxAge {
		return nil
	}
	c.logf("vmtest: updating Debian package lists (%s)", strings.Join(Suites, " "))
	if _, err := c.aptOut(ctx, "apt-get", "-q", "update"); err != nil {
		return err
	}
	return touch(stamp)
}

// unpack downloads pkg and extracts it into dir (atomically: a temporary
// directory renamed into place).
func (c *Cache) unpack(ctx context.Context, pkg, dir string) error {
	c.logf("vmtest: downloading %s", pkg)
	dl, err := os.MkdirTemp(c.Dir, "download-")
	if err != nil {
		return fmt.Errorf("vmtest cache: %w", err)
	}
	defer os.RemoveAll(dl)
	// Since 6.19 (trixie-backports) linux-image-* is a metapackage
	// whose image and modules come in linux-binary-* and linux-modules-*
	// of the same release.
	release := strings.TrimPrefix(pkg, "linux-image-")
	pkgs := []string{pkg}
	show, err := c.aptOut(ctx, "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return err
	}
	for _, part := range []string{"linux-binary-", "linux-modules-"} {
		if strings.Contains(show, part+release+" ") {
			pkgs = append(pkgs, part+release)
		}
	}
	cmd := c.apt(ctx, "apt-get", append([]string{"-q", "download"}, pkgs...)...)
	cmd.Dir = dl
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %w: %s", strings.Join(pkgs, " "), err, lastLines(out))
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != len(pkgs) {
		return fmt.Errorf("apt-get download %s: expected %d .deb files, found %d", strings.Join(pkgs, " "), len(pkgs), len(debs))
	}
	tmp := filepath.Join(dl, "root")
	for _, deb := range debs {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %w: %s", filepath.Base(deb), err, lastLines(out))
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("vmtest cache: %w", err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("vmtest cache: %w", err)
	}
	return nil
}

// unpacked returns the kernel extracted in dir, or an error if it is not
// complete.
func unpacked(spec, pkg, dir string) (*Kernel, error) {
	release := strings.TrimPrefix(pkg, "linux-image-")
	k := &Kernel{Spec: spec, Package: pkg, Release: release}
	for _, p := range []string{
		filepath.Join(dir, "boot", "vmlinuz-"+release),
		filepath.Join(dir, "usr/lib/modules", release, "vmlinuz"),
	} {
		if k.Image == "" {
			if _, err := os.Stat(p); err == nil {
				k.Image = p
			}
		}
	}
	if k.Image == "" {
		return nil, fmt.Errorf("kernel %s: no vmlinuz-%s in the package", pkg, release)
	}
	for _, m := range []string{"lib/modules", "usr/lib/modules"} {
		d := filepath.Join(dir, m, release)
		if _, err := os.Stat(d); err == nil {
			k.Modules = d
			return k, nil
		}
	}
	return nil, fmt.Errorf("kernel %s: no modules directory for %s", pkg, release)
}

// localKernel describes a bzImage given by path; modules are looked up in
// lib/modules/* next to its boot/ directory.
func localKernel(path string) (*Kernel, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("kernel image: %w", err)
	}
	release, ok := strings.CutPrefix(filepath.Base(path), "vmlinuz-")
	k := &Kernel{Spec: path, Image: path, Release: release}
	if !ok {
		return k, nil // no release in the name: no modules to find
	}
	root := filepath.Dir(filepath.Dir(path))
	for _, m := range []string{"lib/modules", "usr/lib/modules"} {
		if d := filepath.Join(root, m, release); k.Modules == "" {
			if _, err := os.Stat(d); err == nil {
				k.Modules = d
			}
		}
	}
	return k, nil
}

// apt returns an APT command confined to the private configuration.
func (c *Cache) apt(ctx context.Context, name string, args ...string) *exec.Cmd {
	d := filepath.Join(c.Dir, "apt")
	opts := []string{
		"-o", "Dir::Etc=" + filepath.Join(d, "etc"),
		"-o", "Dir::Etc::SourceList=" + filepath.Join(d, "etc", "sources.list"),
		"-o", "Dir::Etc::SourceParts=" + filepath.Join(d, "etc", "sources.list.d"),
		"-o", "Dir::Etc::Parts=" + filepath.Join(d, "etc", "apt.conf.d"),
		"-o", "Dir::State=" + d,
		"-o", "Dir::State::Lists=" + filepath.Join(d, "lists"),
		"-o", "Dir::State::status=" + filepath.Join(d, "status"),
		"-o", "Dir::Cache=" + filepath.Join(d, "cache"),
		"-o", "APT::Architecture=amd64",
		"-o", "APT::Architectures=amd64",
		"-o", "Debug::NoLocking=1",
		// The download directory belongs to root; the _apt sandbox user
		// could not write it.
		"-o", "APT::Sandbox::User=root",
	}
	cmd := exec.CommandContext(ctx, name, append(opts, args...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

func (c *Cache) aptOut(ctx context.Context, name string, args ...string) (string, error) {
	var stderr strings.Builder
	cmd := c.apt(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLines([]byte(stderr.String())))
	}
	return string(out), nil
}

func (c *Cache) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

func touch(path string) error {
	now := time.Now()
	if err := os.Chtimes(path, now, now); errors.Is(err, os.ErrNotExist) {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("vmtest cache: %w", err)
		}
		return f.Close()
	} else if err != nil {
		return fmt.Errorf("vmtest cache: %w", err)
	}
	return nil
}

// lastLines returns the last few lines of a command's output, for errors.
func lastLines(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "; ")
}
