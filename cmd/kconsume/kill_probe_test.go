package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/testenv"
)

// TestKillDetachesProbes: a recording of every kind of probe this kernel
// can take (a uprobe and, from Linux 6.6, a uretprobe on a C program,
// and in guests a kprobe, a kretprobe, a kprobe glob through
// kprobe.multi, and fentry and fexit) killed with SIGKILL leaves nothing
// attached: every BPF link the
// process held (read from its fdinfo while it ran) is gone, and the
// kernel's kprobe_events and uprobe_events are as before, since kconsume
// never writes them.
func TestKillDetachesProbes(t *testing.T) {
	testenv.RequireRoot(t)
	if major, minor, _ := testenv.KernelRelease(); major < 5 || major == 5 && minor < 15 {
		t.Skipf("Linux %d.%d: kconsume's probes need BPF attach cookies (Linux 5.15)", major, minor)
	}
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	bin := testenv.BuildC(t, "../../consumer/testdata/kcprobe.c", "-O1")
	specs := []string{"uprobe:" + bin + ":kcprobe_target a=%di:s64"}
	if major, minor, _ := testenv.KernelRelease(); major > 6 || major == 6 && minor >= 6 {
		// A uretprobe's function address needs bpf_get_func_ip for
		// uprobes (Linux 6.6).
		specs = append(specs, "uretprobe:"+bin+":kcprobe_target r=$retval:s64")
	}
	if _, err := os.Stat(filepath.Join(fs.Root, "kprobe_events")); err == nil {
		specs = append(specs, "kprobe:do_sys_openat2 dfd", "kretprobe:do_sys_openat2 r=$retval:s64", "kprobe:__x64_sys_getp*")
	} else if testenv.InGuest() {
		t.Fatalf("a guest's kernel without kprobe_events: %v", err)
	}
	if testenv.InGuest() {
		if major, minor, _ := testenv.KernelRelease(); major > 5 || major == 5 && minor >= 17 {
			specs = append(specs, "fentry:do_sys_openat2 dfd", "fexit:do_sys_openat2 $retval")
		}
	}
	before := map[string]string{}
	for _, f := range []string{"kprobe_events", "uprobe_events"} {
		b, _ := os.ReadFile(filepath.Join(fs.Root, f))
		before[f] = string(b)
	}
	args := []string{"-o", filepath.Join(t.TempDir(), "t"), "--duration", "10m"}
	for _, s := range specs {
		args = append(args, "-e", s)
	}
	rec := startRecording(t, "killprobe"+uniq, args...)
	ids, kinds := linksOf(t, rec.cmd.Process.Pid)
	// The uprobe and uretprobe at least, each its own link or one
	// multi-link; the probes' events are all attached by now.
	if len(ids) == 0 {
		t.Fatalf("record holds no BPF link while it runs\n%s", rec.out.String())
	}
	t.Logf("%d probes recorded through %d links: %v", len(specs), len(ids), kinds)
	_ = rec.cmd.Process.Kill()
	rec.wait(t)
	for _, id := range ids {
		l, err := link.NewFromID(id)
		if err == nil {
			info, _ := l.Info()
			l.Close()
			t.Errorf("link %d (%v) is still attached after record was killed", id, info)
		} else if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("link %d: %v", id, err)
		}
	}
	for f, was := range before {
		if b, _ := os.ReadFile(filepath.Join(fs.Root, f)); string(b) != was {
			t.Errorf("%s changed: %q, was %q", f, b, was)
		}
	}
}

// linksOf returns the IDs of the BPF links process pid holds open, and
// their kinds, from its file descriptors' fdinfo (kernel/bpf/syscall.c,
// bpf_link_show_fdinfo: link_type and link_id).
func linksOf(t *testing.T, pid int) ([]link.ID, map[string]int) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []link.ID
	kinds := map[string]int{}
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed since
		}
		var kind string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), ":")
			v = strings.TrimSpace(v)
			switch k {
			case "link_type":
				kind = v
			case "link_id":
				if n, err := strconv.ParseUint(v, 10, 32); err == nil {
					ids = append(ids, link.ID(n))
					kinds[kind]++
				}
			}
		}
		f.Close()
	}
	return ids, kinds
}
