package vmtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
)

func TestPickKernel(t *testing.T) {
	names := []string{
		"linux-image-5.10.0-30-amd64", "linux-image-5.10.0-32-amd64", "linux-image-5.10.0-32-cloud-amd64",
		"linux-image-6.1.0-9-amd64", "linux-image-6.1.0-50-amd64", "linux-image-6.1.0-50-amd64-unsigned",
		"linux-image-6.12.94+deb13-amd64", "linux-image-6.12.107+deb13-amd64", "linux-image-6.12.107+deb13-rt-amd64",
		"linux-image-7.3.4+deb13-amd64", "linux-image-7.10.1+deb13-amd64-dbg", "linux-image-amd64",
	}
	cases := map[string]string{
		"5.10":            "linux-image-5.10.0-32-amd64",
		"6.1":             "linux-image-6.1.0-50-amd64",
		"6.12":            "linux-image-6.12.107+deb13-amd64",
		"newest":          "linux-image-7.3.4+deb13-amd64",
		"5.10.0-30-amd64": "linux-image-5.10.0-30-amd64",
	}
	for spec, want := range cases {
		got, err := pickKernel(names, spec)
		if err != nil || got != want {
			t.Errorf("pickKernel(%q) = %q, %v; want %q", spec, got, err, want)
		}
	}
	if _, err := pickKernel(names, "4.19"); err == nil || !strings.Contains(err.Error(), "4.19") {
		t.Errorf("pickKernel(4.19): %v, want an error naming it", err)
	}
}

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "vmtest.toml")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := LoadConfig(write(`[[target]]
name = "a"
kernel = "6.1"
vm = { num_cpus = 4, memory = "1G" }
[[target]]
name = "b"
kernel = "5.10"
command = "true"
`))
	if err != nil {
		t.Fatal(err)
	}
	if mb, _ := c.Target[0].MemoryMB(); mb != 1024 || c.Target[0].VM.NumCPUs != 4 {
		t.Errorf("target a: %+v", c.Target[0])
	}
	sel := c.Select([]string{"5.10", "6.12"})
	if len(sel) != 2 || sel[0].Name != "b" || sel[1].Kernel != "6.12" {
		t.Errorf("Select: %+v", sel)
	}
	for name, bad := range map[string]string{
		"unknown key": "[[target]]\nname = \"a\"\nkernel = \"6.1\"\nkernal_args = \"x\"\n",
		"no kernel":   "[[target]]\nname = \"a\"\n",
		"twice":       "[[target]]\nname = \"a\"\nkernel = \"6.1\"\n[[target]]\nname = \"a\"\nkernel = \"5.10\"\n",
		"memory":      "[[target]]\nname = \"a\"\nkernel = \"6.1\"\nvm = { memory = \"lots\" }\n",
		"syntax":      "[[target]\n",
	} {
		if _, err := LoadConfig(write(bad)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestInitramfs unpacks the archive with cpio(1), an independent reader
// of the newc format, and checks the module order on a cached kernel.
func TestInitramfs(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		testenv.Missing(t, "cpio is required: %v", err)
	}
	if _, err := os.Stat(Busybox); err != nil {
		testenv.Missing(t, "busybox-static is required: %v", err)
	}
	var buf bytes.Buffer
	if err := BuildInitramfs(context.Background(), &buf, &Kernel{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("cpio", "-id", "--quiet")
	cmd.Dir, cmd.Stdin = dir, &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v: %s", err, out)
	}
	init, err := os.ReadFile(filepath.Join(dir, "init"))
	if err != nil || string(init) != initScript {
		t.Fatalf("init not extracted intact: %v", err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || l != "busybox" {
		t.Fatalf("bin/sh -> %q, %v", l, err)
	}
}

func TestCommandScript(t *testing.T) {
	s := commandScript("/a b", []string{"X=it's", "BAD-NAME=1", "PWD=/x"}, []string{"echo", "a'b", "$HOME"})
	out, err := exec.Command("sh", "-c", strings.Replace(s, "cd '/a b' || exit 125\n", "", 1)).Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	if string(out) != "a'b $HOME\n" {
		t.Errorf("output %q", out)
	}
	if !strings.Contains(s, `export X='it'\''s'`) || strings.Contains(s, "BAD-NAME") || strings.Contains(s, "PWD") {
		t.Errorf("script:\n%s", s)
	}
}

// TestRunStatus boots a real guest (TCG) on 6.1: a failing command's
// status and output come back, and a passing one returns 0. Skipped
// inside a guest, where it would nest QEMU.
func TestRunStatus(t *testing.T) {
	if os.Getenv("KCONSUME_VMTEST") != "" {
		t.Skip("inside a vmtest guest")
	}
	if testing.Short() {
		t.Skip("boots a VM")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.Missing(t, "qemu-system-x86 is required: %v", err)
	}
	if _, err := os.Stat(Busybox); err != nil {
		testenv.Missing(t, "busybox-static is required: %v", err)
	}
	ctx := context.Background()
	k, err := (&Cache{Dir: DefaultCacheDir()}).Kernel(ctx, "6.1")
	if err != nil {
		t.Fatal(err)
	}
	var console bytes.Buffer
	o := Options{Kernel: k, Accel: "tcg", CPUs: 2, Timeout: 3 * time.Minute, Console: &console, Env: []string{"KC_MSG=guest says hi"}}
	st, err := Run(ctx, o, []string{"sh", "-c", `echo "$KC_MSG on $(uname -r) in $(pwd), $(nproc) CPUs"; exit 3`})
	if err != nil {
		t.Fatalf("%v\n%s", err, console.String())
	}
	wd, _ := os.Getwd()
	want := "guest says hi on " + k.Release + " in " + wd + ", 2 CPUs"
	if st != 3 || !strings.Contains(console.String(), want) {
		t.Fatalf("status %d, want 3; console lacks %q:\n%s", st, want, console.String())
	}
	o.Timeout = 2 * time.Second
	if _, err := Run(ctx, o, []string{"sleep", "60"}); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("timeout: %v", err)
	}
}
