package consumer

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestUprobesMatchFtrace records a C program's calls of one function
// with a uprobe and a uretprobe, the same fetch arguments given to
// kconsume and to the kernel's uprobe_events for an ftrace instance
// recording at the same time: every call's values (registers, strings,
// dereferenced words of each size and sign, $comm, $stack0, a string at
// a bad pointer, the return value) and probe addresses must be ftrace's.
func TestUprobesMatchFtrace(t *testing.T) {
	testenv.RequireRoot(t)
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	events := filepath.Join(fs.Root, "uprobe_events")
	if _, err := os.Stat(events); err != nil {
		testenv.Missing(t, "no uprobe_events (CONFIG_UPROBE_EVENTS): %v", err)
	}
	requireProbes(t)
	bin := testenv.BuildC(t, "testdata/kcprobe.c", "-O1")
	off := fileOffset(t, bin, "kcprobe_target")
	const (
		args    = `a=%di:s64 s=+0(%si):string b=%dx:u32 c=$comm w=+0(%si):x64 n=+1(%si):s8 st=$stack0:x64 bad=+0(%cx):string dflt=%dx`
		retArgs = `r=$retval:s64`
	)
	specs := []string{"uprobe:" + bin + ":kcprobe_target " + args}
	group := fmt.Sprintf("kcprobe%d", os.Getpid())
	defs := []string{fmt.Sprintf("p:%s/kcprobe_target %s:0x%x %s", group, bin, off, args)}
	ftraceEvents := []string{group + ":kcprobe_target"}
	if major, minor, _ := testenv.KernelRelease(); major > 6 || major == 6 && minor >= 6 {
		specs = append(specs, "uretprobe:"+bin+":kcprobe_target "+retArgs)
		defs = append(defs, fmt.Sprintf("r:%s/kcprobe_target__return %s:0x%x %s", group, bin, off, retArgs))
		ftraceEvents = append(ftraceEvents, group+":kcprobe_target__return")
	} else {
		t.Logf("Linux %d.%d: no uretprobe (kconsume needs bpf_get_func_ip for uprobes, 6.6)", major, minor)
	}
	for _, d := range defs {
		appendProbe(t, events, d)
		name := strings.Fields(d)[0][2:]
		t.Cleanup(func() { appendProbe(t, events, "-:"+name) })
	}
	inst, enable := ftraceInstance(t, fs, "uprobe", ftraceEvents)
	if err := enable("1"); err != nil {
		t.Fatal(err)
	}
	s, dir := newTestSession(t, Config{Events: specs})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	const calls = 60
	if out, err := exec.Command(bin, fmt.Sprint(calls)).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", bin, err, out)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := enable("0"); err != nil {
		t.Fatal(err)
	}
	theirs := ftraceProbeLines(t, inst)
	var ours []string
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind == relayfmt.DiscardedEvents {
			t.Errorf("%d events discarded", it.Count)
		}
		if it.Kind == relayfmt.EventItem {
			ours = append(ours, probeLine(t, it.Class.Name, vals))
		}
	})
	if len(ours) != calls*len(specs) || !slices.Equal(ours, theirs) {
		t.Fatalf("kconsume recorded %d events, ftrace %d, want %d each:\nkconsume: %q\nftrace:   %q", len(ours), len(theirs), calls*len(specs), ours, theirs)
	}
	t.Logf("%d events alike, the first: %s", len(ours), ours[0])
}

// requireProbes skips t on a kernel too old for kconsume's probes.
func requireProbes(t *testing.T) {
	t.Helper()
	if major, minor, _ := testenv.KernelRelease(); major < 5 || major == 5 && minor < 15 {
		t.Skipf("Linux %d.%d: kconsume's probes need BPF attach cookies (Linux 5.15)", major, minor)
	}
}

// fileOffset returns where function sym of the ELF file bin starts in
// the file, as uprobe_events takes it.
func fileOffset(t testing.TB, bin, sym string) uint64 {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name != sym {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
				return s.Value - p.Vaddr + p.Off
			}
		}
	}
	t.Fatalf("%s: no symbol %s in an executable segment", bin, sym)
	return 0
}

// appendProbe writes def to the kernel's uprobe_events, as a line of its
// own.
func appendProbe(t testing.TB, events, def string) {
	t.Helper()
	f, err := os.OpenFile(events, os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		_, err = f.WriteString(def + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatalf("uprobe_events: %q: %v", def, err)
	}
}

// ftraceProbeLine matches a probe event's line in an instance's trace file:
// the event's name, its addresses and its arguments.
var ftraceProbeLine = regexp.MustCompile(`\s(kcprobe_target(?:__return)?): \((0x[0-9a-f]+)(?: <- (0x[0-9a-f]+))?\)(.*)$`)

// ftraceProbeLines returns the probe events of the instance at inst as
// probeLine writes them.
func ftraceProbeLines(t *testing.T, inst string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(inst, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		m := ftraceProbeLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		addrs := m[2]
		if m[3] != "" {
			// A return: the return address, then the function's.
			addrs = m[3] + " <- " + m[2]
		}
		out = append(out, m[1]+" "+addrs+strings.ReplaceAll(m[4], "=(fault)", `=""`))
	}
	return out
}

// probeLine writes a probe event of our trace as ftraceProbeLines
// writes ftrace's: name, addresses, each argument as ftrace prints its
// type (a string that faulted, which ftrace prints as (fault), as "").
func probeLine(t *testing.T, class string, vals []relayfmt.Value) string {
	t.Helper()
	_, name, _ := strings.Cut(class, ":")
	var b strings.Builder
	b.WriteString(name)
	if v := field(vals, "__probe_ip"); v.Field != nil {
		fmt.Fprintf(&b, " 0x%x", v.Uint(0))
	} else {
		fmt.Fprintf(&b, " 0x%x <- 0x%x", field(vals, "__probe_func").Uint(0), field(vals, "__probe_ret_ip").Uint(0))
	}
	b.WriteString(probeArgs(vals))
	return b.String()
}

// probeArgs writes the arguments of a probe event of our trace as
// ftrace prints their types, each after a blank.
func probeArgs(vals []relayfmt.Value) string {
	var b strings.Builder
	for _, v := range vals {
		n := v.Field.Name
		if strings.HasPrefix(n, "common_") || strings.HasPrefix(n, "__probe_") {
			continue
		}
		switch {
		case v.Field.Kind == relayfmt.String:
			fmt.Fprintf(&b, " %s=%q", n, v.Text())
		case v.Field.Hex:
			fmt.Fprintf(&b, " %s=0x%x", n, v.Uint(0))
		case v.Field.Elem.Signed():
			fmt.Fprintf(&b, " %s=%d", n, v.Int(0))
		default:
			fmt.Fprintf(&b, " %s=%d", n, v.Uint(0))
		}
	}
	return b.String()
}

// TestProbeSpecsKernelParses checks Parse against the kernel's own
// parsers: each spec Parse takes, uprobe_events (or kprobe_events) takes
// too, and each it refuses for a reason the kernel shares, the kernel
// refuses.
func TestProbeSpecsKernelParses(t *testing.T) {
	testenv.RequireRoot(t)
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type tc struct {
		args string
		ok   bool
	}
	common := []tc{
		{"%di", true}, {"x=%ax:u8 y=%bx:s16 z=%cx:x32", true}, {"p=+8(+0(%sp)):u64", true},
		{"s=+0(%di):string", true}, {"c=$comm", true}, {"k=$stack3:s32", true},
		{`i=\42`, true}, {"m=@0x601040:u32", true},
		{"%nope", false}, {"s=%di:string", false}, {"x=%di:u12", false}, {"r=$retval", false},
		{"1x=%di", false}, {"a=%di a=%si", false}, {"x=+0(%di", false},
	}
	for _, k := range []struct {
		file, kind, at string
		cases          []tc
	}{
		{"uprobe_events", "uprobe:" + bin + ":main", bin + ":0x1000", append(common, tc{"s=@0x1000:string", true}, tc{"a=$arg1", false})},
		{"kprobe_events", "kprobe:vfs_read", "vfs_read", append(common, tc{"a=$arg2:s32", true}, tc{"s=+u0(%si):string", true}, tc{"s=+0(%si):ustring", true})},
	} {
		events := filepath.Join(fs.Root, k.file)
		if _, err := os.Stat(events); err != nil {
			t.Logf("%s: no %s: %v", k.kind, k.file, err)
			continue
		}
		group := fmt.Sprintf("kcparse%d", os.Getpid())
		for i, c := range k.cases {
			spec := k.kind + " " + c.args
			_, perr := probe.Parse(spec)
			if (perr == nil) != c.ok {
				t.Errorf("Parse(%q): %v, want ok %v", spec, perr, c.ok)
				continue
			}
			def := fmt.Sprintf("p:%s/p%d %s %s\n", group, i, k.at, c.args)
			f, err := os.OpenFile(events, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, kerr := f.WriteString(def)
			f.Close()
			if kerr == nil {
				appendProbe(t, events, fmt.Sprintf("-:%s/p%d", group, i))
			}
			if (kerr == nil) != c.ok {
				t.Errorf("the kernel's %s took %q: %v; Parse: %v", k.file, def, kerr, perr)
			}
		}
	}
}
