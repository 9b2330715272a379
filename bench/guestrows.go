package main

// guestRows lists the rows of the families measured in the guest
// (guestFamilies): probe hits on a kernel function (issue 51 item 5) and
// what a preemptible kernel does to two busy tasks a CPU (issue 57 item
// 4). Under TCG their ns are emulated time: only the ratios between
// tools of the same rounds mean anything.
func guestRows() []sectionRow {
	var out []sectionRow
	add := func(section string, r row) { out = append(out, sectionRow{section: section, row: r}) }
	ec := "EventCost" + guestSuffix
	// The same benchmark alone, in a guest of its own, with the
	// kconsume of make build (one built in the guest would take long).
	const vm = "-exec 'go run ./vmtest/cmd/vmtest run -kernel newest'"
	evc := "make build; KCONSUME_BIN=$PWD/bin/kconsume KCONSUME_BENCH_SESSIONS=kprobe,fentry,rawperf,funckprobe go test " + vm + " -run '^$' -bench EventCost -benchtime 200000x ./consumer"

	const pr = "Probe hits: C getpid loops of 200 k calls, each call one hit of a probe on `__task_pid_nr_ns` with its `type` argument, pinned (taskset -c 0) and unpinned; ns/call added, median 1000-call chunk (whole loop in brackets)"
	for _, kind := range []struct{ name, kc, bt, arg string }{
		{"kprobe", "`-e 'kprobe:__task_pid_nr_ns type=%si:s32'`", "kprobe:__task_pid_nr_ns", "arg1"},
		{"fentry", "`-e 'fentry:__task_pid_nr_ns type'`", "kfunc:__task_pid_nr_ns", "args->type"},
	} {
		for _, pin := range []string{"pinned", "unpinned"} {
			k := kind.name + "-" + pin
			if kind.name == "kprobe" {
				add(pr, row{what: "getpid untraced, " + pin, cmd: evc, fig: m(ec, k+"-untraced-ns-chunk"), label: "ns/call",
					extra: []extra{{m(ec, k+"-untraced-ns"), "ns/call whole loop"}}})
			}
			for _, tool := range []string{"kconsume", "trace-cmd", "perf", "bpftrace", "bpftrace-count"} {
				var what string
				switch tool {
				case "kconsume":
					what = "kconsume " + kind.kc
				case "trace-cmd":
					what = "trace-cmd recording `p:kprobes/kc_bench __task_pid_nr_ns type=%si:s32` of kprobe_events"
				case "perf":
					if kind.name == "fentry" {
						continue
					}
					what = "perf record -a, the same kprobe_events probe"
				case "bpftrace":
					what = "bpftrace `" + kind.bt + " { printf(\"%d\\n\", " + kind.arg + "); }` into a file, one line a hit (lost: its \"Lost N events\")"
				case "bpftrace-count":
					what = "bpftrace `" + kind.bt + " { @n = count(); }` (a count in a map, nothing recorded)"
				}
				r := row{what: kind.name + ", " + pin + ": " + what, cmd: evc,
					fig: m(ec, k+"-"+tool+"-added-ns-chunk"), label: "ns added",
					extra: []extra{{m(ec, k+"-"+tool+"-added-ns"), "ns added whole loop"}, {m(ec, kind.name+"-"+tool+"-lost"), "lost (session)"}}}
				if tool == "kconsume" {
					// Measured, no target (issue 51 item 5 sets none).
					r.ratioOf, r.baseName = pm(ec, k+"-ratio-chunk"), "trace-cmd's added cost (kprobe_events)"
					r.extra = append(r.extra, extra{m(ec, k+"-ratio"), "× trace-cmd's whole loop"}, extra{m(ec, k+"-vs-bpftrace-chunk"), "× bpftrace printf's"},
						extra{m(ec, k+"-vs-bpftrace-count-chunk"), "× bpftrace count's"})
				}
				if tool == "bpftrace-count" {
					r.extra = r.extra[:1]
				}
				add(pr, r)
			}
		}
	}

	pk := "PreemptKept" + guestSuffix
	pkc := "make build; KCONSUME_BIN=$PWD/bin/kconsume go test " + vm + " -run '^$' -bench PreemptKept -benchtime 20000x ./consumer"
	const kp = "Two busy tasks a CPU on a preemptible kernel (issue 57): 4 tasks pinned two a CPU, 20 k getpid calls each, syscalls:sys_enter_getpid recorded beside an ftrace instance; events kept, % of those made"
	kept := func(tool string) metric { return m(pk, tool+"-kept-%") }
	add(kp, row{what: "`kconsume record --pid …` (the function path on kprobes, auto's choice for one event)", cmd: pkc,
		fig: kept("kconsume"), label: "% kept",
		extra: []extra{{m(pk, "kconsume-lost"), "discarded (all rounds)"}, {m(pk, "kconsume-skipped"), "runs the kernel skipped (all rounds)"}, {m(pk, "produced"), "events made a round"}},
		base:  pmp(kept("ftrace")), baseName: "ftrace's share",
		target: "every event ftrace keeps, in every round (issue 57 item 1)", needRatio: true,
		losses: []metric{m(pk, "kconsume-lost"), m(pk, "kconsume-skipped")},
		ok: func(res results, f, _ stat) bool {
			return f.min >= summarize(res.get(kept("ftrace"))).max
		}})
	add(kp, row{what: "the same binary with `KCONSUME_RAW_FROM_PERF=0` (the function path on fentry trampolines: without the fix)", cmd: pkc,
		fig: kept("kconsume-btf"), label: "% kept", base: pmp(kept("ftrace")), baseName: "ftrace's share"})
	add(kp, row{what: "bpftrace `tracepoint:syscalls:sys_enter_getpid /tid == …/ { @n = count(); }` (it reports no loss)", cmd: pkc,
		fig: kept("bpftrace"), label: "% kept", base: pmp(kept("ftrace")), baseName: "ftrace's share"})
	add(kp, row{what: "the ftrace instance beside each of them", cmd: pkc, fig: kept("ftrace"), label: "% kept"})

	const fc = "What the fixes cost (issue 57 item 4): C getpid loops of 200 k calls, `-e syscalls:sys_enter_getpid`, ns/call added, median 1000-call chunk"
	for _, fix := range []struct{ name, with, without string }{
		{"rawperf", "`--syscalls raw` from the perf tracepoints", "`--syscalls raw` on tp_btf"},
		{"funckprobe", "`--syscalls fentry` on kprobes", "`--syscalls fentry` on trampolines"},
	} {
		for _, pin := range []string{"pinned", "unpinned"} {
			k := fix.name + "-" + pin
			if fix.name == "rawperf" {
				add(fc, row{what: "getpid untraced, " + pin, cmd: evc, fig: m(ec, k+"-untraced-ns-chunk"), label: "ns/call"})
			}
			add(fc, row{what: "kconsume, " + fix.with + " (the fix), " + pin, cmd: evc,
				fig: m(ec, k+"-kconsume-added-ns-chunk"), label: "ns added",
				extra: []extra{{m(ec, k+"-kconsume-added-ns"), "ns added whole loop"}, {m(ec, fix.name+"-kconsume-lost"), "lost (session)"},
					{m(ec, k+"-vs-btf"), "× without the fix, whole loop"}, {m(ec, k+"-ratio-chunk"), "× trace-cmd's"}},
				ratioOf: pm(ec, k+"-vs-btf-chunk"), baseName: "the same binary without the fix (`KCONSUME_RAW_FROM_PERF=0`)",
				target: "≤ 1.10 × without the fix (issue 57 item 4)", needRatio: true,
				losses: []metric{m(ec, fix.name+"-kconsume-lost")},
				ok:     func(_ results, _, rat stat) bool { return rat.med <= 1.10 }})
			add(fc, row{what: "kconsume with `KCONSUME_RAW_FROM_PERF=0` (" + fix.without + "), " + pin, cmd: evc,
				fig: m(ec, k+"-kconsume-btf-added-ns-chunk"), label: "ns added",
				extra: []extra{{m(ec, k+"-kconsume-btf-added-ns"), "ns added whole loop"}, {m(ec, fix.name+"-kconsume-btf-lost"), "lost (session)"}}})
			add(fc, row{what: "trace-cmd, " + pin, cmd: evc, fig: m(ec, k+"-trace-cmd-added-ns-chunk"), label: "ns added",
				extra: []extra{{m(ec, k+"-trace-cmd-added-ns"), "ns added whole loop"}, {m(ec, fix.name+"-trace-cmd-lost"), "overrun (session)"}}})
		}
	}
	return out
}

func pmp(m metric) *metric { return &m }
