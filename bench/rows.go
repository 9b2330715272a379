package main

import (
	"fmt"
	"strings"
)

type sectionRow struct {
	section string
	row     row
	guest   bool // measured in the guest (guest.go)
}

func m(bench, unit string) metric   { return metric{bench, unit} }
func pm(bench, unit string) *metric { return &metric{bench, unit} }

// rows lists the table: issue 7's five measures with the targets it sets.
func rows() []sectionRow {
	var out []sectionRow
	add := func(section string, r row) { out = append(out, sectionRow{section: section, row: r}) }

	const drain = "Drain, pre-filled 4 MiB ring, consumer on one core"
	for _, size := range []int{32, 64, 256} {
		k := fmt.Sprintf("Drain/kconsume/%dB", size)
		r := row{
			what: fmt.Sprintf("kconsume drain + transcode into sub-buffers, %d B", size),
			cmd:  fmt.Sprintf("go test -bench 'Drain/kconsume/%dB' -benchtime 100x ./consumer", size),
			fig:  m(k, "rec/s"), scale: 1e6, label: "M rec/s",
			extra:    []extra{{m(k, "cpu-ns/rec"), "CPU ns/rec"}},
			base:     pm(fmt.Sprintf("Drain/cilium-ReadInto/%dB", size), "rec/s"),
			baseName: "cilium ReadInto",
		}
		if size == 64 {
			r.target = "≥ 100 M rec/s and ≥ 2.5 × ReadInto"
			r.needRatio = true
			r.ok = func(_ results, f, rat stat) bool { return f.med >= 100 && rat.med >= 2.5 }
		}
		add(drain, r)
		if size == 64 {
			for _, v := range [][2]string{
				{"sched_switch", "kconsume drain, a tracepoint's layout (sched_switch's, direct), 64 B"},
				{"transcoded", "kconsume drain, a layout of two runs (a tracepoint with a hole), 64 B"},
				{"global", "kconsume drain, global mode (one ring for all CPUs), 64 B"},
			} {
				k := "Drain/kconsume-" + v[0] + "/64B"
				add(drain, row{
					what: v[1],
					cmd:  "go test -bench 'Drain/kconsume-" + v[0] + "/64B' -benchtime 100x ./consumer",
					fig:  m(k, "rec/s"), scale: 1e6, label: "M rec/s",
					extra:    []extra{{m(k, "cpu-ns/rec"), "CPU ns/rec"}},
					base:     pm("Drain/cilium-ReadInto/64B", "rec/s"),
					baseName: "cilium ReadInto",
				})
			}
		}
		if size == 64 {
			add(drain, row{
				what: "kconsume drain in packet mode (how a recording drains by default): `sys_enter_mmap` events (64 B trace records) that the BPF program wrote as CTF packets, handed to a sink that drops them",
				cmd:  "go test -bench 'DrainPackets/discard' -benchtime 20x ./consumer",
				fig:  m("DrainPackets/discard", "rec/s"), scale: 1e6, label: "M rec/s",
				extra:  []extra{{m("DrainPackets/discard", "cpu-ns/rec"), "CPU ns/rec"}},
				target: "≥ 100 M rec/s (issue 26 item 3)",
				ok:     func(_ results, f, _ stat) bool { return f.med >= 100 },
			})
			add(drain, row{
				what: "the same, the packets written to trace files (page cache); the ratio is to plain write(2)s of the same ring elements in the same round",
				cmd:  "go test -bench 'DrainPackets/file' -benchtime 20x ./consumer",
				fig:  m("DrainPackets/file", "rec/s"), scale: 1e6, label: "M rec/s",
				extra: []extra{{m("DrainPackets/file", "cpu-ns/rec"), "CPU ns/rec"}, {m("DrainPackets/file", "floor-ratio"), "× plain writes' CPU"}},
			})
		}
		for _, rd := range []string{"ReadInto", "Read"} {
			c := fmt.Sprintf("Drain/cilium-%s/%dB", rd, size)
			add(drain, row{
				what: fmt.Sprintf("cilium/ebpf ringbuf.Reader.%s, %d B", rd, size),
				cmd:  fmt.Sprintf("go test -bench 'Drain/cilium-%s/%dB' -benchtime 100x ./consumer", rd, size),
				fig:  m(c, "rec/s"), scale: 1e6, label: "M rec/s",
				extra: []extra{{m(c, "cpu-ns/rec"), "CPU ns/rec"}},
			})
		}
	}
	add(drain, row{
		what: "kconsume drain of a perf ring, 64 B",
		cmd:  "go test -bench 'DrainPerf/kconsume' -benchtime 100x ./consumer",
		fig:  m("DrainPerf/kconsume/64B", "rec/s"), scale: 1e6, label: "M rec/s",
		extra:    []extra{{m("DrainPerf/kconsume/64B", "cpu-ns/rec"), "CPU ns/rec"}},
		base:     pm("DrainPerf/cilium-perf.Reader/64B", "rec/s"),
		baseName: "cilium perf.Reader",
	})
	add(drain, row{
		what: "cilium/ebpf perf.Reader.ReadInto (watermark ¼ ring), 64 B",
		cmd:  "go test -bench 'DrainPerf/cilium' -benchtime 100x ./consumer",
		fig:  m("DrainPerf/cilium-perf.Reader/64B", "rec/s"), scale: 1e6, label: "M rec/s",
		extra: []extra{{m("DrainPerf/cilium-perf.Reader/64B", "cpu-ns/rec"), "CPU ns/rec"}},
	})

	const conc = "Drain, producer at full speed on CPU 1, consumer on CPU 0 (1 s, 8 MiB ring)"
	concRow := func(name, what string, size int, base string) row {
		k := fmt.Sprintf("Concurrent/%s/%dB", name, size)
		r := row{
			what: what, cmd: fmt.Sprintf("go test -bench 'Concurrent/%s/%dB' -benchtime 1000x ./consumer", name, size),
			fig: m(k, "rec/s"), scale: 1e6, label: "M rec/s kept",
			extra: []extra{{m(k, "lost-%"), "% lost"}, {m(k, "consumer-%cpu"), "% of a core"}},
		}
		if strings.HasPrefix(name, "kconsume") {
			// A lossy round with a long overrun lost records while the
			// consumer was not run, not because it drained too slowly.
			r.extra = append(r.extra, extra{m(k, "overrun-ms"), "ms longest drainer overrun"})
		}
		if base != "" {
			r.base = pm(fmt.Sprintf("Concurrent/%s/%dB", base, size), "rec/s")
			r.baseName = base
		}
		return r
	}
	for _, size := range []int{32, 64, 256} {
		r := concRow("kconsume", fmt.Sprintf("kconsume, %d B", size), size, "cilium-ReadInto")
		if size == 64 {
			lost := m(fmt.Sprintf("Concurrent/kconsume/%dB", size), "lost-%")
			cpu := m(fmt.Sprintf("Concurrent/kconsume/%dB", size), "consumer-%cpu")
			r.target, r.losses = "≤ 30 % of a core", []metric{lost}
			r.ok = func(res results, _, _ stat) bool { return summarize(res.get(cpu)).med <= 30 }
		}
		add(conc, r)
		add(conc, concRow("cilium-ReadInto", fmt.Sprintf("cilium ringbuf.Reader.ReadInto, %d B", size), size, ""))
		add(conc, concRow("cilium-Read", fmt.Sprintf("cilium ringbuf.Reader.Read, %d B", size), size, ""))
	}
	add(conc, concRow("kconsume-perf", "kconsume, perf transport (one record per BPF_PROG_TEST_RUN), 64 B", 64, "cilium-perf.Reader"))
	add(conc, concRow("cilium-perf.Reader", "cilium perf.Reader, 64 B", 64, ""))

	const tp = "Tracepoint overhead: getpid loop, syscalls:sys_enter_getpid traced system-wide"
	tpc := "go test -bench TracepointCost -benchtime 2000000x ./consumer"
	add(tp, row{what: "getpid untraced", cmd: tpc, fig: m("TracepointCost", "untraced-ns/call"), label: "ns/call"})
	add(tp, row{
		what: "added by `kconsume record -e syscalls:sys_enter_getpid`", cmd: tpc,
		fig: m("TracepointCost", "kconsume-added-ns"), label: "ns/event",
		extra:   []extra{{m("TracepointCost", "kconsume-lost"), "lost"}},
		ratioOf: pm("TracepointCost", "added-cost-ratio"), baseName: "trace-cmd's added cost",
		target: "≤ 0.85 × trace-cmd's", needRatio: true, losses: []metric{m("TracepointCost", "kconsume-lost")},
		ok: func(_ results, _, rat stat) bool { return rat.med <= 0.85 },
	})
	add(tp, row{what: "added by `trace-cmd record -d --no-filter -e syscalls:sys_enter_getpid`", cmd: tpc,
		fig: m("TracepointCost", "trace-cmd-added-ns"), label: "ns/event", extra: []extra{{m("TracepointCost", "trace-cmd-lost"), "overrun"}}})
	add(tp, row{what: "added by `perf record -a -e syscalls:sys_enter_getpid` (Debian linux-perf)", cmd: tpc,
		fig: m("TracepointCost", "perf-added-ns"), label: "ns/event", extra: []extra{{m("TracepointCost", "perf-lost"), "chunks lost"}}})

	const ev = "Per-event cost: C loops of 200 k calls, pinned (taskset -c 0) and unpinned; ns/call added, median 1000-call chunk (whole loop in brackets)"
	evc := "go test -run '^$' -bench EventCost -benchtime 200000x ./consumer"
	for _, w := range []struct{ name, session, what string }{
		{"getpid", "getpid", "(a) getpid, `-e syscalls:sys_enter_getpid`"},
		{"rename", "rename", "(b) prctl(PR_SET_NAME), `-e task:task_rename` (two comm strings)"},
		{"switch", "switch", "(b) a byte to a child and back through pipes, `-e sched:sched_switch` (two comm strings; 2 switches a round trip pinned, more unpinned)"},
		{"pidfilter", "pidfilter", "(c) getpid, sys_enter_getpid rejected by a pid filter (kconsume `--pid 1`; `common_pid == 1` for the others)"},
		{"untraced", "getpid", "untraced syscall: getppid while sys_enter_getpid is recorded"},
		{"fieldreject", "fieldreject", "(d) lseek(-1, i, 0), `-e syscalls:sys_enter_lseek -f 'fd == 7'`: every event rejected by a field filter (each tool given it)"},
		{"fieldaccept", "fieldaccept", "(d) lseek(-1, i, 0), `-e syscalls:sys_enter_lseek -f 'offset < 100000 && whence == 0'`: every event kept by a field filter"},
		{"fieldreject-rename", "fieldreject-rename", "(d) prctl(PR_SET_NAME), `-e task:task_rename -f 'newcomm == \"nothing\"'`: every event rejected by a string filter"},
		{"stack-kernel", "stack-kernel", "(e) prctl(PR_SET_NAME), `-e task:task_rename --stack kernel` (trace-cmd -T, perf -g --kernel-callchains)"},
		{"stack-user", "stack-user", "(e) getpid, `-e syscalls:sys_enter_getpid --stack user` (trace-cmd -O userstacktrace, perf -g --user-callchains; a static binary without frame pointers)"},
		{"uprobe", "uprobe", "(f) a call of the workload's kc_target, `-e 'uprobe:LOAD:kc_target a=%di:s64'` (trace-cmd and perf: the same probe in uprobe_events)"},
		{"sys8", "sys8", "(h) getpid while 8 syscall events are recorded (sys_enter_getpid, read, write, openat, close, lseek, mmap, futex; kconsume `--syscalls auto`)"},
		{"sys8-untraced", "sys8", "(h) untraced syscall: getppid while those 8 are recorded"},
		{"sysall", "sysall", "(h) getpid while every syscall event but getppid's is recorded"},
		{"sysall-untraced", "sysall", "(h) untraced syscall: getppid while every other syscall event is recorded"},
		{"trigger", "trigger", "(g) lseek(-1, i, 0), `-e syscalls:sys_enter_lseek --syscalls tracepoint -f 'fd != 7' --trigger 'syscalls:sys_enter_lseek fd == 7 : stop'`: a trigger never true (each tool given the filter)"},
	} {
		for _, pin := range []string{"pinned", "unpinned"} {
			k := w.name + "-" + pin
			add(ev, row{what: w.what + ", " + pin + ", untraced ns/call", cmd: evc,
				fig: m("EventCost", k+"-untraced-ns-chunk"), label: "ns/call",
				extra: []extra{{m("EventCost", k+"-untraced-ns"), "ns/call whole loop"}}})
			field := strings.HasPrefix(w.name, "field")
			stack := strings.HasPrefix(w.name, "stack")
			trig := w.name == "trigger"
			for _, tool := range []string{"kconsume", "kconsume-tp", "kconsume-nf", "trace-cmd", "perf", "bpftrace"} {
				if tool == "kconsume-tp" && (strings.Contains(w.name, "rename") || w.name == "switch" || w.name == "stack-kernel" || w.name == "uprobe" || trig) || tool == "kconsume-nf" && !field && !stack && !trig ||
					tool == "bpftrace" && w.name != "uprobe" || tool == "perf" && strings.HasPrefix(w.name, "sys") {
					continue
				}
				name := tool
				switch {
				case tool == "kconsume-tp":
					name = "kconsume --syscalls tracepoint"
				case tool == "kconsume-nf" && stack:
					name = "kconsume without the call chain"
				case tool == "kconsume-nf" && trig:
					name = "kconsume without the trigger"
				case tool == "kconsume-nf":
					name = "kconsume without the filter"
				case tool == "bpftrace":
					name = "bpftrace (`uprobe:LOAD:kc_target { printf(\"%d\\n\", arg0); }` into a file: one line a hit)"
				}
				r := row{what: w.what + ", " + pin + ", " + name, cmd: evc,
					fig: m("EventCost", k+"-"+tool+"-added-ns-chunk"), label: "ns added",
					extra: []extra{{m("EventCost", k+"-"+tool+"-added-ns"), "ns added whole loop"},
						{m("EventCost", w.session+"-"+tool+"-lost"), "lost (session)"}}}
				switch {
				case tool == "kconsume" && (w.name == "untraced" || w.name == "sys8-untraced"):
					r.target = "≤ 10 ns"
					r.ok = func(_ results, f, _ stat) bool { return f.med <= 10 }
				case tool == "kconsume" && strings.HasPrefix(w.name, "sys"):
					// Measured: the path auto takes for the set.
					r.ratioOf, r.baseName = pm("EventCost", k+"-ratio-chunk"), "trace-cmd's added cost"
				case tool == "kconsume" && strings.HasPrefix(w.name, "fieldreject"):
					r.ratioOf, r.baseName = pm("EventCost", k+"-ratio-chunk"), "trace-cmd's added cost (with the filter)"
					r.extra = append(r.extra, extra{m("EventCost", k+"-ratio"), "× trace-cmd's whole loop"})
					r.target, r.needRatio = "≤ 0.5 × trace-cmd's (issue 49 item 6)", true
					r.ok = func(_ results, _, rat stat) bool { return rat.med <= 0.5 }
				case tool == "kconsume" && w.name == "fieldaccept":
					r.ratioOf, r.baseName = pm("EventCost", k+"-vs-unfiltered-chunk"), "kconsume's added cost without the filter"
					r.extra = append(r.extra, extra{m("EventCost", k+"-ratio-chunk"), "× trace-cmd's (with the filter)"},
						extra{m("EventCost", k+"-vs-unfiltered"), "× unfiltered, whole loop"})
					r.target, r.needRatio = "≤ 1.1 × kconsume unfiltered (issue 49 item 6)", true
					r.ok = func(_ results, _, rat stat) bool { return rat.med <= 1.1 }
				case tool == "kconsume" && w.name == "uprobe":
					// Measured, no target (issue 51 item 5 sets none).
					r.ratioOf, r.baseName = pm("EventCost", k+"-ratio-chunk"), "trace-cmd's added cost"
					r.extra = append(r.extra, extra{m("EventCost", k+"-ratio"), "× trace-cmd's whole loop"},
						extra{m("EventCost", k+"-vs-bpftrace-chunk"), "× bpftrace's"})
				case tool == "kconsume" && trig:
					r.ratioOf, r.baseName = pm("EventCost", k+"-vs-notrigger-chunk"), "kconsume's added cost without the trigger"
					r.extra = append(r.extra, extra{m("EventCost", k+"-vs-notrigger"), "× without the trigger, whole loop"},
						extra{m("EventCost", k+"-ratio-chunk"), "× trace-cmd's (with the filter)"})
					r.target, r.needRatio = "within noise of no trigger: ≤ 1.1 × (issue 52 item 5)", true
					r.ok = func(_ results, _, rat stat) bool { return rat.med <= 1.1 }
				case tool == "kconsume" && stack:
					// Measured, no target yet: what a chain costs.
					r.ratioOf, r.baseName = pm("EventCost", k+"-ratio-chunk"), "trace-cmd's added cost (with its call chain)"
					r.extra = append(r.extra, extra{m("EventCost", k+"-ratio"), "× trace-cmd's whole loop"},
						extra{m("EventCost", k+"-vs-nostack-chunk"), "× kconsume without the chain"})
				case tool == "kconsume":
					r.ratioOf, r.baseName = pm("EventCost", k+"-ratio-chunk"), "trace-cmd's added cost"
					r.extra = append(r.extra, extra{m("EventCost", k+"-ratio"), "× trace-cmd's whole loop"})
					r.target, r.needRatio = "≤ 0.85 × trace-cmd's", true
					r.ok = func(_ results, _, rat stat) bool { return rat.med <= 0.85 }
				}
				if r.ok != nil {
					r.losses = []metric{m("EventCost", w.session+"-"+tool+"-lost")}
				}
				add(ev, r)
			}
		}
	}

	for _, g := range guestRows() {
		out = append(out, sectionRow{g.section, g.row, true})
	}

	const fl = "What a BPF recorder's per-event cost is made of: C loops of 200 k calls, ns/call added, median 1000-call chunk, each part alone (bpf/floor.bpf.c)"
	flc := "go test -run '^$' -bench RecorderFloor -benchtime 200000x ./consumer"
	for _, pin := range []string{"pinned", "unpinned"} {
		for _, f := range []struct{ name, what string }{
			{"enter", "entering an empty tp_btf program on sys_enter (every syscall on the raw path)"},
			{"clock", "bpf_ktime_get_ns, over entering"},
			{"ringbuf", "a 32-byte BPF ring buffer record, reserved and submitted, over entering"},
			{"area", "a 32-byte record in per-CPU memory behind an atomic add, over entering"},
			{"trace-cmd-getpid", "trace-cmd's whole cost for sys_enter_getpid"},
			{"rename-btf", "entering an empty tp_btf program on task_rename"},
			{"rename-tp", "entering an empty tracepoint program on task_rename (through perf)"},
			{"trace-cmd-rename", "trace-cmd's whole cost for task_rename"},
		} {
			add(fl, row{what: f.what + ", " + pin, cmd: flc, fig: m("RecorderFloor", f.name+"-ns-"+pin), label: "ns"})
		}
	}

	const off = "Offline: 400 k events, 2 streams"
	for _, c := range []struct{ mode, what, target string }{
		{"report", "`kconsume report` (text) vs `babeltrace2` (text)", "≥ 20 ×"},
		{"text", "relayfmt reader decode + merge vs `babeltrace2` (text)", "≥ 20 ×"},
		{"decode", "relayfmt reader decode + merge vs `babeltrace2 -c sink.utils.dummy`", ""},
	} {
		k := "VsBabeltrace2/" + c.mode
		r := row{what: c.what, cmd: fmt.Sprintf("go test -bench 'VsBabeltrace2/%s' -benchtime 1x ./relayfmt", c.mode),
			fig: m(k, "ours-Mev/s"), label: "M events/s", extra: []extra{{m(k, "bt2-Mev/s"), "M events/s babeltrace2"}},
			ratioOf: pm(k, "x-bt2"), baseName: "babeltrace2", target: c.target}
		if c.target != "" {
			r.needRatio = true
			r.ok = func(_ results, _, rat stat) bool { return rat.med >= 20 }
		}
		add(off, r)
	}
	for _, n := range []int{2, 8} {
		k := fmt.Sprintf("ReadMerge/%dstreams", n)
		add(off, row{what: fmt.Sprintf("relayfmt decode + merge alone, %d streams, every field", n),
			cmd: fmt.Sprintf("go test -bench 'ReadMerge/%dstreams' ./relayfmt", n), fig: m(k, "Mev/s"), label: "M events/s"})
	}

	const wr = "Writer: relayfmt channel, one core"
	for _, c := range []struct{ name, what, target string }{
		{"flight/64B", "into memory, 64 B (overwrite, ring in L2)", "≥ 100 M rec/s"},
		{"flight/256B", "into memory, 256 B", ""},
		{"stream/64B", "through a sink goroutine, 64 B (16 × 1 MiB)", ""},
		{"disk/64B", "through DirSink to disk, 64 B, writer at full speed", ""},
	} {
		k := "Write/" + c.name
		r := row{what: c.what, cmd: fmt.Sprintf("go test -bench 'Write/%s' ./relayfmt", c.name), fig: m(k, "Mrec/s"), label: "M rec/s",
			extra: []extra{{m(k, "GB/s"), "GB/s"}, {m(k, "dropped/op"), "dropped/record"}}, target: c.target}
		if c.target != "" {
			r.ok = func(_ results, f, _ stat) bool { return f.med >= 100 }
			r.losses = []metric{m(k, "dropped/op")}
		}
		add(wr, r)
	}

	const ss = "Start and stop: `kconsume record -e EVENTS --duration 1s`, wall time over the 1 s"
	add(ss, row{what: "`-e 'syscalls:*'` (some 700 events)", cmd: "go test -bench 'StartStop/syscalls' -benchtime 1x ./cmd/kconsume",
		fig: m("StartStop/syscalls", "over-s"), label: "s", base: pm("StartStop/sched_switch", "over-s"), baseName: "sched_switch's",
		target: "≤ 0.5 s", ok: func(_ results, f, _ stat) bool { return f.med <= 0.5 }})
	add(ss, row{what: "`-e sched:sched_switch`", cmd: "go test -bench 'StartStop/sched_switch' -benchtime 1x ./cmd/kconsume",
		fig: m("StartStop/sched_switch", "over-s"), label: "s"})

	const idle = "Footprint: an idle machine, `-e sched:sched_switch` for 5 s, kconsume and trace-cmd in turn"
	ic := "go test -bench Idle -benchtime 1x ./cmd/kconsume"
	add(idle, row{what: "kconsume's own context switches in its trace", cmd: ic,
		fig: m("Idle", "kconsume-own/s"), label: "per s", base: pm("Idle", "trace-cmd-own/s"), baseName: "trace-cmd's",
		extra:  []extra{{m("Idle", "kconsume-cs/s"), "own switches/s (rusage)"}, {m("Idle", "kconsume-events/s"), "events/s"}},
		target: "≤ trace-cmd's", ok: func(res results, f, _ stat) bool {
			return f.med <= summarize(res.get(m("Idle", "trace-cmd-own/s"))).med
		}})
	add(idle, row{what: "trace-cmd's own context switches in its trace", cmd: ic,
		fig: m("Idle", "trace-cmd-own/s"), label: "per s",
		extra: []extra{{m("Idle", "trace-cmd-cs/s"), "own switches/s (rusage)"}, {m("Idle", "trace-cmd-events/s"), "events/s"}}})

	const sat = "Saturation: hackbench (`perf bench sched messaging -g 4 -l 300`) recording `sched:*`, sys_enter_write and sys_enter_read, the same buffer memory per CPU for both tracers; slowdown against the untraced run of the round"
	for _, budget := range []struct{ name, what string }{
		{"6M", "6 MiB per CPU (kconsume's defaults; trace-cmd `-b 6144`)"},
		{"1408K", "1408 KiB per CPU (`--memory 1408K`; trace-cmd's default)"},
	} {
		k := "Saturation/" + budget.name
		sc := fmt.Sprintf("go test -run '^$' -bench 'Saturation/%s' -benchtime 1x ./cmd/kconsume", budget.name)
		kcSlow, kcLost := m(k, "kconsume-slowdown-%"), m(k, "kconsume-lost-%")
		tcSlow, tcLost := m(k, "trace-cmd-slowdown-%"), m(k, "trace-cmd-lost-%")
		kcMinus := m(k, "kconsume-minus-trace-cmd-%")
		add(sat, row{what: "hackbench untraced, " + budget.what, cmd: sc, fig: m(k, "untraced-s"), label: "s",
			extra: []extra{{m(k, "untraced-cpu-s"), "CPU s"}}})
		add(sat, row{what: "`kconsume record`, " + budget.what, cmd: sc, fig: kcSlow, label: "% slower",
			extra: []extra{{kcLost, "% of events lost"}, {m(k, "kconsume-cpu-%"), "% more CPU time"}, {m(k, "kconsume-ring-lost-%"), "% lost ring full"},
				{m(k, "kconsume-subbuf-lost-%"), "% lost sub-buffers full"}, {m(k, "kconsume-missed-%"), "% missed (another BPF program ran)"}, {m(k, "kconsume-late-ms"), "ms drainer late"},
				{m(k, "kconsume-events"), "events recorded"}, {m(k, "kconsume-own-switches"), "own switches in the trace"}, {m(k, "kconsume-own-cpu-ms"), "ms of kconsume's own CPU while recording (its summary)"},
				{kcMinus, "points of slowdown more than trace-cmd's in the same round"}, {m(k, "kconsume-rounds-faster"), "rounds faster than trace-cmd"},
				{m(k, "kconsume-minus-trace-cmd-lo-%"), "points, low end of that median's interval"}, {m(k, "kconsume-minus-trace-cmd-hi-%"), "points, high end"},
				{m(k, "paired-confidence-%"), "% confidence of the interval (the rounds of one run)"}},
			target: "slowdown (paired by round) and lost share (lost and missed) ≤ trace-cmd's",
			ok: func(res results, _, _ stat) bool {
				// The runs the kernel skipped are lost events too.
				lost := summarize(res.get(kcLost)).med + summarize(res.get(m(k, "kconsume-missed-%"))).med
				return summarize(res.get(kcMinus)).med <= 0 && lost <= summarize(res.get(tcLost)).med
			}})
		add(sat, row{what: "`trace-cmd record -d --no-filter -b KB`, " + budget.what, cmd: sc, fig: tcSlow, label: "% slower",
			extra: []extra{{tcLost, "% of events lost (overrun)"}, {m(k, "trace-cmd-cpu-%"), "% more CPU time"}, {m(k, "trace-cmd-events"), "events recorded"}, {m(k, "trace-cmd-own-switches"), "own switches in the trace"}}})
	}

	const satr = "Streaming a recording: the hackbench of Saturation at 6 MiB per CPU, recorded by kconsume into local files and streamed by it to a real lttng-relayd on loopback (which writes on the same CPUs), in turn; slowdown against the untraced run of the round"
	src := "go test -run '^$' -bench 'SaturationRelayd' -benchtime 1x ./cmd/kconsume"
	rk := "SaturationRelayd/6M"
	localLost := m(rk, "kconsume-lost-%")
	for _, v := range []struct{ tool, what string }{
		{"kconsume-relayd", "`kconsume record --relayd net://127.0.0.1 …` (no local copy), relayd at its default priority"},
		{"kconsume-relayd-nice", "the same, relayd's threads at kconsume's own priority (`nice -n -20`) for the run"},
	} {
		t := v.tool
		add(satr, row{what: v.what, cmd: src, fig: m(rk, t+"-slowdown-%"), label: "% slower",
			extra: []extra{{m(rk, t+"-lost-%"), "% of events lost"}, {m(rk, t+"-ring-lost-%"), "% lost ring full"},
				{m(rk, t+"-subbuf-lost-%"), "% lost sub-buffers full"}, {m(rk, t+"-late-ms"), "ms drainer late"},
				{m(rk, t+"-own-cpu-ms"), "ms of kconsume's own CPU (its summary)"}, {m(rk, t+"-own-switches"), "own switches in the trace"},
				{m(rk, t+"-minus-kconsume-%"), "points of slowdown more than into local files in the same round"},
				{m(rk, t+"-missing"), "events recorded but not in relayd's files (read back)"}},
			target: "lost share ≤ the local files', every recorded event in relayd's files",
			losses: []metric{m(rk, t+"-missing")},
			ok: func(res results, _, _ stat) bool {
				return summarize(res.get(m(rk, t+"-lost-%"))).med <= summarize(res.get(localLost)).med
			}})
	}
	add(satr, row{what: "`kconsume record -o DIR …` (local files)", cmd: src, fig: m(rk, "kconsume-slowdown-%"), label: "% slower",
		extra: []extra{{localLost, "% of events lost"}, {m(rk, "kconsume-own-cpu-ms"), "ms of kconsume's own CPU (its summary)"}, {m(rk, "kconsume-own-switches"), "own switches in the trace"}}})

	const mem = "Memory: `kconsume record` peak RSS, 3 s of getpid flood on every CPU, overwrite mode"
	for _, c := range []string{"256Kx8", "1Mx16", "4Mx16"} {
		k := "PeakRSS/" + c
		add(mem, row{what: "sub-buffers " + c + " per CPU", cmd: fmt.Sprintf("go test -bench 'PeakRSS/%s' -benchtime 1x ./cmd/kconsume", c),
			fig: m(k, "peak-MiB"), label: "MiB peak", extra: []extra{{m(k, "buffers-MiB"), "MiB configured"}, {m(k, "excess-MiB"), "MiB over"}},
			target: "≤ buffers + 32 MiB", ok: func(res results, _, _ stat) bool { return summarize(res.get(m(k, "excess-MiB"))).max <= 32 }})
	}
	const net = "Streaming: relayfmt channel, 64 B records, 16 × 1 MiB sub-buffers, packets to a local directory (DirSink) or a real lttng-relayd on loopback (which writes them to disk)"
	paced := pm("StreamPaced/relayd", "delivered-%")
	add(net, row{what: "to relayd, 4 M records/s offered (`KCONSUME_STREAM_RATE`): the share in relayd's files, read back", cmd: "go test -run '^$' -bench 'StreamPaced' -benchtime 4000000x ./relayd",
		fig: *paced, label: "% delivered", extra: []extra{{m("StreamPaced/relayd", "dropped-%"), "% dropped"}, {m("StreamPaced/relayd", "offered-Mrec/s"), "M rec/s offered"}},
		base: pm("StreamPaced/disk", "delivered-%"), baseName: "the local directory's share",
		target: "≥ 0.99 × the local directory's share", needRatio: true,
		ok: func(_ results, _, rat stat) bool { return rat.med >= 0.99 }})
	add(net, row{what: "to the local directory, the same", cmd: "go test -run '^$' -bench 'StreamPaced/disk' -benchtime 4000000x ./relayd",
		fig: m("StreamPaced/disk", "delivered-%"), label: "% delivered", extra: []extra{{m("StreamPaced/disk", "dropped-%"), "% dropped"}}})
	add(net, row{what: "to relayd, the highest rate with every one of 1.5 M records in its files", cmd: "go test -run '^$' -bench 'StreamLossless' -benchtime 1x ./relayd",
		fig: m("StreamLossless/relayd", "lossless-Mrec/s"), label: "M rec/s",
		base: pm("StreamLossless/disk", "lossless-Mrec/s"), baseName: "the local directory's",
		target: "streaming keeps up: ≥ 0.8 × the local directory's, and the paced share above met", needRatio: true,
		ok: func(res results, _, rat stat) bool {
			return rat.med >= 0.8 && summarize(res.ratio(*paced, m("StreamPaced/disk", "delivered-%"))).med >= 0.99
		}})
	add(net, row{what: "to the local directory, the same", cmd: "go test -run '^$' -bench 'StreamLossless/disk' -benchtime 1x ./relayd",
		fig: m("StreamLossless/disk", "lossless-Mrec/s"), label: "M rec/s"})
	for _, c := range []struct{ name, what string }{
		{"relayd/64B", "to relayd, the writer at full speed: the records accepted, and the share dropped while every sub-buffer waited"},
		{"disk/64B", "to the local directory, the same"},
	} {
		k := "Stream/" + c.name
		add(net, row{what: c.what, cmd: fmt.Sprintf("go test -run '^$' -bench 'Stream/%s' -benchtime 4000000x ./relayd", c.name), fig: m(k, "Mrec/s"), label: "M rec/s",
			extra: []extra{{m(k, "GB/s"), "GB/s"}, {m(k, "dropped/op"), "dropped/record"}}})
	}

	const sd = "Statedump (--profile lttng): the system plus 1,000 sleeping processes"
	add(sd, row{what: "statedump through a session's injector", cmd: "go test -bench 'Statedump1000/session' -benchtime 3x ./statedump",
		fig: m("Statedump1000/session", "s/dump"), label: "s", extra: []extra{{m("Statedump1000/session", "cpu-s/dump"), "CPU s"}, {m("Statedump1000/session", "events"), "events"}, {m("Statedump1000/session", "lost"), "lost"}},
		target: "< 1 s", ok: func(_ results, f, _ stat) bool { return f.med < 1 }, losses: []metric{m("Statedump1000/session", "lost")}})
	add(sd, row{what: "the same, into a collector that decodes (reading /proc alone)", cmd: "go test -bench 'Statedump1000/read' -benchtime 3x ./statedump",
		fig: m("Statedump1000/read", "s/dump"), label: "s", extra: []extra{{m("Statedump1000/read", "cpu-s/dump"), "CPU s"}}})
	return out
}
