package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// eventLoadC is the workload of BenchmarkEventCost: n calls of one kind
// in a tight loop, timed with CLOCK_MONOTONIC per chunk of 1000 calls,
// printing the ns per call of the whole loop and of the median chunk
// (which leaves out the chunks where another task took the CPU: the
// machine is shared). C, static: a Go loop would add its scheduler's and
// runtime's noise.
// rename changes the thread's name (prctl PR_SET_NAME), which fires
// task:task_rename, a tracepoint carrying two comm strings; lseek seeks
// fd -1 to the call's index (sys_enter_lseek's fields fd, offset,
// whence; it fails with EBADF); call calls kc_target, which the uprobe
// session probes.
const eventLoadC = `#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define CHUNK 1000

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

/* The function the uprobe session probes. */
__attribute__((noinline)) long kc_target(long i)
{
	asm volatile("" ::: "memory");
	return i + 1;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	long i, j, n, k;
	double t0, t, *ch;
	int mode, p1[2], p2[2];
	volatile long sink = 0;
	pid_t child = -1;
	if (argc != 3 || (n = atol(argv[2])) < CHUNK) {
		fprintf(stderr, "usage: %s getpid|getppid|rename|pingpong|lseek|call N (N >= %d)\n", argv[0], CHUNK);
		return 2;
	}
	if (!strcmp(argv[1], "getpid"))
		mode = 0;
	else if (!strcmp(argv[1], "getppid"))
		mode = 1;
	else if (!strcmp(argv[1], "rename"))
		mode = 2;
	else if (!strcmp(argv[1], "pingpong"))
		mode = 3;
	else if (!strcmp(argv[1], "lseek"))
		mode = 4;
	else if (!strcmp(argv[1], "call"))
		mode = 5;
	else {
		fprintf(stderr, "unknown workload %s\n", argv[1]);
		return 2;
	}
	if (mode == 3 && (pipe(p1) || pipe(p2) || (child = fork()) < 0)) {
		perror("pingpong");
		return 1;
	}
	if (mode == 3 && child == 0) {
		/* Echo every byte back until the parent closes its end. */
		char c;
		close(p1[1]);
		close(p2[0]);
		while (read(p1[0], &c, 1) == 1 && write(p2[1], &c, 1) == 1)
			;
		_exit(0);
	}
	k = n / CHUNK;
	ch = malloc(k * sizeof(*ch));
	if (!ch)
		return 1;
	t0 = t = now();
	for (j = 0; j < k; j++) {
		double c;
		for (i = 0; i < CHUNK; i++) {
			if (mode == 0)
				syscall(SYS_getpid);
			else if (mode == 1)
				syscall(SYS_getppid);
			else if (mode == 2)
				prctl(PR_SET_NAME, (i & 1) ? "kcload-a" : "kcload-b", 0, 0, 0);
			else if (mode == 4)
				syscall(SYS_lseek, -1, i, 0);
			else if (mode == 5)
				sink += kc_target(i);
			else {
				char c = 'x';
				if (write(p1[1], &c, 1) != 1 || read(p2[0], &c, 1) != 1)
					return 1;
			}
		}
		c = now();
		ch[j] = (c - t) / CHUNK;
		t = c;
	}
	if (mode == 3) {
		close(p1[1]);
		waitpid(child, NULL, 0);
	}
	qsort(ch, k, sizeof(*ch), cmp);
	printf("%.3f %.3f\n", (t - t0) / (k * CHUNK), ch[k / 2]);
	return 0;
}
`

// buildEventLoad compiles eventLoadC with gcc into a static binary.
func buildEventLoad(b *testing.B) string {
	b.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Missing(b, "gcc is required for the C workloads (apt-get install gcc libc6-dev): %v", err)
	}
	dir := b.TempDir()
	src := filepath.Join(dir, "load.c")
	if err := os.WriteFile(src, []byte(eventLoadC), 0o644); err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(dir, "load")
	if out, err := exec.Command(gcc, "-O2", "-static", "-o", bin, src).CombinedOutput(); err != nil {
		b.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// eventRun is one workload of a session: the loop kind and whether it is
// pinned to CPU 0 with taskset.
type eventRun struct {
	name   string // metric prefix: getpid-pinned, ...
	loop   string // eventLoadC's first argument
	pinned bool
}

// eventSession is what one tracer invocation records while its runs go.
type eventSession struct {
	name  string // loss metric prefix
	event string // the one event recorded
	// pid filter: record only pid 1's events, which the workload never is.
	filter bool
	// A field filter every tool applies (kconsume -f, trace-cmd -f,
	// perf --filter), but kconsume-nf, which records unfiltered.
	expr string
	// A call chain every tool records with each event: "kernel"
	// (kconsume --stack kernel, trace-cmd -T, perf -g
	// --kernel-callchains) or "user" (--stack user, trace-cmd -O
	// userstacktrace, perf -g --user-callchains); kconsume-nf records
	// none.
	stack string
	// probe: the event is a uprobe on the workload's kc_target with its
	// argument, uprobes:kc_target in uprobe_events for trace-cmd and
	// perf, uprobe:LOAD:kc_target for kconsume (kcEvent, set once the
	// workload is built).
	probe bool
	// kprobe: the event is kprobes:kc_bench, this probe ("FUNC ARGS")
	// defined in kprobe_events for trace-cmd and perf; kconsume records
	// kcEvent.
	kprobe  string
	kcEvent string
	// syscalls is kconsume's --syscalls, when set (not kconsume-tp's).
	syscalls string
	// bpftrace is bpftrace's probe and bpftraceArg the argument it
	// prints (bpftrace tool) for the session's event, LOAD in it
	// standing for the workload's path; bpftrace-count counts the hits
	// in a map instead. Without a probe neither runs the session.
	bpftrace, bpftraceArg string
	// tools, when set, are the only tools of the session.
	tools []string
	// named: the session runs only when KCONSUME_BENCH_SESSIONS names
	// it (its probes need what some kernels lack: kprobes, fentry).
	named bool
	// trigger: a condition and action kconsume adds as --trigger to
	// the event (kconsume-nf records without it); tp: every kconsume
	// records through the tracepoints (--syscalls tracepoint), the path
	// a trigger takes.
	trigger string
	tp      bool
	// more are events recorded beside event, by every tool; moreAll
	// adds every syscall event but getppid's (the untraced syscall).
	more    []string
	moreAll bool
	runs    []eventRun
}

// events returns every event s records: its event, then the others.
func (s eventSession) events(b *testing.B) []string {
	out := append([]string{s.event}, s.more...)
	if !s.moreAll {
		return out
	}
	ents, err := os.ReadDir("/sys/kernel/tracing/events/syscalls")
	if err != nil {
		b.Fatalf("listing the syscall events: %v", err)
	}
	for _, e := range ents {
		if e.IsDir() && !strings.HasSuffix(e.Name(), "_getppid") && "syscalls:"+e.Name() != s.event {
			out = append(out, "syscalls:"+e.Name())
		}
	}
	return out
}

var eventSessions = []eventSession{
	{name: "getpid", event: "syscalls:sys_enter_getpid", runs: []eventRun{
		{"getpid-pinned", "getpid", true}, {"getpid-unpinned", "getpid", false},
		// getppid is not recorded: what every untraced syscall pays while
		// a syscall event is (kconsume's raw sys_enter path, the syscall
		// tracepoints' own dispatch for trace-cmd and perf).
		{"untraced-pinned", "getppid", true}, {"untraced-unpinned", "getppid", false},
	}},
	{name: "rename", event: "task:task_rename", runs: []eventRun{
		{"rename-pinned", "rename", true}, {"rename-unpinned", "rename", false},
	}},
	// A byte sent to a child process and back through two pipes: two
	// sched_switch events a round trip pinned to one CPU, more unpinned
	// (each side's switches to and from the idle task).
	{name: "switch", event: "sched:sched_switch", runs: []eventRun{
		{"switch-pinned", "pingpong", true}, {"switch-unpinned", "pingpong", false},
	}},
	{name: "pidfilter", event: "syscalls:sys_enter_getpid", filter: true, runs: []eventRun{
		{"pidfilter-pinned", "getpid", true}, {"pidfilter-unpinned", "getpid", false},
	}},
	// A field filter that rejects every event (fd is -1), and one that
	// keeps every event (the offsets are the call's index in a chunk).
	{name: "fieldreject", event: "syscalls:sys_enter_lseek", expr: "fd == 7", runs: []eventRun{
		{"fieldreject-pinned", "lseek", true}, {"fieldreject-unpinned", "lseek", false},
	}},
	{name: "fieldaccept", event: "syscalls:sys_enter_lseek", expr: "offset < 100000 && whence == 0", runs: []eventRun{
		{"fieldaccept-pinned", "lseek", true}, {"fieldaccept-unpinned", "lseek", false},
	}},
	// A string filter that rejects every rename (a sched-like event
	// that kconsume builds from the tracepoint's arguments).
	{name: "fieldreject-rename", event: "task:task_rename", expr: `newcomm == "nothing"`, runs: []eventRun{
		{"fieldreject-rename-pinned", "rename", true}, {"fieldreject-rename-unpinned", "rename", false},
	}},
	// Call chains: the kernel's of a rename (a tracepoint every kernel
	// gives one at), the user's of a getpid (the workload is static and
	// built without frame pointers: a frame or two, as most binaries).
	{name: "stack-kernel", event: "task:task_rename", stack: "kernel", runs: []eventRun{
		{"stack-kernel-pinned", "rename", true}, {"stack-kernel-unpinned", "rename", false},
	}},
	{name: "stack-user", event: "syscalls:sys_enter_getpid", stack: "user", runs: []eventRun{
		{"stack-user-pinned", "getpid", true}, {"stack-user-unpinned", "getpid", false},
	}},
	// A uprobe on a function of the workload, with its argument: what a
	// probe hit costs (its breakpoint's trap is most of it, for every
	// tool alike).
	{name: "uprobe", event: "uprobes:kc_target", probe: true, bpftrace: "uprobe:LOAD:kc_target", bpftraceArg: "arg0", runs: []eventRun{
		{"uprobe-pinned", "call", true}, {"uprobe-unpinned", "call", false},
	}},
	// A kprobe and a fentry program on a kernel function every getpid
	// calls once (task_tgid_vnr's), with its pid type argument; ftrace
	// and perf record the same kprobe in kprobe_events in both, bpftrace
	// takes the session's own kind.
	{name: "kprobe", event: "kprobes:kc_bench", kprobe: benchKprobe, kcEvent: "kprobe:" + benchKprobe,
		bpftrace: "kprobe:__task_pid_nr_ns", bpftraceArg: "arg1",
		tools: []string{"kconsume", "trace-cmd", "perf", "bpftrace", "bpftrace-count"}, named: true, runs: []eventRun{
			{"kprobe-pinned", "getpid", true}, {"kprobe-unpinned", "getpid", false},
		}},
	{name: "fentry", event: "kprobes:kc_bench", kprobe: benchKprobe, kcEvent: "fentry:__task_pid_nr_ns type",
		bpftrace: "kfunc:__task_pid_nr_ns", bpftraceArg: "args->type",
		tools: []string{"kconsume", "trace-cmd", "bpftrace", "bpftrace-count"}, named: true, runs: []eventRun{
			{"fentry-pinned", "getpid", true}, {"fentry-unpinned", "getpid", false},
		}},
	// getpid recorded by the raw syscall path as the kernel has it
	// (from the perf tracepoints where programs run preemptibly) and
	// kept on its tp_btf programs (kconsume-btf): what that costs.
	{name: "rawperf", event: "syscalls:sys_enter_getpid", syscalls: "raw", tools: []string{"kconsume", "kconsume-btf", "trace-cmd"}, named: true, runs: []eventRun{
		{"rawperf-pinned", "getpid", true}, {"rawperf-unpinned", "getpid", false},
	}},
	// getpid recorded by the function path as the kernel has it (on
	// kprobes where programs run preemptibly) and kept on its fentry
	// trampolines (kconsume-btf): what that costs.
	{name: "funckprobe", event: "syscalls:sys_enter_getpid", syscalls: "fentry", tools: []string{"kconsume", "kconsume-btf", "trace-cmd"}, named: true, runs: []eventRun{
		{"funckprobe-pinned", "getpid", true}, {"funckprobe-unpinned", "getpid", false},
	}},
	// getpid traced and getppid untraced while 8, then all syscall
	// events but getppid's are recorded (the getpid session is 1): the
	// path --syscalls auto takes for each set, and what a syscall that
	// is not recorded pays there.
	{name: "sys8", event: "syscalls:sys_enter_getpid", more: []string{"syscalls:sys_enter_read", "syscalls:sys_enter_write",
		"syscalls:sys_enter_openat", "syscalls:sys_enter_close", "syscalls:sys_enter_lseek", "syscalls:sys_enter_mmap", "syscalls:sys_enter_futex"},
		tools: []string{"kconsume", "kconsume-tp", "trace-cmd"}, runs: []eventRun{
			{"sys8-pinned", "getpid", true}, {"sys8-unpinned", "getpid", false},
			{"sys8-untraced-pinned", "getppid", true}, {"sys8-untraced-unpinned", "getppid", false},
		}},
	{name: "sysall", event: "syscalls:sys_enter_getpid", moreAll: true,
		tools: []string{"kconsume", "kconsume-tp", "trace-cmd"}, runs: []eventRun{
			{"sysall-pinned", "getpid", true}, {"sysall-unpinned", "getpid", false},
			{"sysall-untraced-pinned", "getppid", true}, {"sysall-untraced-unpinned", "getppid", false},
		}},
	// A trigger whose condition is never true (fd is -1), against the
	// same recording without it: both through the tracepoint's general
	// program copy, which a filter every event passes gives the event
	// either way.
	{name: "trigger", event: "syscalls:sys_enter_lseek", expr: "fd != 7", trigger: "fd == 7 : stop", tp: true, runs: []eventRun{
		{"trigger-pinned", "lseek", true}, {"trigger-unpinned", "lseek", false},
	}},
}

// benchKprobe is the kprobe and fentry sessions' probe: a function every
// getpid calls once, not inlined in Debian's kernels, and its second
// argument.
const benchKprobe = "__task_pid_nr_ns type=%si:s32"

// probeArgs are the uprobe session's fetch arguments, the same for
// every tool.
const benchProbeArgs = "a=%di:s64"

// setupProbeSessions defines, for the sessions with a probe, the
// uprobe_events probe trace-cmd and perf record and kconsume's -e, on
// the workload load; the probe is removed when b ends.
func setupProbeSessions(b *testing.B, sessions []eventSession, load string) {
	b.Helper()
	for i := range sessions {
		s := &sessions[i]
		if !s.probe && s.kprobe == "" {
			continue
		}
		fs, err := tracefs.Find()
		if err != nil {
			b.Fatal(err)
		}
		if s.kprobe != "" {
			events := filepath.Join(fs.Root, "kprobe_events")
			if !slices.ContainsFunc(sessions[:i], func(o eventSession) bool { return o.kprobe == s.kprobe }) {
				appendProbe(b, events, "p:kprobes/kc_bench "+s.kprobe)
				b.Cleanup(func() { appendProbe(b, events, "-:kprobes/kc_bench") })
			}
			continue
		}
		events := filepath.Join(fs.Root, "uprobe_events")
		_, name, _ := strings.Cut(s.event, ":")
		appendProbe(b, events, fmt.Sprintf("p:uprobes/%s %s:0x%x %s", name, load, fileOffset(b, load, "kc_target"), benchProbeArgs))
		b.Cleanup(func() { appendProbe(b, events, "-:uprobes/"+name) })
		s.kcEvent = "uprobe:" + load + ":kc_target " + benchProbeArgs
	}
}

// eventTools are the tracers measured, in the order of a round.
// kconsume-tp is kconsume with --syscalls tracepoint: each syscall event
// through its own tracepoint instead of the raw sys_enter path, which
// untraced syscalls do not pay for (the same as kconsume for a
// tracepoint that is not a syscall's).
// kconsume-nf is kconsume without the session's field filter.
// kconsume-btf is kconsume with KCONSUME_RAW_FROM_PERF=0: without the
// fixes for kernels that run tracing programs preemptibly, the raw
// syscall path on its tp_btf programs and the function path on its
// trampolines there (only in the sessions that name it). bpftrace prints each hit's
// argument into a file; bpftrace-count counts the hits in a map (only in
// the sessions that name it).
var eventTools = []string{"kconsume", "kconsume-tp", "kconsume-nf", "trace-cmd", "perf", "bpftrace", "bpftrace-count", "kconsume-btf"}

// BenchmarkEventCost measures what tracing adds per traced event, with C
// workloads of b.N calls (run with -benchtime Nx; N ≥ 100000, smaller
// runs measure nothing): getpid with syscalls:sys_enter_getpid recorded
// (a), prctl(PR_SET_NAME) with task:task_rename recorded, an event with
// two comm strings (b), a pipe round trip to a child with
// sched:sched_switch recorded (b, a sched event: 2 switches a round trip
// pinned), getpid with sys_enter_getpid recorded but only
// for pid 1, so every event is rejected by the pid filter (c: kconsume
// --pid 1, trace-cmd and perf with the filter common_pid == 1), and
// getppid while only sys_enter_getpid is recorded (the untraced-syscall
// cost). Each workload runs pinned to CPU 0 (taskset -c 0) and unpinned,
// untraced and under `kconsume record` (and, for syscall events, with
// --syscalls tracepoint), `trace-cmd record -d --no-filter` and `perf
// record -a`; lseek(-1, i, 0) with sys_enter_lseek recorded through a
// field filter that rejects every event (fieldreject: fd == 7) and one
// that keeps every event (fieldaccept), prctl(PR_SET_NAME) with
// task_rename recorded through a filter that rejects every event
// (fieldreject-rename), each tool given the filter
// (kconsume -f, trace-cmd -f, perf --filter) and kconsume once without
// it (kconsume-nf); the tools alternated in each round, in an order that
// turns from round to round. Reported per workload,
// for the whole loop and for its median 1000-call chunk: the untraced ns/call, each tool's added ns/call (median of
// the rounds minus the untraced median), and kconsume's added cost as a
// ratio of trace-cmd's (median of the rounds' ratios), with a field
// filter also as a ratio of kconsume's unfiltered (vs-unfiltered); per session each
// tool's losses. The host's tracing state is restored after trace-cmd.
// KCONSUME_BENCH_BASE_BIN names another kconsume binary, a previous
// commit's, run in the same rounds as kconsume-base and reported as
// kconsume is (its ratios as base-ratio): a change measured against it.
// Call chains: task_rename with the kernel's (stack-kernel: kconsume
// --stack kernel, trace-cmd -T, perf -g --kernel-callchains) and getpid
// with the user's (stack-user: --stack user, trace-cmd -O
// userstacktrace, perf -g --user-callchains), kconsume-nf recording
// the same events without (its vs-unfiltered ratio is then the stack's
// own cost, reported as vs-nostack). uprobe: a uprobe with one argument
// on a function the workload calls (kconsume -e 'uprobe:…', trace-cmd
// and perf the same probe defined in uprobe_events), no target yet.
// bpftrace (Debian's) runs the sessions that have a bpftrace probe: it
// prints each hit's argument into a file, the closest it has to
// recording the event, and its lost events are those it reports;
// bpftrace-count (kprobe and fentry) counts the hits in a map, which
// loses none and records nothing, the least a BPF tool does on a hit.
// kprobe and fentry: a kprobe (kconsume -e 'kprobe:…') and a fentry
// program (-e 'fentry:…') on a kernel function every getpid calls once,
// trace-cmd and perf recording the same kprobe defined in kprobe_events,
// bpftrace its own kprobe or fentry (kfunc) program. rawperf: getpid
// recorded through the raw syscall path as the kernel has it and kept
// on its tp_btf programs (kconsume-btf), reported as vs-btf: where
// programs run preemptibly, what taking the perf tracepoints costs.
// KCONSUME_BENCH_SESSIONS, a comma-separated list of session names
// (getpid, rename, switch, pidfilter, fieldreject, fieldaccept,
// fieldreject-rename, stack-kernel, stack-user, uprobe, trigger, sys8,
// sysall; kprobe, fentry, rawperf and funckprobe run only when named),
// runs only those. sys8 and sysall: getpid (traced) and getppid
// (untraced) while 8, then every syscall event but getppid's are
// recorded, by kconsume with --syscalls auto and tracepoint and by
// trace-cmd; the getpid session is the set of 1.
// trigger: lseek with a trigger never true (kconsume --trigger
// 'syscalls:sys_enter_lseek fd == 7 : stop') against kconsume-nf
// without it, both through the tracepoint (--syscalls tracepoint) with a
// filter every event passes (fd != 7, each tool given it), reported as
// vs-notrigger.
func BenchmarkEventCost(b *testing.B) {
	testenv.RequireRoot(b)
	if b.N < 100000 {
		return // Go's first run of every benchmark, with b.N 1
	}
	tools := map[string]string{"kconsume": testenv.KconsumeBin(b)}
	tools["kconsume-tp"] = tools["kconsume"]
	tools["kconsume-nf"] = tools["kconsume"]
	tools["kconsume-btf"] = tools["kconsume"]
	toolOrder := eventTools
	if base := os.Getenv("KCONSUME_BENCH_BASE_BIN"); base != "" {
		tools["kconsume-base"] = base
		toolOrder = append(slices.Clip(toolOrder), "kconsume-base")
	}
	sessions := slices.DeleteFunc(slices.Clone(eventSessions), func(s eventSession) bool { return s.named })
	if only := os.Getenv("KCONSUME_BENCH_SESSIONS"); only != "" {
		names := strings.Split(only, ",")
		sessions = slices.DeleteFunc(slices.Clone(eventSessions), func(s eventSession) bool { return !slices.Contains(names, s.name) })
		if len(sessions) == 0 {
			b.Fatalf("KCONSUME_BENCH_SESSIONS=%q names no session", only)
		}
	}
	need := []string{"trace-cmd", "perf", "taskset"}
	if slices.ContainsFunc(sessions, func(s eventSession) bool { return s.bpftrace != "" }) {
		need = append(need, "bpftrace")
	}
	for _, t := range need {
		p, err := exec.LookPath(t)
		if err != nil {
			testenv.Missing(b, "%s is required (apt-get install trace-cmd linux-perf util-linux bpftrace): %v", t, err)
		}
		tools[t] = p
	}
	tools["bpftrace-count"] = tools["bpftrace"]
	load := buildEventLoad(b)
	restore := testenv.SaveTracing(b)
	defer restore()
	sessions = slices.Clone(sessions)
	setupProbeSessions(b, sessions, load)
	rounds := benchRounds(5)
	n := strconv.Itoa(b.N)
	work := func(r eventRun) [2]float64 {
		args := []string{load, r.loop, n}
		if r.pinned {
			args = append([]string{tools["taskset"], "-c", "0"}, args...)
		}
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			b.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		var v [2]float64
		if _, err := fmt.Sscan(string(out), &v[0], &v[1]); err != nil {
			b.Fatalf("%s: %q: %v", strings.Join(args, " "), out, err)
		}
		return v
	}
	// ns[run][tool][0] per round, the whole loop's ns/call; [1] the median
	// chunk's; tool "" is untraced.
	ns := map[string]map[string][2][]float64{}
	lost := map[string]uint64{}
	add := func(run, tool string, v [2]float64) {
		if ns[run] == nil {
			ns[run] = map[string][2][]float64{}
		}
		t := ns[run][tool]
		t[0], t[1] = append(t[0], v[0]), append(t[1], v[1])
		ns[run][tool] = t
	}
	// The untraced runs ("") take their turn among the tools, and the
	// order turns each round: the host's speed drifts over seconds, and
	// a tool always run at the same place would meet it unevenly.
	order := append([]string{""}, toolOrder...)
	for r := 0; r < rounds; r++ {
		for _, s := range sessions {
			for k := range order {
				tool := order[(k+r+benchTurn())%len(order)]
				if tool == "" {
					for _, run := range s.runs {
						add(run.name, "", work(run))
					}
					continue
				}
				if !s.records(tool) {
					continue
				}
				// A retry is a new recording, whose runs replace the
				// failed one's.
				for try := 1; ; try++ {
					stop := startEventTracer(b, tool, tools[tool], s, load)
					var v [][2]float64
					for _, run := range s.runs {
						v = append(v, work(run))
					}
					l, err := stop()
					if tool == "trace-cmd" {
						restore()
					}
					if err != nil {
						if try < 3 && errors.Is(err, errRetry) {
							b.Logf("%s, round %d: %v; again", tool, r+1, err)
							continue
						}
						b.Fatal(err)
					}
					for i, run := range s.runs {
						add(run.name, tool, v[i])
					}
					lost[s.name+"-"+tool] += l
					break
				}
			}
		}
	}
	for _, s := range sessions {
		for _, run := range s.runs {
			for i, suffix := range []string{"", "-chunk"} {
				un := ns[run.name][""][i]
				base := median(un)
				b.ReportMetric(base, run.name+"-untraced-ns"+suffix)
				for _, tool := range toolOrder {
					if len(ns[run.name][tool][i]) == 0 {
						continue
					}
					b.ReportMetric(median(ns[run.name][tool][i])-base, run.name+"-"+tool+"-added-ns"+suffix)
				}
				// Per round against that round's untraced run, so the
				// ratios see the same noise.
				for _, p := range []struct{ tool, base, name string }{
					{"kconsume", "trace-cmd", "-ratio"}, {"kconsume-base", "trace-cmd", "-base-ratio"},
					{"kconsume", "bpftrace", "-vs-bpftrace"}, {"kconsume", "bpftrace-count", "-vs-bpftrace-count"}, {"kconsume", "kconsume-btf", "-vs-btf"},
				} {
					a, c := ns[run.name][p.tool][i], ns[run.name][p.base][i]
					if len(a) == 0 || len(c) == 0 {
						continue
					}
					var ratios []float64
					for r := range un {
						ratios = append(ratios, (a[r]-un[r])/(c[r]-un[r]))
					}
					name := run.name + p.name
					b.ReportMetric(median(ratios), name+suffix)
					b.ReportMetric(slices.Min(ratios), name+"-min"+suffix)
					b.ReportMetric(slices.Max(ratios), name+"-max"+suffix)
				}
				if nf := ns[run.name]["kconsume-nf"][i]; len(nf) > 0 {
					var ratios []float64
					for r := range un {
						ratios = append(ratios, (ns[run.name]["kconsume"][i][r]-un[r])/(nf[r]-un[r]))
					}
					vs := "-vs-unfiltered"
					switch {
					case s.stack != "":
						vs = "-vs-nostack"
					case s.trigger != "":
						vs = "-vs-notrigger"
					}
					b.ReportMetric(median(ratios), run.name+vs+suffix)
				}
			}
		}
		for _, tool := range toolOrder {
			if _, ok := lost[s.name+"-"+tool]; !ok {
				continue
			}
			b.ReportMetric(float64(lost[s.name+"-"+tool]), s.name+"-"+tool+"-lost")
		}
	}
}

// records reports whether tool records session s.
func (s eventSession) records(tool string) bool {
	switch {
	case s.tools != nil:
		return slices.Contains(s.tools, tool) && (!strings.HasPrefix(tool, "bpftrace") || s.bpftrace != "")
	case tool == "kconsume-tp":
		return strings.HasPrefix(s.event, "syscalls:") && !s.tp
	case tool == "kconsume-nf":
		return s.expr != "" || s.stack != "" || s.trigger != ""
	case tool == "bpftrace":
		return s.bpftrace != ""
	case tool == "kconsume-btf", tool == "bpftrace-count":
		return false
	}
	return true
}

// errRetry marks a recording that failed for a reason outside the
// measure, which may be run again.
var errRetry = errors.New("retry")

// startEventTracer starts tool recording s's event system-wide and
// returns once it records; the function it returns stops it and returns
// the events it reports lost: kconsume's discarded events in its trace,
// trace-cmd's overruns, perf's lost chunks. It fails wrapping errRetry
// when trace-cmd could not write its file because /proc/kallsyms changed
// size while it read it (BPF programs of the tracer before it are freed
// after it exits).
func startEventTracer(b *testing.B, tool, bin string, s eventSession, load string) func() (uint64, error) {
	b.Helper()
	dir := b.TempDir()
	session := fmt.Sprintf("kc-bench-%d", os.Getpid())
	var args []string
	switch tool {
	case "kconsume", "kconsume-tp", "kconsume-nf", "kconsume-base", "kconsume-btf":
		args = []string{"record", "-q", "-e", cmp.Or(s.kcEvent, s.event), "-o", filepath.Join(dir, "t"), "--session", session}
		for _, e := range s.events(b)[1:] {
			args = append(args, "-e", e)
		}
		if s.expr != "" && (tool != "kconsume-nf" || s.trigger != "") {
			args = append(args, "-f", s.expr)
		}
		if s.trigger != "" && tool != "kconsume-nf" {
			args = append(args, "--trigger", s.event+" "+s.trigger)
		}
		if s.tp {
			args = append(args, "--syscalls", "tracepoint")
		}
		if s.filter {
			args = append(args, "--pid", "1")
		}
		if tool == "kconsume-tp" {
			args = append(args, "--syscalls", "tracepoint")
		} else if s.syscalls != "" {
			args = append(args, "--syscalls", s.syscalls)
		}
		if s.stack != "" && tool != "kconsume-nf" {
			args = append(args, "--stack", s.stack)
		}
	case "trace-cmd":
		// trace-cmd -P would filter with set_event_pid, but it gives up on
		// it here along with set_ftrace_filter; the event filter is its
		// other way.
		args = []string{"record", "-d", "--no-filter", "-e", s.event, "-o", filepath.Join(dir, "trace.dat")}
		for _, e := range s.events(b)[1:] {
			args = append(args, "-e", e)
		}
		if s.filter {
			args = append(args, "-f", "common_pid == 1")
		}
		if s.expr != "" {
			args = append(args, "-f", s.expr)
		}
		switch s.stack {
		case "kernel":
			args = append(args, "-T")
		case "user":
			args = append(args, "-O", "userstacktrace")
		}
	case "perf":
		args = []string{"record", "-a", "-e", strings.Join(s.events(b), ","), "-o", filepath.Join(dir, "perf.data")}
		if s.filter {
			args = append(args, "--filter", "common_pid == 1")
		}
		if s.expr != "" {
			args = append(args, "--filter", s.expr)
		}
		if s.stack != "" {
			args = append(args, "-g", "--"+s.stack+"-callchains")
		}
	case "bpftrace":
		prog := fmt.Sprintf(`%s { printf("%%d\n", %s); }`, s.bpftrace, s.bpftraceArg)
		args = []string{"-o", filepath.Join(dir, "bpftrace.out"), "-e", strings.ReplaceAll(prog, "LOAD", load)}
	case "bpftrace-count":
		prog := s.bpftrace + " { @n = count(); }"
		args = []string{"-o", filepath.Join(dir, "bpftrace.out"), "-e", strings.ReplaceAll(prog, "LOAD", load)}
	}
	cmd := exec.Command(bin, args...)
	if tool == "kconsume-btf" {
		cmd.Env = append(os.Environ(), "KCONSUME_RAW_FROM_PERF=0")
	}
	output := startLogged(b, cmd)
	ready := func() bool { return true }
	switch tool {
	case "kconsume", "kconsume-tp", "kconsume-nf", "kconsume-base", "kconsume-btf":
		state := filepath.Join(control.DefaultRoot, session, "state")
		ready = func() bool {
			st, _ := os.ReadFile(state)
			return strings.TrimSpace(string(st)) == "running"
		}
	case "trace-cmd":
		// Its stdout is a pipe, so its "Hit Ctrl^C" line stays in its
		// buffer: wait for the event to be enabled and tracing on.
		sys, ev, _ := strings.Cut(s.event, ":")
		enable := filepath.Join("/sys/kernel/tracing/events", sys, ev, "enable")
		ready = func() bool {
			e, _ := os.ReadFile(enable)
			on, _ := os.ReadFile("/sys/kernel/tracing/tracing_on")
			return strings.TrimSpace(string(e)) == "1" && strings.TrimSpace(string(on)) == "1"
		}
	case "bpftrace", "bpftrace-count":
		// "Attaching 1 probe..." comes once its program is built, just
		// before it attaches it.
		ready = func() bool {
			o, _ := os.ReadFile(filepath.Join(dir, "bpftrace.out"))
			return strings.Contains(string(o), "Attaching")
		}
	}
	// An emulated guest's kconsume takes tens of seconds to read the
	// kernel's BTF and probe lists; a hung start is what this catches.
	for deadline := time.Now().Add(3 * time.Minute); !ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			text := output()
			_ = cmd.Wait()
			b.Fatalf("%s did not start:\n%s", tool, text)
		}
	}
	switch {
	case strings.HasPrefix(tool, "bpftrace"):
		time.Sleep(time.Second)
	case !strings.HasPrefix(tool, "kconsume"):
		// trace-cmd's per-CPU recorders start right after; perf says
		// nothing before it stops.
		time.Sleep(500 * time.Millisecond)
	}
	return func() (uint64, error) {
		_ = cmd.Process.Signal(os.Interrupt)
		text := output()
		err := cmd.Wait()
		var lost uint64
		switch tool {
		case "kconsume", "kconsume-tp", "kconsume-nf", "kconsume-base", "kconsume-btf":
			if err != nil {
				return 0, fmt.Errorf("kconsume record: %w\n%s", err, text)
			}
			lost = traceDiscarded(b, filepath.Join(dir, "t"))
		case "trace-cmd":
			// Debian's trace-cmd exits 1 here after recording, because it
			// cannot open set_ftrace_filter (no function tracer): judge
			// by its report.
			if !strings.Contains(text, "data recorded") {
				if strings.Contains(text, "error in size of file '/proc/kallsyms'") {
					return 0, fmt.Errorf("trace-cmd: %w: %v\n%s", errRetry, err, text)
				}
				return 0, fmt.Errorf("trace-cmd: no data recorded (%v)\n%s", err, text)
			}
			for _, m := range regexp.MustCompile(`(?m)^overrun: (\d+)`).FindAllStringSubmatch(text, -1) {
				n, _ := strconv.ParseUint(m[1], 10, 64)
				lost += n
			}
		case "perf":
			if !strings.Contains(text, "perf record: Captured") {
				return 0, fmt.Errorf("perf record: nothing captured (%v)\n%s", err, text)
			}
			if m := regexp.MustCompile(`lost (\d+) chunks`).FindStringSubmatch(text); m != nil {
				lost, _ = strconv.ParseUint(m[1], 10, 64)
			}
		case "bpftrace":
			o, rerr := os.ReadFile(filepath.Join(dir, "bpftrace.out"))
			if err != nil || rerr != nil {
				return 0, fmt.Errorf("bpftrace: %v (%v)\n%s", err, rerr, text)
			}
			// One line a hit: none means it recorded nothing.
			if !regexp.MustCompile(`(?m)^-?\d+$`).Match(o) {
				return 0, fmt.Errorf("bpftrace recorded no hit\n%s%s", text, o)
			}
			lost = bpftraceLost(text + string(o))
		case "bpftrace-count":
			o, rerr := os.ReadFile(filepath.Join(dir, "bpftrace.out"))
			if err != nil || rerr != nil {
				return 0, fmt.Errorf("bpftrace: %v (%v)\n%s", err, rerr, text)
			}
			if !regexp.MustCompile(`(?m)^@n: [1-9]\d*$`).Match(o) {
				return 0, fmt.Errorf("bpftrace counted no hit\n%s%s", text, o)
			}
		}
		return lost, nil
	}
}

// bpftraceLost returns the events bpftrace's output says it lost: the
// sum of its "Lost N events" lines.
func bpftraceLost(out string) uint64 {
	var lost uint64
	for _, m := range regexp.MustCompile(`Lost (\d+) events`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.ParseUint(m[1], 10, 64)
		lost += n
	}
	return lost
}

// traceDiscarded returns the events the trace in dir says were discarded.
func traceDiscarded(b *testing.B, dir string) uint64 {
	b.Helper()
	tr, err := relayfmt.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	m, err := tr.Merge()
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	var lost uint64
	for m.Next() {
		if it := m.Item(); it.Kind == relayfmt.DiscardedEvents {
			lost += it.Count
		}
	}
	return lost
}
