package consumer

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/kallsyms"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestKprobesMatchFtrace records a child's failing openat calls with a
// kprobe and a kretprobe on do_sys_openat2, the same fetch arguments
// given to kconsume and to the kernel's kprobe_events for an ftrace
// instance recording the child at the same time: every call's values
// (registers, parameters by their BTF names, $argN, a user string,
// kernel memory of each size, $comm, $stack0, the return value) and
// probe addresses must be ftrace's.
func TestKprobesMatchFtrace(t *testing.T) {
	fs, events, syms := kprobeSetup(t)
	const fn = "do_sys_openat2" // Linux 5.6+
	if _, _, ok := syms.Lookup(fn); !ok {
		t.Fatalf("no %s in the kernel's symbols", fn)
	}
	const (
		args = `dfd=%di:s32 filename=+0(%si):ustring flags=+0(%dx):x64 mode=+8(%dx):u16 a1=$arg1:s32 c=$comm st=$stack0:x64 dflt=%si`
		// kconsume names the first two by their BTF names instead.
		kcArgs  = `dfd filename:ustring flags=+0(%dx):x64 mode=+8(%dx):u16 a1=$arg1:s32 c=$comm st=$stack0:x64 dflt=%si`
		retArgs = `r=$retval:s64`
	)
	group := fmt.Sprintf("kckprobe%d", os.Getpid())
	defs := []string{
		fmt.Sprintf("p:%s/%s %s %s", group, fn, fn, args),
		fmt.Sprintf("r:%s/%s__return %s %s", group, fn, fn, retArgs),
	}
	for _, d := range defs {
		appendProbe(t, events, d)
		name := strings.Fields(d)[0][2:]
		t.Cleanup(func() { appendProbe(t, events, "-:"+name) })
	}
	c := startChild(t, "openat", 40)
	inst, enable := ftraceInstance(t, fs, "kprobe", []string{group + ":" + fn, group + ":" + fn + "__return"})
	if err := os.WriteFile(filepath.Join(inst, "set_event_pid"), []byte(fmt.Sprint(c.tid)), 0); err != nil {
		t.Fatal(err)
	}
	if err := enable("1"); err != nil {
		t.Fatal(err)
	}
	s, dir := newTestSession(t, Config{Events: []string{"kprobe:" + fn + " " + kcArgs, "kretprobe:" + fn + " " + retArgs}, PIDs: []int{c.tid}})
	recordChild(t, s, c)
	if err := enable("0"); err != nil {
		t.Fatal(err)
	}
	theirs := ftraceKprobeLines(t, inst, fn)
	var ours []string
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind == relayfmt.DiscardedEvents {
			t.Errorf("%d events discarded", it.Count)
		}
		if it.Kind == relayfmt.EventItem {
			ours = append(ours, kprobeLine(t, syms, it.Class.Name, vals))
		}
	})
	unknownRet(ours, theirs)
	if len(ours) != 2*40 || !slices.Equal(ours, theirs) {
		t.Fatalf("kconsume recorded %d events, ftrace %d, want %d each:\nkconsume: %q\nftrace:   %q", len(ours), len(theirs), 2*40, ours, theirs)
	}
	t.Logf("%d events alike, the first: %s", len(ours), ours[0])
}

// kprobeSetup skips t where kconsume's probes or the kernel's
// kprobe_events are missing, and returns tracefs, the kprobe_events file
// and the kernel's symbols.
func kprobeSetup(t *testing.T) (tracefs.FS, string, *kallsyms.Table) {
	t.Helper()
	testenv.RequireRoot(t)
	requireProbes(t)
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	events := filepath.Join(fs.Root, "kprobe_events")
	if _, err := os.Stat(events); err != nil {
		t.Skipf("this kernel has no kprobe_events (CONFIG_KPROBE_EVENTS): %v", err)
	}
	syms, err := kallsyms.Read()
	if err != nil {
		t.Fatal(err)
	}
	return fs, events, syms
}

// kretprobeUnknown is what ftrace prints for a kretprobe's return
// address on kernels that record its trampoline there (6.1, 6.12), which
// kallsyms cannot name; kconsume records the caller's address, as the
// later kernels' ftrace does.
const kretprobeUnknown = "[unknown/kretprobe'd]"

// unknownRet puts kretprobeUnknown in place of the return address of
// each of ours where ftrace's line at the same place has it.
func unknownRet(ours, theirs []string) {
	for i := range min(len(ours), len(theirs)) {
		if !strings.Contains(theirs[i], kretprobeUnknown) {
			continue
		}
		name, rest, _ := strings.Cut(ours[i], " ")
		if _, after, ok := strings.Cut(rest, " <- "); ok {
			ours[i] = name + " " + kretprobeUnknown + " <- " + after
		}
	}
}

// kprobeAddr matches a kernel address as ftrace prints it: sym+off/size.
var kprobeAddr = regexp.MustCompile(`(\S+)/0x[0-9a-f]+`)

// ftraceKprobeLines returns the events of function fn's probes in the
// instance at inst as kprobeLine writes them.
func ftraceKprobeLines(t *testing.T, inst, fn string) []string {
	t.Helper()
	line := regexp.MustCompile(`\s(` + fn + `(?:__return)?): \(([^)]*)\)(.*)$`)
	b, err := os.ReadFile(filepath.Join(inst, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if m := line.FindStringSubmatch(l); m != nil {
			out = append(out, m[1]+" "+kprobeAddr.ReplaceAllString(m[2], "$1")+m[3])
		}
	}
	return out
}

// kprobeLine writes a kprobe event of our trace as ftraceKprobeLines
// writes ftrace's: the addresses named by the kernel's symbols, then
// the arguments as probeLine writes them.
func kprobeLine(t *testing.T, syms *kallsyms.Table, class string, vals []relayfmt.Value) string {
	t.Helper()
	sym := func(a uint64, off bool) string {
		n, o, ok := syms.Name(a)
		switch {
		case !ok:
			return fmt.Sprintf("0x%x", a)
		case off:
			return fmt.Sprintf("%s+0x%x", n, o)
		}
		return n
	}
	_, name, _ := strings.Cut(class, ":")
	addrs := ""
	if v := field(vals, "__probe_ip"); v.Field != nil {
		addrs = sym(v.Uint(0), true)
	} else {
		addrs = sym(field(vals, "__probe_ret_ip").Uint(0), true) + " <- " + sym(field(vals, "__probe_func").Uint(0), false)
	}
	return name + " " + addrs + probeArgs(vals)
}

// TestKprobeGlobMatchesFtrace records a glob of kernel functions,
// kprobe:do_sys_open*, through one kprobe.multi link where the kernel
// has them: each function matched is an event of its own, and the
// child's opens come out as ftrace records them with a kprobe_events
// probe on each of those functions.
func TestKprobeGlobMatchesFtrace(t *testing.T) {
	fs, events, syms := kprobeSetup(t)
	all, err := probe.TraceableFunctions(fs.Root)
	if err != nil {
		t.Fatal(err)
	}
	const glob, args = "do_sys_open*", `dfd=%di:s32 name=+0(%si):ustring`
	var fns []string
	for _, f := range all {
		if ok, _ := path.Match(glob, f); ok && !slices.Contains(fns, f) {
			fns = append(fns, f)
		}
	}
	if len(fns) == 0 {
		t.Fatalf("no traceable function matches %s", glob)
	}
	group := fmt.Sprintf("kcglob%d", os.Getpid())
	var names []string
	for _, f := range fns {
		appendProbe(t, events, fmt.Sprintf("p:%s/%s %s %s", group, f, f, args))
		t.Cleanup(func() { appendProbe(t, events, "-:"+group+"/"+f) })
		names = append(names, group+":"+f)
	}
	c := startChild(t, "openat", 20)
	inst, enable := ftraceInstance(t, fs, "kglob", names)
	if err := os.WriteFile(filepath.Join(inst, "set_event_pid"), []byte(fmt.Sprint(c.tid)), 0); err != nil {
		t.Fatal(err)
	}
	if err := enable("1"); err != nil {
		t.Fatal(err)
	}
	s, dir := newTestSession(t, Config{Events: []string{"kprobe:" + glob + " " + args}, PIDs: []int{c.tid}})
	recordChild(t, s, c)
	if err := enable("0"); err != nil {
		t.Fatal(err)
	}
	theirs := ftraceKprobeLines(t, inst, "do_sys_open[a-z0-9_]*")
	var ours []string
	walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
		if it.Kind == relayfmt.EventItem {
			ours = append(ours, kprobeLine(t, syms, it.Class.Name, vals))
		}
	})
	if len(ours) < 20 || !slices.Equal(ours, theirs) {
		t.Fatalf("%s (%v): kconsume recorded %d events, ftrace %d:\nkconsume: %q\nftrace:   %q", glob, fns, len(ours), len(theirs), ours, theirs)
	}
	t.Logf("%s: %v, %d events alike, through %v", glob, fns, len(ours), s.rec.Progs())
}
