package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeps runs .ci/deps, the installer make test and .ci/run share: the
// list's packages are all installed here (make test installed them), so
// it says nothing; a missing package it cannot install (not root) is
// named in one line, and nothing is installed.
func TestDeps(t *testing.T) {
	RequireRoot(t)
	deps, err := filepath.Abs("../../.ci/deps")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(deps).CombinedOutput()
	if err != nil || len(out) != 0 {
		t.Fatalf(".ci/deps with everything installed: %v\n%s", err, out)
	}
	list := filepath.Join(t.TempDir(), "packages")
	if err := os.WriteFile(list, []byte("# a comment\ncpio   # installed\n\nkconsume-no-such-package # missing\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(list), filepath.Dir(filepath.Dir(list))} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", deps, list)
	out, err = cmd.CombinedOutput()
	want := "the tests need these missing packages; install them as root: apt-get install kconsume-no-such-package\n"
	if _, ok := err.(*exec.ExitError); !ok || string(out) != want {
		t.Fatalf(".ci/deps as nobody: %v\n%q\nwant %q", err, out, want)
	}
	if strings.Contains(string(out), "cpio") {
		t.Fatal("cpio is installed but was named missing")
	}
}
