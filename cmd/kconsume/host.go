package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/mounts"
)

// needTracefs returns the tracefs, mounting it when it is missing and
// saying so in one line on stderr; it fails as mounts.Tracefs does.
func needTracefs(cmd string, stderr io.Writer) (tracefs.FS, error) {
	root, did, err := mounts.Tracefs()
	if did != "" {
		fmt.Fprintf(stderr, "kconsume %s: mounted %s (left mounted, as trace-cmd does)\n", cmd, did)
	}
	return tracefs.FS{Root: root}, err
}

// kernel is what record needs to know of the running kernel.
type kernel struct {
	release string
	btf     bool  // /sys/kernel/btf/vmlinux exists
	ringbuf error // why there are no BPF ring buffers, or nil
}

// btfPath is where the kernel exposes its own BTF (CONFIG_DEBUG_INFO_BTF).
const btfPath = "/sys/kernel/btf/vmlinux"

func runningKernel() kernel {
	_, err := os.Stat(btfPath)
	var u unix.Utsname
	_ = unix.Uname(&u)
	return kernel{release: unix.ByteSliceToString(u.Release[:]), btf: err == nil, ringbuf: features.HaveMapType(ebpf.RingBuf)}
}

// noBTF is the hint for a kernel without BTF.
func (k kernel) noBTF() string {
	return fmt.Sprintf("this kernel (%s) has no BTF (%s is missing): it needs one built with CONFIG_DEBUG_INFO_BTF=y", k.release, btfPath)
}

// check fails, naming the missing kernel option or version, when cfg
// asks for what k lacks: BPF ring buffers (Linux 5.8) for --transport
// ringbuf, --global or --syscalls raw, and BTF for --syscalls raw and
// for BPF objects with tp_btf, fentry or fexit programs. With
// --transport auto the perf buffers serve a kernel without ring buffers,
// and --syscalls auto uses the tracepoints without BTF.
func (k kernel) check(cfg *consumer.Config) error {
	if k.ringbuf != nil {
		why := ""
		switch {
		case cfg.Transport == consumer.Ringbuf:
			why = "--transport ringbuf"
		case cfg.Global:
			why = "--global"
		case cfg.Syscalls == consumer.SyscallsRaw, cfg.Syscalls == consumer.SyscallsFentry:
			why = "--syscalls " + cfg.Syscalls.String()
		}
		if why != "" {
			return fmt.Errorf("%w: %s needs BPF ring buffers (BPF_MAP_TYPE_RINGBUF, Linux 5.8 with CONFIG_BPF_SYSCALL), which this kernel (%s) lacks; --transport auto uses perf buffers here: %w", consumer.ErrNotSupported, why, k.release, k.ringbuf)
		}
	}
	if k.btf {
		return nil
	}
	if cfg.Syscalls == consumer.SyscallsRaw || cfg.Syscalls == consumer.SyscallsFentry {
		return fmt.Errorf("%w: --syscalls %s: %s", consumer.ErrNotSupported, cfg.Syscalls, k.noBTF())
	}
	for i, spec := range cfg.Objects {
		for _, p := range spec.Programs {
			sec, _, _ := strings.Cut(p.SectionName, "/")
			if sec == "tp_btf" || sec == "fentry" || sec == "fexit" {
				return fmt.Errorf("%w: BPF object %d: program %s (%s): %s", consumer.ErrNotSupported, i+1, p.Name, sec, k.noBTF())
			}
		}
	}
	return nil
}

// explain adds the missing kernel option to why the raw syscall path
// does not run, when that is the kernel's BTF.
func (k kernel) explain(why error) error {
	if why != nil && !k.btf && strings.Contains(why.Error(), "BTF") {
		return fmt.Errorf("%w (%s)", why, k.noBTF())
	}
	return why
}

// prepareHost mounts tracefs for record (consumer.New reads it even for
// --bpf alone) when it is missing, and checks
// that the kernel has what cfg asks for; it returns the kernel it saw.
func prepareHost(cfg *consumer.Config, stderr io.Writer) (kernel, error) {
	k := runningKernel()
	if err := k.check(cfg); err != nil {
		return k, err
	}
	_, err := needTracefs("record", stderr)
	return k, err
}
