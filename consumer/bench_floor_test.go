package consumer

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/internal/testenv"
)

// floorStage is one configuration of BenchmarkRecorderFloor: a workload
// loop of eventLoadC run with one program of bpf/floor.bpf.c attached,
// with trace-cmd recording event, or with nothing.
type floorStage struct {
	name  string
	loop  string // eventLoadC's first argument
	prog  string // floor program to attach, or ""
	tp    bool   // attach prog to task:task_rename as a classic tracepoint
	event string // for trace-cmd: the event it records
}

var floorStages = []floorStage{
	{name: "untraced", loop: "getpid"},
	{name: "enter", loop: "getpid", prog: gen.FloorProgKcFloorEnter},
	{name: "clock", loop: "getpid", prog: gen.FloorProgKcFloorClock},
	{name: "ringbuf", loop: "getpid", prog: gen.FloorProgKcFloorRingbuf},
	{name: "area", loop: "getpid", prog: gen.FloorProgKcFloorArea},
	{name: "trace-cmd", loop: "getpid", event: "syscalls:sys_enter_getpid"},
	{name: "rename-untraced", loop: "rename"},
	{name: "rename-btf", loop: "rename", prog: gen.FloorProgKcFloorRenameBtf},
	{name: "rename-tp", loop: "rename", prog: gen.FloorProgKcFloorRenameTp, tp: true},
	{name: "rename-trace-cmd", loop: "rename", event: "task:task_rename"},
}

// floorFigures are what BenchmarkRecorderFloor reports: each the median
// over the rounds of one stage's ns per call minus another's in the same
// round (the C loop's median 1000-call chunk), pinned and unpinned.
var floorFigures = []struct{ name, stage, base string }{
	// Entering an empty tp_btf program on sys_enter: what every syscall
	// pays on the raw syscall path, traced or not.
	{"enter-ns", "enter", "untraced"},
	// Over entering: bpf_ktime_get_ns.
	{"clock-ns", "clock", "enter"},
	// Over entering: a 32-byte record reserved and submitted in a BPF
	// ring buffer.
	{"ringbuf-ns", "ringbuf", "enter"},
	// Over entering: a 32-byte record written into per-CPU memory behind
	// an atomic reservation, no helper call.
	{"area-ns", "area", "enter"},
	// trace-cmd's whole added cost for sys_enter_getpid.
	{"trace-cmd-getpid-ns", "trace-cmd", "untraced"},
	// An empty program on task:task_rename, as tp_btf and through perf.
	{"rename-btf-ns", "rename-btf", "rename-untraced"},
	{"rename-tp-ns", "rename-tp", "rename-untraced"},
	{"trace-cmd-rename-ns", "rename-trace-cmd", "rename-untraced"},
}

// BenchmarkRecorderFloor measures what a BPF recorder's per-event cost is
// made of on this machine, each part alone (bpf/floor.bpf.c), beside
// trace-cmd's whole cost in the same rounds: entering a BPF program from
// the sys_enter tracepoint, the clock, a BPF ring buffer record, a record
// in plain per-CPU memory, and entering a program on task:task_rename as
// tp_btf or through perf. Run with -benchtime Nx (100000 ≤ N ≤ 1000000):
// each run is N calls of the C loop of BenchmarkEventCost, pinned to CPU
// 0 and unpinned, the stages alternated in every round
// (KCONSUME_BENCH_ROUNDS, default 5).
func BenchmarkRecorderFloor(b *testing.B) {
	testenv.RequireRoot(b)
	if b.N < 100000 {
		return // Go's first run of every benchmark, with b.N 1
	}
	if b.N > 1000000 {
		b.Fatalf("-benchtime %dx: the floor ring holds the records of at most 1000000 calls", b.N)
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		testenv.Missing(b, "taskset is required (apt-get install util-linux): %v", err)
	}
	traceCmd, err := exec.LookPath("trace-cmd")
	if err != nil {
		testenv.Missing(b, "trace-cmd is required (apt-get install trace-cmd): %v", err)
	}
	load := buildEventLoad(b)
	restore := testenv.SaveTracing(b)
	defer restore()
	if err := rlimit.RemoveMemlock(); err != nil {
		b.Fatal(err)
	}
	spec, err := gen.LoadFloor()
	if err != nil {
		b.Fatal(err)
	}
	if err := spec.Variables[gen.FloorVarKcFloorNr].Set(int64(unix.SYS_GETPID)); err != nil {
		b.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		b.Fatalf("loading bpf/floor.bpf.c: %v", err)
	}
	defer coll.Close()
	empty := floorRingEmptier(b, coll.Maps[gen.FloorMapKcFloorRing])
	rounds := benchRounds(5)
	n := fmt.Sprint(b.N)
	run := func(loop string, pinned bool) float64 {
		args := []string{load, loop, n}
		if pinned {
			args = append([]string{taskset, "-c", "0"}, args...)
		}
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			b.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		var whole, chunk float64
		if _, err := fmt.Sscan(string(out), &whole, &chunk); err != nil {
			b.Fatalf("%s: %q: %v", strings.Join(args, " "), out, err)
		}
		return chunk
	}
	// ns[pinned][stage] per round
	ns := [2]map[string][]float64{{}, {}}
	for r := 0; r < rounds; r++ {
		for _, st := range floorStages {
			var stop func()
			switch {
			case st.event != "":
				s := startEventTracer(b, "trace-cmd", traceCmd, eventSession{name: st.name, event: st.event}, "")
				stop = func() {
					_, err := s()
					restore()
					if err != nil {
						b.Fatal(err)
					}
				}
			case st.prog != "":
				var l link.Link
				if st.tp {
					l, err = link.Tracepoint("task", "task_rename", coll.Programs[st.prog], nil)
				} else {
					l, err = link.AttachTracing(link.TracingOptions{Program: coll.Programs[st.prog]})
				}
				if err != nil {
					b.Fatalf("attaching %s: %v", st.prog, err)
				}
				stop = func() { _ = l.Close() }
			}
			for p := range 2 {
				ns[p][st.name] = append(ns[p][st.name], run(st.loop, p == 0))
			}
			if stop != nil {
				stop()
			}
			empty()
		}
	}
	for p, suffix := range []string{"-pinned", "-unpinned"} {
		for _, f := range floorFigures {
			d := make([]float64, rounds)
			for r := range d {
				d[r] = ns[p][f.stage][r] - ns[p][f.base][r]
			}
			b.ReportMetric(median(d), f.name+suffix)
		}
		b.ReportMetric(median(ns[p]["untraced"]), "untraced-getpid-ns"+suffix)
	}
}

// floorRingEmptier maps ring's positions and returns a function that
// marks everything in it read, so the next run reserves into free room.
func floorRingEmptier(b *testing.B, ring *ebpf.Map) func() {
	b.Helper()
	page := os.Getpagesize()
	cons, err := unix.Mmap(ring.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		b.Fatalf("mapping the floor ring's consumer page: %v", err)
	}
	prod, err := unix.Mmap(ring.FD(), int64(page), page, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatalf("mapping the floor ring's producer page: %v", err)
	}
	b.Cleanup(func() {
		_ = unix.Munmap(cons)
		_ = unix.Munmap(prod)
	})
	return func() {
		p := atomic.LoadUint64((*uint64)(unsafe.Pointer(&prod[0])))
		atomic.StoreUint64((*uint64)(unsafe.Pointer(&cons[0])), p)
	}
}
