package testenv

import (
	"bufio"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// KernelConfig returns the line of the running kernel's build
// configuration that sets option ("CONFIG_X=y", or "# CONFIG_X is not
// set") and the file it came from. It looks in /proc/config.gz,
// /boot/config-RELEASE and the configurations of the kernels vmtest
// fetched (a guest sees the host's cache); found is false when none of
// them is this release's or the option is not in it.
func KernelConfig(option string) (line, source string, found bool) {
	_, _, rel := KernelRelease()
	files := []string{"/proc/config.gz", "/boot/config-" + rel}
	caches := []string{os.Getenv("KCONSUME_VMTEST_CACHE"), "/root/.cache/kconsume/vmtest"}
	if d, err := os.UserCacheDir(); err == nil {
		caches = append(caches, filepath.Join(d, "kconsume", "vmtest"))
	}
	for _, c := range caches {
		if c != "" {
			m, _ := filepath.Glob(filepath.Join(c, "kernels", "*", "boot", "config-"+rel))
			files = append(files, m...)
		}
	}
	for _, f := range files {
		if l, ok := configLine(f, option); ok {
			return l, f, true
		}
	}
	return "", "", false
}

// configLine returns the line of config file path that sets option.
func configLine(path, option string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return "", false
		}
		r = z
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, option+"=") || l == "# "+option+" is not set" {
			return l, true
		}
	}
	return "", false
}
