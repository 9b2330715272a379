package main

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// saturationEvents are what BenchmarkSaturation records: every sched
// event (hackbench switches and wakes tasks by the hundred thousand) and
// the writes and reads its tasks pass messages with.
var saturationEvents = benchEvents()

// benchEvents returns saturationEvents: KCONSUME_BENCH_EVENTS, a
// comma-separated list, or the default above.
func benchEvents() []string {
	if e := os.Getenv("KCONSUME_BENCH_EVENTS"); e != "" {
		return strings.Split(e, ",")
	}
	return []string{"sched:*", "syscalls:sys_enter_write", "syscalls:sys_enter_read"}
}

// hackbench is perf's scheduler benchmark: 4 groups of 40 tasks passing
// 300 messages each through sockets, which saturates both CPUs of the
// benchmark machine for a few seconds.
var hackbench = []string{"bench", "sched", "messaging", "-g", "4", "-l", "300"}

// saturationBudget is one per-CPU buffer memory both tracers get:
// trace-cmd's ring buffer (-b, buffer_size_kb) and kconsume's BPF ring
// plus its sub-buffers.
type saturationBudget struct {
	name string
	kb   int      // trace-cmd -b
	args []string // kconsume record's buffer flags for the same memory
}

var saturationBudgets = []saturationBudget{
	// kconsume's defaults: a 4 MiB ring and 8 × 256 KiB sub-buffers.
	{"6M", 6 << 10, nil},
	// trace-cmd's default (buffer_size_kb 1408 once expanded), which the
	// issue measured against kconsume's 6 MiB.
	{"1408K", 1408, []string{"--memory", "1408K"}},
}

// saturationRun is what one hackbench run under a tracer gave.
type saturationRun struct {
	secs float64 // hackbench's own "Total time"
	// CPU time (user and system) of the command and the children it
	// reaped: the tracer's own threads and processes and hackbench's
	// tasks, which run the kernel's tracing (and kconsume's BPF) code.
	// Other load on the machine moves it less than the wall time.
	cpu      float64
	recorded uint64 // events in the trace
	lost     uint64 // events the tracer says it lost
	// kconsume's losses by layer: in the kernel (ring full), in the
	// channel (every sub-buffer full), and the recorder runs the kernel
	// skipped because another BPF program ran on the CPU (missed: an
	// upper bound with filters); the drainer's longest overrun (0 when
	// its summary did not print one).
	ringLost, dropped, missed uint64
	lateMs                    float64
	// own is the number of sched_switch events in the trace that switch
	// out one of the tracer's own threads or processes: its footprint in
	// what it records.
	own uint64
	// ownMs is kconsume's own CPU time while recording, by its summary
	// (draining and writing the trace; the command's excluded).
	ownMs float64
	// With KCONSUME_BENCH_BPF_STATS set, the kernel's run count and run
	// time of each of the recorder's programs (by name) over the run.
	bpf map[string]bpfProgStats
	// missing is, for kconsume-relayd, the events recorded that are not
	// in relayd's files (negative: more there than recorded).
	missing int64
}

func (r saturationRun) lostShare() float64 {
	if r.recorded+r.lost == 0 {
		return 0
	}
	return 100 * float64(r.lost) / float64(r.recorded+r.lost)
}

// BenchmarkSaturation runs hackbench (`perf bench sched messaging -g 4
// -l 300`) untraced, under `kconsume record` and under `trace-cmd record
// -d --no-filter -b KB`, both recording saturationEvents system-wide with
// the same buffer memory per CPU (saturationBudgets), in rounds
// (KCONSUME_BENCH_ROUNDS, default 3) in which the order of the three
// turns, and every other round runs backwards, so no tool always runs
// after the same one (what a run leaves behind, such as its trace's
// pages still being written back, falls on different tools). A plain
// rotation kept the same neighbours in every round. Each tracer runs
// hackbench as its command: hackbench's own "Total time" leaves the
// tracers' start and stop out. Reported per budget, medians of the
// rounds: hackbench's untraced seconds and CPU seconds; for each tracer
// its slowdown against the untraced run of the same round (%), the CPU
// time it added to that run's (%: its own, start and stop included, and
// what tracing cost hackbench's tasks; other load on the machine moves
// it less than the wall time), its share of lost events (lost /
// (recorded + lost), %) and its recorded events; for kconsume its losses
// by layer (ring full: the drainer came too late, or its write of local
// files stalled; sub-buffers full: a sink that failed, or relayd's
// behind) and the drainer's longest overrun; for each tracer its
// own context switches in its trace (sched_switch events whose prev_comm
// is the tracer's, which the tracer's threads and processes carry); for
// each kconsume binary the median over the rounds of its hackbench time
// minus trace-cmd's in the same round, in % of the untraced time, and in
// how many rounds it was the faster. trace-cmd's counts
// are the kernel's per-CPU "overrun", "read events" and "entries" it
// stores in its file (trace-cmd report --stat). The host's tracing state
// is restored after each trace-cmd run. KCONSUME_BENCH_BASE_BIN names
// another kconsume binary, a previous commit's, run in the same rounds
// and reported as kconsume-base: a change measured against it. With
// KCONSUME_BENCH_BPF_STATS set, the kernel's BPF run-time statistics are
// on during the kconsume runs, and the benchmark logs each recorder
// program's runs and time and reports their mean (`-bpf-ns/run`) and
// total (`-bpf-ms`): where the in-kernel cost goes. The statistics cost
// every program run two clock reads, so such a run's slowdowns are not
// to be compared with trace-cmd's.
func BenchmarkSaturation(b *testing.B) {
	testenv.RequireRoot(b)
	tools := map[string]string{"kconsume": testenv.KconsumeBin(b)}
	order := []string{"", "kconsume", "trace-cmd"}
	// Another kconsume binary (a previous commit's) in the same rounds,
	// to measure a change against.
	if base := os.Getenv("KCONSUME_BENCH_BASE_BIN"); base != "" {
		tools["kconsume-base"] = base
		order = append(order, "kconsume-base")
	}
	for _, t := range []string{"perf", "trace-cmd"} {
		p, err := exec.LookPath(t)
		if err != nil {
			testenv.Missing(b, "%s is required (apt-get install linux-perf trace-cmd): %v", t, err)
		}
		tools[t] = p
	}
	if out, err := exec.Command(tools["perf"], append(hackbench[:3:3], "-h")...).CombinedOutput(); err != nil && !strings.Contains(string(out), "messaging") {
		testenv.Missing(b, "perf bench sched messaging: %v\n%s", err, out)
	}
	saturationRounds(b, order, "trace-cmd", tools, saturationBudgets)
}

// BenchmarkSaturationRelayd is BenchmarkSaturation's hackbench at 6 MiB
// per CPU, untraced, recorded by kconsume into local files ("kconsume")
// and streamed by it to a real lttng-relayd on loopback, which writes
// the trace on the same CPUs ("kconsume-relayd"), in the same
// alternated rounds: whether streaming keeps up with the rates a
// recording produces. Besides BenchmarkSaturation's figures (the
// relayd runs' paired against the local runs'), it reports the events
// kconsume-relayd recorded that are not in relayd's files
// (kconsume-relayd-missing, read back; 0 when relayd has them all).
func BenchmarkSaturationRelayd(b *testing.B) {
	testenv.RequireRoot(b)
	tools := map[string]string{"kconsume": testenv.KconsumeBin(b)}
	p, err := exec.LookPath("perf")
	if err != nil {
		testenv.Missing(b, "perf is required (apt-get install linux-perf): %v", err)
	}
	tools["perf"] = p
	r := testenv.StartQuietRelayd(b)
	saturationRelayd = r
	defer func() { saturationRelayd = nil }()
	saturationRounds(b, []string{"", "kconsume", "kconsume-relayd", "kconsume-relayd-nice"}, "kconsume", tools, saturationBudgets[:1])
}

// saturationRelayd is BenchmarkSaturationRelayd's relayd, to which the
// kconsume-relayd runs stream and which the
// kconsume-relayd-nice runs renice to kconsume's own priority.
var saturationRelayd *testenv.Relayd

// saturationRounds runs hackbench untraced and under each tool of order
// (order[0] is "", untraced), in rounds for each budget, and reports
// BenchmarkSaturation's figures; each other tool's slowdown is paired by
// round with that of paired.
func saturationRounds(b *testing.B, order []string, paired string, tools map[string]string, budgets []saturationBudget) {
	restore := testenv.SaveTracing(b)
	defer restore()
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("KCONSUME_BENCH_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	if avg, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average before: %s", strings.TrimSpace(string(avg)))
	}
	for _, budget := range budgets {
		b.Run(budget.name, func(b *testing.B) {
			runs := map[string][]saturationRun{}
			for r := range rounds * b.N {
				for i := range order {
					tool := order[(i+r)%len(order)]
					if r%2 == 1 {
						tool = order[(len(order)-1-i+r)%len(order)]
					}
					var run saturationRun
					for try := 1; ; try++ {
						var err error
						run, err = saturate(b, tool, tools, budget)
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
						break
					}
					b.Logf("round %d, %s: hackbench %.3f s, %.2f CPU s, %d events recorded, %d lost (ring %d, sub-buffers %d, missed %d), drainer %.1f ms late, %d own switches, own CPU %.1f ms, %d not in relayd's files",
						r+1, cmp.Or(tool, "untraced"), run.secs, run.cpu, run.recorded, run.lost, run.ringLost, run.dropped, run.missed, run.lateMs, run.own, run.ownMs, run.missing)
					for _, name := range slices.Sorted(maps.Keys(run.bpf)) {
						p := run.bpf[name]
						if p.runs == 0 {
							continue
						}
						b.Logf("round %d, %s: BPF %-18s %9d runs, %7.1f ms, %6.1f ns a run", r+1, tool, name, p.runs, p.time.Seconds()*1e3, p.perRun())
					}
					runs[tool] = append(runs[tool], run)
				}
			}
			un := runs[""]
			b.ReportMetric(median(secsOf(un)), "untraced-s")
			var unCPU []float64
			for _, run := range un {
				unCPU = append(unCPU, run.cpu)
			}
			b.ReportMetric(median(unCPU), "untraced-cpu-s")
			for _, tool := range order[1:] {
				var slow, cpu, share, rec, own []float64
				for r, run := range runs[tool] {
					slow = append(slow, 100*(run.secs/un[r].secs-1))
					cpu = append(cpu, 100*(run.cpu/un[r].cpu-1))
					share = append(share, run.lostShare())
					rec = append(rec, float64(run.recorded))
					own = append(own, float64(run.own))
				}
				b.ReportMetric(median(own), tool+"-own-switches")
				b.ReportMetric(median(slow), tool+"-slowdown-%")
				b.ReportMetric(slices.Min(slow), tool+"-slowdown-min-%")
				b.ReportMetric(slices.Max(slow), tool+"-slowdown-max-%")
				b.ReportMetric(median(cpu), tool+"-cpu-%")
				b.ReportMetric(median(share), tool+"-lost-%")
				b.ReportMetric(slices.Min(share), tool+"-lost-min-%")
				b.ReportMetric(slices.Max(share), tool+"-lost-max-%")
				b.ReportMetric(median(rec), tool+"-events")
				if tool == paired {
					continue
				}
				// Paired by round: both ran within seconds of each
				// other and of the same untraced run, so the host's
				// slow and fast phases, which move every tool's
				// slowdown by ten points, mostly cancel.
				var diff []float64
				below := 0
				for r, run := range runs[tool] {
					d := 100 * (run.secs - runs[paired][r].secs) / un[r].secs
					diff = append(diff, d)
					if d < 0 {
						below++
					}
				}
				b.ReportMetric(median(diff), tool+"-minus-"+paired+"-%")
				b.ReportMetric(float64(below), tool+"-rounds-faster")
				// Two runs of one binary in the same rounds differed by
				// 12 points of median here: the interval says how far
				// the median can be trusted.
				lo, hi, conf := medianInterval(diff)
				b.ReportMetric(lo, tool+"-minus-"+paired+"-lo-%")
				b.ReportMetric(hi, tool+"-minus-"+paired+"-hi-%")
				b.ReportMetric(100*conf, "paired-confidence-%")
				b.Logf("%s minus %s: median %.1f points, %.0f %% interval [%.1f, %.1f] over %d rounds, faster in %d",
					tool, paired, median(diff), 100*conf, lo, hi, len(diff), below)
			}
			for _, tool := range order[1:] {
				if !strings.HasPrefix(tool, "kconsume") {
					continue
				}
				var ring, sub, miss, late, ownMs []float64
				for _, run := range runs[tool] {
					all := float64(run.recorded + run.lost)
					ring = append(ring, 100*float64(run.ringLost)/all)
					sub = append(sub, 100*float64(run.dropped)/all)
					miss = append(miss, 100*float64(run.missed)/all)
					late = append(late, run.lateMs)
					ownMs = append(ownMs, run.ownMs)
				}
				// A binary without the summary's line reports 0.
				b.ReportMetric(median(ownMs), tool+"-own-cpu-ms")
				b.ReportMetric(median(ring), tool+"-ring-lost-%")
				b.ReportMetric(median(sub), tool+"-subbuf-lost-%")
				b.ReportMetric(median(miss), tool+"-missed-%")
				b.ReportMetric(median(late), tool+"-late-ms")
				if strings.HasPrefix(tool, "kconsume-relayd") {
					// The worst round's: any is a fault.
					worst := 0.0
					for _, run := range runs[tool] {
						worst = max(worst, math.Abs(float64(run.missing)))
					}
					b.ReportMetric(worst, tool+"-missing")
				}
				if bpfStatsWanted() {
					var ns, ms []float64
					for _, run := range runs[tool] {
						var all bpfProgStats
						for _, p := range run.bpf {
							all.add(p)
						}
						ns = append(ns, all.perRun())
						ms = append(ms, all.time.Seconds()*1e3)
					}
					b.ReportMetric(median(ns), tool+"-bpf-ns/run")
					b.ReportMetric(median(ms), tool+"-bpf-ms")
				}
			}
		})
	}
	if avg, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average after: %s", strings.TrimSpace(string(avg)))
	}
}

// errRetry marks a run that failed for a reason outside the measure,
// which may be run again.
var errRetry = errors.New("retry")

var (
	totalTime = regexp.MustCompile(`Total time: ([0-9.]+) \[sec\]`)
	// kconsume record's summary: "N events recorded (SIZE) in T, M discarded",
	// its per-CPU table and its note on the drainer's lateness.
	kcRecorded = regexp.MustCompile(`(?m)^(\d+) events recorded \(.*\) in .*, (\d+) discarded(, up to \d+ more missed.*)?$`)
	kcCPU      = regexp.MustCompile(`(?m)^\d+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$`)
	kcLate     = regexp.MustCompile(`times the consumer ran more than --latency after it asked to, once ([0-9.]+[µmn]?s) late`)
	kcOwnCPU   = regexp.MustCompile(`(?m)^kconsume's own CPU while recording: ([0-9.]+) ms`)
	// trace-cmd report --stat: the kernel's per-CPU ring buffer counts.
	tcOverrun = regexp.MustCompile(`(?m)^overrun: (\d+)$`)
	tcRead    = regexp.MustCompile(`(?m)^read events: (\d+)$`)
	tcEntries = regexp.MustCompile(`(?m)^entries: (\d+)$`)
	// trace-cmd report's sched_switch: "prev_comm:prev_pid [prio] state
	// ==> next_comm:next_pid [prio]".
	tcOwnSwitch = regexp.MustCompile(`sched_switch: +trace-cmd:\d+ \[`)
)

// saturate runs hackbench once, untraced (tool "") or as the command of
// tool recording saturationEvents within budget, and returns what it gave.
func saturate(b *testing.B, tool string, tools map[string]string, budget saturationBudget) (saturationRun, error) {
	dir, err := os.MkdirTemp("", "kc-saturation")
	if err != nil {
		return saturationRun{}, err
	}
	defer os.RemoveAll(dir)
	var args []string
	var relaydSession string
	switch tool {
	case "":
		args = append([]string{tools["perf"]}, hackbench...)
	case "kconsume", "kconsume-base":
		args = append([]string{tools[tool], "record", "-q", "-o", filepath.Join(dir, "t"), "--session", fmt.Sprintf("kc-sat-%d", os.Getpid()),
			"-e", strings.Join(saturationEvents, ",")}, budget.args...)
		args = append(append(args, "--", tools["perf"]), hackbench...)
	case "kconsume-relayd", "kconsume-relayd-nice":
		if tool == "kconsume-relayd-nice" {
			saturationRelayd.Renice(b, defaultNice)
			defer saturationRelayd.Renice(b, 0)
		}
		// No local copy: relayd alone gets the packets.
		relaydSession = fmt.Sprintf("kc-sat-%d-%d", os.Getpid(), time.Now().UnixNano())
		args = append([]string{tools["kconsume"], "record", "-q", "--relayd", saturationRelayd.URL(), "--relayd-hostname", "bench", "--session", relaydSession,
			"-e", strings.Join(saturationEvents, ",")}, budget.args...)
		args = append(append(args, "--", tools["perf"]), hackbench...)
	case "trace-cmd":
		// -d: no function tracer, which Debian's kernels here refuse.
		args = []string{tools[tool], "record", "-d", "--no-filter", "-b", strconv.Itoa(budget.kb), "-o", filepath.Join(dir, "trace.dat")}
		for _, e := range saturationEvents {
			args = append(args, "-e", e)
		}
		args = append(append(args, tools["perf"]), hackbench...)
	}
	var stats *bpfStatsWatch
	if bpfStatsWanted() && strings.HasPrefix(tool, "kconsume") {
		if stats, err = watchBPFStats("kc_"); err != nil {
			return saturationRun{}, err
		}
	}
	cmd := exec.Command(args[0], args[1:]...)
	out, err := cmd.CombinedOutput()
	text := string(out)
	var run saturationRun
	if stats != nil {
		run.bpf = stats.stop()
	}
	if cmd.ProcessState != nil {
		run.cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	if tool == "trace-cmd" && strings.Contains(text, "error in size of file '/proc/kallsyms'") {
		// /proc/kallsyms changed size while trace-cmd read it to write
		// its file: the BPF programs of the kconsume run before it are
		// freed late.
		return run, fmt.Errorf("trace-cmd: %w: %v\n%s", errRetry, err, text)
	}
	m := totalTime.FindStringSubmatch(text)
	if m == nil {
		return run, fmt.Errorf("%s: no hackbench time (%v)\n%s", strings.Join(args, " "), err, text)
	}
	run.secs, _ = strconv.ParseFloat(m[1], 64)
	switch tool {
	case "kconsume", "kconsume-base", "kconsume-relayd", "kconsume-relayd-nice":
		if err != nil {
			return run, fmt.Errorf("kconsume record: %w\n%s", err, text)
		}
		m := kcRecorded.FindStringSubmatch(text)
		if m == nil {
			return run, fmt.Errorf("kconsume record printed no summary:\n%s", text)
		}
		run.recorded, _ = strconv.ParseUint(m[1], 10, 64)
		run.lost, _ = strconv.ParseUint(m[2], 10, 64)
		for _, c := range kcCPU.FindAllStringSubmatch(text, -1) {
			ring, _ := strconv.ParseUint(c[2], 10, 64)
			missed, _ := strconv.ParseUint(c[3], 10, 64)
			dropped, _ := strconv.ParseUint(c[4], 10, 64)
			run.ringLost += ring
			run.missed += missed
			run.dropped += dropped
		}
		if m := kcOwnCPU.FindStringSubmatch(text); m != nil {
			run.ownMs, _ = strconv.ParseFloat(m[1], 64)
		}
		if m := kcLate.FindStringSubmatch(text); m != nil {
			d, err := time.ParseDuration(m[1])
			if err != nil {
				return run, fmt.Errorf("kconsume record's lateness %q: %w", m[1], err)
			}
			run.lateMs = float64(d) / float64(time.Millisecond)
		}
		trace := filepath.Join(dir, "t")
		if strings.HasPrefix(tool, "kconsume-relayd") {
			// relayd's HOST/SESSION-DATE-TIME/kernel, counted and then
			// removed: a round's trace is 40 MB.
			dirs, _ := filepath.Glob(filepath.Join(saturationRelayd.Out, "bench", relaydSession+"*", "kernel"))
			if len(dirs) != 1 {
				return run, fmt.Errorf("relayd's trace of session %s: found %v", relaydSession, dirs)
			}
			trace = dirs[0]
			defer os.RemoveAll(filepath.Dir(trace))
			n, err := traceEvents(trace)
			if err != nil {
				return run, fmt.Errorf("relayd's trace: %w", err)
			}
			run.missing = int64(run.recorded) - int64(n)
		}
		// The report is always the current binary's: the format is the
		// same for both.
		rep, err := exec.Command(tools["kconsume"], "report", trace, "-e", "sched:sched_switch").Output()
		if err != nil {
			return run, fmt.Errorf("kconsume report: %w", err)
		}
		// The kernel keeps the first 15 bytes of the binary's name as
		// the comm (TASK_COMM_LEN).
		comm := filepath.Base(cmp.Or(tools[tool], tools["kconsume"]))
		comm = comm[:min(len(comm), 15)]
		run.own = uint64(strings.Count(string(rep), `prev_comm="`+comm+`"`))
	case "trace-cmd":
		// Debian's trace-cmd exits 1 after recording, because it cannot
		// open set_ftrace_filter (no function tracer): judge by its file.
		if !strings.Contains(text, "data recorded") {
			return run, fmt.Errorf("trace-cmd: no data recorded (%v)\n%s", err, text)
		}
		st, err := exec.Command(tools[tool], "report", "--stat", "-i", filepath.Join(dir, "trace.dat")).CombinedOutput()
		if err != nil {
			return run, fmt.Errorf("trace-cmd report --stat: %w\n%s", err, st)
		}
		// The counts are taken before trace-cmd's last read of the
		// buffers: the "entries" left then are in its file too.
		over, read, left := tcOverrun.FindAllStringSubmatch(string(st), -1), tcRead.FindAllStringSubmatch(string(st), -1), tcEntries.FindAllStringSubmatch(string(st), -1)
		if len(over) == 0 || len(read) != len(over) || len(left) != len(over) {
			return run, fmt.Errorf("trace-cmd report --stat: no per-CPU entries, overrun and read events:\n%s", st)
		}
		for i := range over {
			o, _ := strconv.ParseUint(over[i][1], 10, 64)
			r, _ := strconv.ParseUint(read[i][1], 10, 64)
			e, _ := strconv.ParseUint(left[i][1], 10, 64)
			run.lost += o
			run.recorded += r + e
		}
		rep, err := exec.Command(tools[tool], "report", "-i", filepath.Join(dir, "trace.dat"), "-F", "sched/sched_switch").Output()
		if err != nil {
			return run, fmt.Errorf("trace-cmd report: %w", err)
		}
		run.own = uint64(len(tcOwnSwitch.FindAllIndex(rep, -1)))
	default:
		if err != nil {
			return run, fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, text)
		}
	}
	return run, nil
}

// traceEvents returns the events of the trace in dir, as relayfmt's
// reader finds them.
func traceEvents(dir string) (uint64, error) {
	t, err := relayfmt.Open(dir)
	if err != nil {
		return 0, err
	}
	return t.Events()
}

func secsOf(runs []saturationRun) []float64 {
	var s []float64
	for _, r := range runs {
		s = append(s, r.secs)
	}
	return s
}

// medianInterval returns a confidence interval for the median of v that
// assumes nothing of v's distribution, and its confidence: the order
// statistics k and n+1-k (from 1) for the largest k whose two tails,
// 2·P(X < k) with X binomial(n, ½), are at most 5 %. With fewer than 6
// values no k qualifies, and it returns v's range with the confidence
// that has, 1 - 2^(1-n). It returns zeros for an empty v.
func medianInterval(v []float64) (lo, hi, conf float64) {
	n := len(v)
	if n == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	k, tails := 1, 2*math.Pow(0.5, float64(n))    // k = 1: the range
	below, term := 0.0, math.Pow(0.5, float64(n)) // P(X < j), and P(X = j-1)
	for j := 1; j <= n/2; j++ {
		below += term
		if 2*below > 0.05 {
			break
		}
		k, tails = j, 2*below
		term *= float64(n-j+1) / float64(j)
	}
	return s[k-1], s[n-k], 1 - tails
}

// median returns the middle of v (the mean of the two middle values when
// even); v is not changed.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func TestMedianInterval(t *testing.T) {
	seq := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(n - i) // reversed: the order statistic k is k
		}
		return v
	}
	for _, c := range []struct {
		n      int
		lo, hi float64
		conf   float64
	}{
		// 2·P(X ≤ 9) = 0.0428 for n = 30, and 2·P(X ≤ 10) = 0.0987.
		{30, 10, 21, 1 - 0.04277},
		// 2·P(X ≤ 1) = 0.0391 for n = 9, and 2·P(X ≤ 2) = 0.180.
		{9, 2, 8, 1 - 0.03906},
		// 2·P(X = 0) = 1/32 for n = 6: the range is the interval.
		{6, 1, 6, 1 - 0.03125},
		// n = 5: no 95 % interval; the range, at 1 - 1/16.
		{5, 1, 5, 0.9375},
		{1, 1, 1, 0},
	} {
		lo, hi, conf := medianInterval(seq(c.n))
		if lo != c.lo || hi != c.hi || math.Abs(conf-c.conf) > 1e-4 {
			t.Errorf("n %d: interval [%v, %v] at %.5f, want [%v, %v] at %.5f", c.n, lo, hi, conf, c.lo, c.hi, c.conf)
		}
	}
	if lo, hi, conf := medianInterval(nil); lo != 0 || hi != 0 || conf != 0 {
		t.Errorf("empty: [%v, %v] at %v, want zeros", lo, hi, conf)
	}
}
