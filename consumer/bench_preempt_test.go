package consumer

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// preemptTools are BenchmarkPreemptKept's tracers, in the order of a
// round: kconsume as built, kconsume with its raw syscall path kept on
// tp_btf (KCONSUME_RAW_FROM_PERF=0: without issue 57's fix), bpftrace.
var preemptTools = []string{"kconsume", "kconsume-btf", "bpftrace"}

// BenchmarkPreemptKept counts the events each tracer keeps of two busy
// tasks a CPU (issue 57): 2 × CPUs children of this binary, each pinned
// to a CPU and making b.N getpid calls (run with -benchtime Nx), recorded
// as syscalls:sys_enter_getpid by an ftrace instance and, at the same
// time, by one of `kconsume record --pid …`, the same with
// KCONSUME_RAW_FROM_PERF=0 (kconsume-btf), and bpftrace counting them in
// a map (`tracepoint:syscalls:sys_enter_getpid /tid == …/ { @n =
// count(); }`), the tools in an order that turns each round. Reported:
// each tool's and ftrace's kept events as a percentage of those made
// (median of the rounds), kconsume's discarded events (counted at their
// place in the trace) and the runs its summary says the kernel skipped.
// Where tracing programs run with preemption off every tool keeps them
// all; where they run preemptibly (preempt.go) only a tracer whose
// programs keep it off does.
func BenchmarkPreemptKept(b *testing.B) {
	testenv.RequireRoot(b)
	if b.N < 1000 {
		return // Go's first run of every benchmark, with b.N 1
	}
	bin := testenv.KconsumeBin(b)
	bt, err := exec.LookPath("bpftrace")
	if err != nil {
		testenv.Missing(b, "bpftrace is required (apt-get install bpftrace): %v", err)
	}
	fs, err := tracefs.Find()
	if err != nil {
		b.Fatal(err)
	}
	const event, perCPU = "syscalls:sys_enter_getpid", 2
	ncpu := runtime.NumCPU()
	rounds := benchRounds(5)
	kept := map[string][]float64{}
	var lost, missed uint64
	for r := range rounds {
		for k := range preemptTools {
			tool := preemptTools[(k+r+benchTurn())%len(preemptTools)]
			var kids []*tracedChild
			var pids []int
			for i := range perCPU * ncpu {
				c := startChild(b, "getpid", b.N, "KC_CHILD_CPU="+strconv.Itoa(i%ncpu))
				kids = append(kids, c)
				pids = append(pids, c.tid)
			}
			want := len(kids) * b.N
			inst, enable := ftraceInstance(b, fs, fmt.Sprintf("kept-%d-%s", r, tool), []string{event})
			var filter []string
			for _, p := range pids {
				filter = append(filter, "common_pid == "+strconv.Itoa(p))
			}
			ev := filepath.Join(inst, "events", "syscalls", "sys_enter_getpid")
			if err := os.WriteFile(filepath.Join(ev, "filter"), []byte(strings.Join(filter, " || ")), 0); err != nil {
				b.Fatal(err)
			}
			// 16 bytes a record and its header, with room to spare.
			kb := max(1024, 3*want*16/ncpu/1024)
			if err := os.WriteFile(filepath.Join(inst, "buffer_size_kb"), []byte(strconv.Itoa(kb)), 0); err != nil {
				b.Fatal(err)
			}
			if err := enable("1"); err != nil {
				b.Fatal(err)
			}
			stop := startKeptTracer(b, tool, map[bool]string{true: bt, false: bin}[tool == "bpftrace"], pids)
			errs := make(chan error, len(kids))
			for _, c := range kids {
				go func() { errs <- c.finish() }()
			}
			for range kids {
				if err := <-errs; err != nil {
					b.Fatalf("child: %v", err)
				}
			}
			got, l, m := stop()
			if err := enable("0"); err != nil {
				b.Fatal(err)
			}
			ft, overrun := ftraceEntries(b, inst)
			b.Logf("round %d, %s: %d of %d events (%d discarded, %d runs skipped), ftrace %d (overrun %d)", r+1, tool, got, want, l, m, ft, overrun)
			kept[tool] = append(kept[tool], 100*float64(got)/float64(want))
			kept["ftrace"] = append(kept["ftrace"], 100*float64(ft)/float64(want))
			if tool == "kconsume" {
				lost += l
				missed += m
			}
		}
	}
	for tool, v := range kept {
		b.ReportMetric(median(v), tool+"-kept-%")
	}
	b.ReportMetric(float64(perCPU*ncpu*b.N), "produced")
	b.ReportMetric(float64(lost), "kconsume-lost")
	b.ReportMetric(float64(missed), "kconsume-skipped")
}

// startKeptTracer starts tool recording sys_enter_getpid of the tasks
// pids and returns once it records; the function it returns stops it
// and returns the events it kept, those it counted discarded in its
// trace and the runs the kernel skipped as its summary says (kconsume),
// all 0 but the first for bpftrace, which counts and says nothing else.
func startKeptTracer(b *testing.B, tool, bin string, pids []int) func() (kept, lost, skipped uint64) {
	b.Helper()
	dir := b.TempDir()
	session := fmt.Sprintf("kc-kept-%d", os.Getpid())
	var cmd *exec.Cmd
	var ready func() bool
	if tool == "bpftrace" {
		var cond []string
		for _, p := range pids {
			cond = append(cond, "tid == "+strconv.Itoa(p))
		}
		cmd = exec.Command(bin, "-o", filepath.Join(dir, "out"), "-e",
			"tracepoint:syscalls:sys_enter_getpid /"+strings.Join(cond, " || ")+"/ { @n = count(); }")
		ready = func() bool {
			o, _ := os.ReadFile(filepath.Join(dir, "out"))
			return strings.Contains(string(o), "Attaching")
		}
	} else {
		ids := make([]string, len(pids))
		for i, p := range pids {
			ids[i] = strconv.Itoa(p)
		}
		cmd = exec.Command(bin, "record", "-e", "syscalls:sys_enter_getpid", "--pid", strings.Join(ids, ","), "-o", filepath.Join(dir, "t"), "--session", session)
		if tool == "kconsume-btf" {
			cmd.Env = append(os.Environ(), "KCONSUME_RAW_FROM_PERF=0")
		}
		state := filepath.Join(control.DefaultRoot, session, "state")
		ready = func() bool {
			st, _ := os.ReadFile(state)
			return strings.TrimSpace(string(st)) == "running"
		}
	}
	output := startLogged(b, cmd)
	for deadline := time.Now().Add(3 * time.Minute); !ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			text := output()
			_ = cmd.Wait()
			b.Fatalf("%s did not start:\n%s", tool, text)
		}
	}
	if tool == "bpftrace" {
		time.Sleep(time.Second) // it attaches after it says so
	}
	return func() (kept, lost, skipped uint64) {
		_ = cmd.Process.Signal(os.Interrupt)
		text := output()
		if err := cmd.Wait(); err != nil {
			b.Fatalf("%s: %v\n%s", tool, err, text)
		}
		if tool == "bpftrace" {
			o, err := os.ReadFile(filepath.Join(dir, "out"))
			if err != nil {
				b.Fatal(err)
			}
			m := regexp.MustCompile(`(?m)^@n: (\d+)$`).FindSubmatch(o)
			if m == nil {
				b.Fatalf("bpftrace printed no count:\n%s%s", text, o)
			}
			kept, _ = strconv.ParseUint(string(m[1]), 10, 64)
			return kept, 0, 0
		}
		if m := regexp.MustCompile(`skipped the recorder (\d+) times`).FindStringSubmatch(text); m != nil {
			skipped, _ = strconv.ParseUint(m[1], 10, 64)
		}
		tr, err := relayfmt.Open(filepath.Join(dir, "t"))
		if err != nil {
			b.Fatal(err)
		}
		mg, err := tr.Merge()
		if err != nil {
			b.Fatal(err)
		}
		defer mg.Close()
		for mg.Next() {
			switch it := mg.Item(); it.Kind {
			case relayfmt.EventItem:
				kept++
			case relayfmt.DiscardedEvents:
				lost += it.Count
			}
		}
		if err := mg.Err(); err != nil {
			b.Fatal(err)
		}
		return kept, lost, skipped
	}
}
