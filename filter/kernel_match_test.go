package filter

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/testenv"
)

// call is one event the workload makes: the values of its own fields,
// the thread's comm and CPU when it fires, and the key its trace line
// reads as.
type call struct {
	vals map[string]any
	comm string
	cpu  int
	key  string
}

// setComm names the calling thread (PR_SET_NAME).
func setComm(name string) error {
	b := append([]byte(name), 0)
	return unix.Prctl(unix.PR_SET_NAME, uintptr(unsafePtr(b)), 0, 0, 0)
}

// onThread runs fn on a new locked OS thread that ends with it (the
// thread is never unlocked, so Go retires it with its changed name and
// affinity), passing the thread's id to tid first.
func onThread(tid chan<- int, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tid <- unix.Gettid()
		done <- fn()
	}()
	return <-done
}

// pin moves the calling thread to cpu.
func pin(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set)
}

// driver makes a workload's events and reads their trace lines: setup
// runs on the workload thread before tracing starts, work makes one
// call's event, parse returns a kept line's key.
type driver struct {
	// wrap returns the filter written for a case: by default
	// "common_pid == TID && (EXPR)", which keeps other tasks' events out.
	wrap  func(tid int, expr string) string
	setup func() error
	work  func(c call) error
	parse func(line string) (string, bool)
}

// filter returns the filter written for expr on thread tid.
func (d driver) filter(tid int, expr string) string {
	if d.wrap != nil {
		return d.wrap(tid, expr)
	}
	return fmt.Sprintf("common_pid == %d && (%s)", tid, expr)
}

// kernelCase is one filter run under the kernel and under Match.
type kernelCase struct {
	expr string
	feat Feature
}

// runKernelCases enables event in the instance and, for each case, sets
// the filter "common_pid == TID && (EXPR)", runs the workload and holds
// the trace lines the kernel kept (as keys, by parse) to the calls Match
// keeps. It fails unless some filter kept a strict, non-empty part of
// the calls, so a Match that always says yes or no cannot pass.
func runKernelCases(t *testing.T, in *instance, event string, calls []call, cases []kernelCase,
	drv driver) {
	rel := runningRelease(t)
	f := in.format(event)
	enable := filepath.Join(in.eventDir(event), "enable")
	if err := os.WriteFile(enable, []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = os.WriteFile(enable, []byte("0"), 0)
		in.clearFilter(event)
	}()
	partial := false
	for _, kc := range cases {
		if kc.feat != "" && !Has(rel, kc.feat) {
			continue
		}
		got, tid := in.trace(t, event, calls, kc.expr, drv)
		full := drv.filter(tid, kc.expr)
		flt, err := ParseOptions(full, f, Options{})
		if err != nil {
			t.Errorf("%q: %v", full, err)
			continue
		}
		var want []string
		for _, c := range calls {
			vals := map[string]any{"common_pid": tid}
			for k, v := range c.vals {
				vals[k] = v
			}
			if flt.Match(makeRecord(f, vals), c.comm, c.cpu) {
				want = append(want, c.key)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %q: the kernel kept %d events, Match %d\n kernel: %q\n  Match: %q", event, kc.expr, len(got), len(want), got, want)
		}
		partial = partial || len(want) > 0 && len(want) < len(calls)
	}
	if !partial {
		t.Errorf("%s: no filter kept a strict part of the %d events: the cases cannot tell Match from a constant", event, len(calls))
	}
}

// trace sets the filter of event for a new workload thread, runs the
// calls on it with tracing on, and returns the keys of the lines the
// kernel kept and the thread's id.
func (in *instance) trace(t *testing.T, event string, calls []call, expr string, drv driver) ([]string, int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(in.dir, "trace"), nil, 0); err != nil {
		t.Fatal(err)
	}
	tids := make(chan int, 1)
	ready := make(chan struct{})
	var setErr error
	var tid int
	go func() {
		tid = <-tids
		full := drv.filter(tid, expr)
		if v := in.setFilter(event, full); !v.accepted {
			setErr = fmt.Errorf("kernel refuses %q: %v %s", full, v.errno, v.text)
		}
		close(ready)
	}()
	on := filepath.Join(in.dir, "tracing_on")
	err := onThread(tids, func() error {
		<-ready
		if setErr != nil {
			return setErr
		}
		if drv.setup != nil {
			if err := drv.setup(); err != nil {
				return err
			}
		}
		if err := os.WriteFile(on, []byte("1"), 0); err != nil {
			return err
		}
		for _, c := range calls {
			if err := drv.work(c); err != nil {
				return err
			}
		}
		return os.WriteFile(on, []byte("0"), 0)
	})
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	b, err := os.ReadFile(filepath.Join(in.dir, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, l := range strings.Split(string(b), "\n") {
		if k, ok := drv.parse(l); ok {
			keys = append(keys, k)
		}
	}
	return keys, tid
}

// TestKernelMatches has the kernel filter events whose field values the
// test controls, in a temporary instance, and holds what it keeps to
// what Match keeps over records built from the same values.
func TestKernelMatches(t *testing.T) {
	in := newInstance(t)
	cpus := 1
	if runtime.NumCPU() > 1 {
		cpus = 2
	}
	t.Run("lseek", func(t *testing.T) { testLseek(t, in, cpus) })
	t.Run("task_rename", func(t *testing.T) { testRename(t, in, cpus) })
	t.Run("exec", func(t *testing.T) { testExec(t, in, cpus) })
}

var execLine = regexp.MustCompile(`sched_process_exec: filename=(\S+) pid=\d+ old_pid=\d+`)

// testExec runs /bin/true under names of its own (symbolic links in a
// temporary directory) for sched_process_exec's __data_loc filename;
// the child's comm is the name's first 15 bytes, its CPU the one the
// workload thread, which forks it, is pinned to.
func testExec(t *testing.T, in *instance, cpus int) {
	truePath, err := exec.LookPath("true")
	if err != nil {
		testenv.Missing(t, "no true command: %v", err)
	}
	dir := t.TempDir()
	names := []string{"alpha", "beta", "gamma-ray", "delta.sh", "a-name-longer-than-fifteen", "x"}
	var calls []call
	for i, n := range names {
		p := filepath.Join(dir, n)
		if err := os.Symlink(truePath, p); err != nil {
			t.Fatal(err)
		}
		comm := n
		if len(comm) > 15 {
			comm = comm[:15]
		}
		calls = append(calls, call{vals: map[string]any{"filename": p}, comm: comm, cpu: i % cpus, key: p})
	}
	work := func(c call) error {
		if err := pin(c.cpu); err != nil {
			return err
		}
		return exec.Command(c.vals["filename"].(string)).Run()
	}
	parse := func(l string) (string, bool) {
		m := execLine.FindStringSubmatch(l)
		if m == nil {
			return "", false
		}
		return m[1], true
	}
	wrap := func(_ int, expr string) string {
		return fmt.Sprintf("filename ~ %q && (%s)", dir+"/*", expr)
	}
	cases := []kernelCase{
		{`filename ~ "*/alpha"`, ""},
		{`filename ~ "*a"`, ""},
		{`filename ~ "*.sh"`, ""},
		{`filename ~ "*gamma*"`, ""},
		{`filename ~ "*/?eta"`, ""},
		{`filename ~ "*/[a-d]*"`, ""},
		{`filename ~ "!*a"`, ""},
		{fmt.Sprintf("filename == %q", filepath.Join(dir, "x")), ""},
		{fmt.Sprintf("filename != %q", filepath.Join(dir, "x")), ""},
		{`COMM == "a-name-longer-t"`, ""},
		{`comm ~ "*a" || CPU == 1`, ""},
	}
	runKernelCases(t, in, "sched:sched_process_exec", calls, cases, driver{wrap: wrap, work: work, parse: parse})
}

var lseekLine = regexp.MustCompile(`sys_lseek\(fd: (\w+), offset: (\w+), whence: (\w+)\)`)

func testLseek(t *testing.T, in *instance, cpus int) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	// Bad descriptors are bad in their low 32 bits too (lseek takes an
	// unsigned int): the tracepoint fires either way.
	fds := []uint64{uint64(null.Fd()), 0xffffffff, 0xfffffffffffffffe, 1<<40 | 0xfffffff0}
	offsets := []uint64{0, 5, 1048576, 1048577, 0xfffffffffffffffd, 1 << 63}
	whences := []uint64{0, 1, 2, 7, 1 << 33}
	comms := []string{"kc-a", "kc-b", "other"}
	var calls []call
	for i, fd := range fds {
		for j, off := range offsets {
			w := whences[(i+j)%len(whences)]
			calls = append(calls, call{
				vals: map[string]any{"fd": fd, "offset": off, "whence": w, "__syscall_nr": unix.SYS_LSEEK},
				comm: comms[(i+2*j)%len(comms)], cpu: (i + j) % cpus,
				key: fmt.Sprintf("%d %d %d", fd, off, w),
			})
		}
	}
	work := func(c call) error {
		if err := pin(c.cpu); err != nil {
			return err
		}
		if err := setComm(c.comm); err != nil {
			return err
		}
		unix.Syscall(unix.SYS_LSEEK, uintptr(toUint(c.vals["fd"])), uintptr(toUint(c.vals["offset"])), uintptr(toUint(c.vals["whence"])))
		return nil
	}
	parse := func(l string) (string, bool) {
		m := lseekLine.FindStringSubmatch(l)
		if m == nil {
			return "", false
		}
		var v [3]uint64
		for i := range v {
			// Hex, with 0x from 10 on in newer kernels and
			// without it in older ones (print_syscall_enter).
			v[i], _ = strconv.ParseUint(strings.TrimPrefix(m[i+1], "0x"), 16, 64)
		}
		return fmt.Sprintf("%d %d %d", v[0], v[1], v[2]), true
	}
	cases := []kernelCase{
		{"offset > 1048576", ""},
		{"offset == 0xfffffffffffffffd", ""},
		{"offset >= 0x8000000000000000", ""},
		{"whence & 2", ""},
		{"whence & 0x200000000", ""},
		{"whence == 1 || offset < 6", ""},
		{"fd == 0xffffffff && !(whence == 0)", ""},
		{"!(offset & 1) && fd != 0xffffffff", ""},
		{"whence > 1 && whence < 8", ""},
		{"fd <= 0xffffffff || whence == 7", ""},
		{fmt.Sprintf("__syscall_nr == %d && offset == 5", unix.SYS_LSEEK), ""},
		{`COMM == "kc-a"`, ""},
		{`comm ~ "kc-*" && whence != 2`, ""},
		{`!(COMM ~ "*b") || offset == 0`, ""},
		{`COMM ~ "?c-[a]"`, ""},
		{"CPU == 1", ""},
		{"cpu != 0 && offset == 5", ""},
		{"common_cpu < 1 || fd == 0xfffffffffffffffe", ""},
		{"CPU & CPUS{1}", FeatCPUS},
		{"CPU == CPUS{0-1} || offset == 0", FeatCPUS},
		{"offset & CPUS{0-1}", FeatCPUS},
		{"stacktrace == 0 || offset == 5", FeatStacktrace},
	}
	runKernelCases(t, in, "syscalls:sys_enter_lseek", calls, cases, driver{work: work, parse: parse})
}

var renameLine = regexp.MustCompile(`task_rename: pid=\d+ oldcomm=(.*) newcomm=(.*) oom_score_adj=(-?\d+)`)

func testRename(t *testing.T, in *instance, cpus int) {
	names := []string{"kc-alpha", "kc-beta", "kc-gamma", "kc-0123456789abcdef", "kc-abcdefghijta", "x", "kc-alpha", "kc-beta"}
	oom := 0
	if b, err := os.ReadFile("/proc/self/oom_score_adj"); err == nil {
		oom, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	// The thread starts with the name of the thread that made it; a
	// rename before tracing starts makes the first oldcomm known.
	start := "kc-start"
	var calls []call
	prev := start
	for i, n := range names {
		if len(n) > 15 {
			n = n[:15]
		}
		calls = append(calls, call{
			vals: map[string]any{"oldcomm": prev, "newcomm": n, "oom_score_adj": oom},
			comm: prev, cpu: i % cpus, key: prev + " " + n,
		})
		prev = n
	}
	work := func(c call) error {
		if err := pin(c.cpu); err != nil {
			return err
		}
		return setComm(c.vals["newcomm"].(string))
	}
	parse := func(l string) (string, bool) {
		m := renameLine.FindStringSubmatch(l)
		if m == nil {
			return "", false
		}
		return m[1] + " " + m[2], true
	}
	cases := []kernelCase{
		{`newcomm == "kc-alpha"`, ""},
		{`newcomm != "kc-alpha"`, ""},
		{`newcomm ~ "kc-*"`, ""},
		{`newcomm ~ "!kc-*"`, ""},
		{`oldcomm ~ "*beta*"`, ""},
		{`newcomm ~ "kc-?amma"`, ""},
		{`newcomm ~ "[a-k]c-*a"`, ""},
		// Not newcomm ~ "*ta" nor "*x*": the kernel copies newcomm with
		// strscpy, unpadded, and regex_match_end and _middle read the
		// whole array, whose tail is whatever the ring buffer held.
		{`oldcomm == "kc-0123456789ab"`, ""},
		{`newcomm == "kc-0123456789abcdef"`, ""},
		{`COMM == "kc-alpha" || COMM ~ "x"`, ""},
		{`oom_score_adj == 0 && newcomm ~ "*"`, ""},
		{`newcomm ~ "kc-\\a*"`, ""},
		{`newcomm ~ "kc-[!ab]*"`, ""},
		{`CPU == 0 && newcomm ~ "kc-*"`, ""},
	}
	// Nor oldcomm ~ "*ta" before 6.1: __set_task_comm copied names
	// unpadded (strlcpy), so the task's comm keeps a longer earlier
	// name's tail, which the record copies and regex_match_end reads,
	// and which the test's calls do not know.
	if major, minor, _ := testenv.KernelRelease(); major > 6 || major == 6 && minor >= 1 {
		cases = append(cases, kernelCase{`oldcomm ~ "*ta"`, ""})
	}
	runKernelCases(t, in, "task:task_rename", calls, cases, driver{setup: func() error { return setComm(start) }, work: work, parse: parse})
}
