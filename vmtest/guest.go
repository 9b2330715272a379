package vmtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Options describe one guest.
type Options struct {
	Kernel     *Kernel
	CPUs       int           // vCPUs; default 2
	MemoryMB   int           // default 2048
	Accel      string        // "tcg", "kvm" or "auto" (default: KVM only if a probe boot works)
	Timeout    time.Duration // whole run, boot included; default 45 minutes
	KernelArgs string        // appended to the kernel command line
	Dir        string        // working directory of the command; default the current one
	Env        []string      // environment of the command; default os.Environ()
	Console    io.Writer     // the guest console, streamed line by line; nil discards it
	CacheDir   string        // where the KVM probe result is kept; default DefaultCacheDir()
	QEMU       string        // default qemu-system-x86_64
}

// ErrNoStatus is returned when the guest stopped without reporting the
// command's exit status (kernel panic, init failure, QEMU error).
var ErrNoStatus = errors.New("guest stopped without reporting an exit status")

// Run boots a guest on o.Kernel with the host's root file system shared
// read-only under a tmpfs overlay, runs argv in it, and returns argv's
// exit status. The console is streamed to o.Console as it comes. It fails
// with ErrNoStatus when the guest never reported a status, and with
// context.DeadlineExceeded on timeout; QEMU and every temporary file are
// gone when it returns.
func Run(ctx context.Context, o Options, argv []string) (int, error) {
	if len(argv) == 0 {
		return 0, fmt.Errorf("vmtest: no command to run")
	}
	o.defaults()
	o.Accel = Accel(ctx, o)
	return boot(ctx, o, argv)
}

func (o *Options) defaults() {
	if o.CPUs <= 0 {
		o.CPUs = 2
	}
	if o.MemoryMB <= 0 {
		o.MemoryMB = 2048
	}
	if o.Accel == "" {
		o.Accel = "auto"
	}
	if o.Timeout <= 0 {
		o.Timeout = 45 * time.Minute
	}
	if o.Dir == "" {
		o.Dir, _ = os.Getwd()
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	if o.Console == nil {
		o.Console = io.Discard
	}
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir()
	}
	if o.QEMU == "" {
		o.QEMU = "qemu-system-x86_64"
	}
}

func boot(ctx context.Context, o Options, argv []string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	work, err := os.MkdirTemp("", "vmtest-")
	if err != nil {
		return 0, fmt.Errorf("vmtest: %w", err)
	}
	defer os.RemoveAll(work)
	// The guest sees the host's root, so it reads the script where the
	// host wrote it.
	script := filepath.Join(work, "run.sh")
	if err := os.WriteFile(script, []byte(commandScript(o.Dir, o.Env, argv)), 0o644); err != nil {
		return 0, fmt.Errorf("vmtest: %w", err)
	}
	initrd := filepath.Join(work, "initramfs.cpio")
	if err := writeInitramfs(ctx, initrd, o.Kernel); err != nil {
		return 0, err
	}
	nonce := randomHex()
	args := qemuArgs(o, initrd, fmt.Sprintf("vmtest.script=%s vmtest.nonce=%s", script, nonce))
	cmd := exec.Command(o.QEMU, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, fmt.Errorf("vmtest: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("vmtest: start %s: %w", o.QEMU, err)
	}
	stop := context.AfterFunc(ctx, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer stop()
	marker := regexp.MustCompile(`^vmtest-exit-status-` + nonce + `: (\d+)$`)
	status := -1
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if m := marker.FindStringSubmatch(line); m != nil {
			status, _ = strconv.Atoi(m[1])
			continue
		}
		fmt.Fprintln(o.Console, line)
	}
	werr := cmd.Wait()
	if ctx.Err() != nil {
		return 0, fmt.Errorf("vmtest: guest on %s: %w", o.Kernel.Release, ctx.Err())
	}
	if status < 0 {
		return 0, fmt.Errorf("vmtest: guest on %s: %w (qemu: %v)", o.Kernel.Release, ErrNoStatus, werr)
	}
	return status, nil
}

// writeInitramfs builds the initramfs for k into path.
func writeInitramfs(ctx context.Context, path string, k *Kernel) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("vmtest: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := BuildInitramfs(ctx, w, k); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("vmtest: initramfs: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("vmtest: initramfs: %w", err)
	}
	return nil
}

// qemuArgs returns QEMU's command line for o.
func qemuArgs(o Options, initrd, extra string) []string {
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-smp", strconv.Itoa(o.CPUs), "-m", strconv.Itoa(o.MemoryMB),
		"-kernel", o.Kernel.Image, "-initrd", initrd,
		"-append", strings.TrimSpace("console=ttyS0 quiet panic=-1 " + extra + " " + o.KernelArgs),
		"-chardev", "stdio,id=console,signal=off", "-serial", "chardev:console",
		"-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
	}
	if o.Accel == "kvm" {
		return append(args, "-accel", "kvm", "-cpu", "host")
	}
	// One TCG thread: with multi-threaded TCG (QEMU 7.2) a vCPU can run
	// stale code while the kernel patches static keys and tracepoints
	// (text_poke_bp), which locked up 5.10 and oopsed 6.12 on int3 here.
	return append(args, "-accel", "tcg,thread=single", "-cpu", "max")
}

// commandScript returns the shell script that runs argv in dir with env.
func commandScript(dir string, env, argv []string) string {
	var exports strings.Builder
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !envName.MatchString(k) {
			continue
		}
		switch k {
		case "PWD", "OLDPWD", "SHLVL", "_", "TERM":
			continue
		}
		fmt.Fprintf(&exports, "export %s=%s\n", k, shellQuote(v))
	}
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = shellQuote(a)
	}
	return fmt.Sprintf(runScript, shellQuote(dir), exports.String(), strings.Join(quoted, " "))
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func randomHex() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Accel returns the accelerator Run uses for o: o.Accel, or where that
// is "auto" (or empty) what probeAccel finds.
func Accel(ctx context.Context, o Options) string {
	o.defaults()
	if o.Accel != "auto" {
		return o.Accel
	}
	return probeAccel(ctx, o)
}

// probeAccel returns "kvm" when /dev/kvm boots this kernel to the command
// within 30 s, "tcg" otherwise. On some hosts /dev/kvm opens but a guest
// hangs in the decompressor, so only a real boot tells. The answer is
// kept per host boot in the cache directory.
func probeAccel(ctx context.Context, o Options) string {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	stamp := filepath.Join(o.CacheDir, "kvm-probe-"+strings.TrimSpace(string(bootID)))
	if b, err := os.ReadFile(stamp); err == nil {
		return strings.TrimSpace(string(b))
	}
	p := o
	p.Accel, p.Timeout, p.Console, p.CPUs = "kvm", 30*time.Second, io.Discard, 1
	accel := "tcg"
	if st, err := boot(ctx, p, []string{"true"}); err == nil && st == 0 {
		accel = "kvm"
	}
	if ctx.Err() == nil {
		os.MkdirAll(o.CacheDir, 0o755)
		os.WriteFile(stamp, []byte(accel+"\n"), 0o644)
	}
	return accel
}
