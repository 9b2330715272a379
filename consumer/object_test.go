package consumer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/synth"
)

// exampleSpec returns bpf/example/getpid.bpf.c built for tr, tracing the
// process tgid (a process id: the child's traced thread need not be its
// main thread).
// Before Linux 5.13 (no bpf_snprintf) it drops the klog program.
func exampleSpec(t *testing.T, tr Transport, tgid int) *ebpf.CollectionSpec {
	t.Helper()
	load := gen.LoadExample
	if tr == Perf {
		load = gen.LoadExamplePerf
	}
	spec, err := load()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables[gen.ExampleVarTargetTgid].Set(uint32(tgid)); err != nil {
		t.Fatal(err)
	}
	if !kernelAtLeast(t, 5, 13) {
		delete(spec.Programs, gen.ExampleProgGetpidKlog)
	}
	return spec
}

// TestObjectSynth: a user's program built on kc_synth.h writes one event
// all at once and one field by field per getpid, and a klog line; every
// value arrives, next to its getpid and in one order throughout, for our
// reader and babeltrace2.
func TestObjectSynth(t *testing.T) {
	const n = 300
	klog := kernelAtLeast(t, 5, 13)
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			c := startChild(t, "getpid", n, "KC_CHILD_CPU=0")
			// The user's program runs on the sys_enter_getpid tracepoint;
			// the function path would stamp the event later, at the
			// syscall function's entry.
			sys := SyscallsAuto
			if tr == Ringbuf && rawSysExpected(t) {
				sys = SyscallsRaw
			}
			s, dir := newTestSession(t, Config{
				Events:    []string{"syscalls:sys_enter_getpid"},
				PIDs:      []int{c.tid},
				Transport: tr,
				Syscalls:  sys,
				Objects:   []*ebpf.CollectionSpec{exampleSpec(t, tr, c.cmd.Process.Pid)},
			})
			if s.Synth("getpid_whole") == nil || s.Synth("getpid_piece") == nil || s.Synth(synth.Klog) == nil {
				t.Fatalf("session synthetic events: %v", s.SynthEvents())
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			// Each getpid_whole sits next to its getpid call. Which of the
			// two comes first is the kernel's probe order on sys_enter
			// (tracepoint_add_func appends a probe after those of its
			// priority): ours on the raw path follows perf's syscall probe
			// when another perf syscall event, in any process, registered
			// that probe first. The order cannot change within a session,
			// since the user's program holds perf's probe.
			var calls, wholes, pieces, klogs int
			var lead int
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					t.Fatalf("unexpected notice %+v", it)
				}
				switch it.Class.Name {
				case "syscalls:sys_enter_getpid":
					calls++
					return
				case "synthetic:getpid_whole":
					wholes++
					tag := field(vals, "tag")
					if field(vals, "pid").Int(0) != int64(c.tid) || field(vals, "n").Uint(0) != uint64(wholes) ||
						string(field(vals, "comm").Text()) != childComm ||
						tag.Len() != 3 || tag.Uint(0) != uint64(wholes) || tag.Uint(1) != 7 || tag.Uint(2) != 0xffff {
						t.Fatalf("getpid_whole %d: %v", wholes, vals)
					}
					if wholes == 1 {
						lead = wholes - calls
						if lead != 0 && (lead != 1 || sys != SyscallsRaw) {
							t.Fatalf("getpid_whole 1 after %d getpid calls", calls)
						}
					}
					if wholes != calls+lead {
						t.Fatalf("getpid_whole %d after %d getpid calls (the first came %d ahead)", wholes, calls, lead)
					}
				case "synthetic:getpid_piece":
					pieces++
					if field(vals, "pid").Int(0) != int64(c.tid) || field(vals, "n").Uint(0) != uint64(pieces) ||
						string(field(vals, "comm").Text()) != childComm || field(vals, "neg").Int(0) != -int64(pieces) {
						t.Fatalf("getpid_piece %d: %v", pieces, vals)
					}
				case "synthetic:klog":
					klogs++
					if want := fmt.Sprintf("getpid by %s[%d]", childComm, c.tid); string(field(vals, "msg").Text()) != want {
						t.Fatalf("klog %q, want %q", field(vals, "msg").Text(), want)
					}
				default:
					t.Fatalf("unexpected event %s", it.Class.Name)
				}
			})
			wantKlog := 0
			if klog {
				wantKlog = n
			}
			if calls != n || wholes != n || pieces != n || klogs != wantKlog {
				t.Fatalf("getpid %d, whole %d, piece %d, klog %d; want %d each (klog %d)", calls, wholes, pieces, klogs, n, wantKlog)
			}
			st, _ := s.Stats()
			for _, cs := range st {
				if cs.Discarded() != 0 {
					t.Fatalf("CPU %d discarded %d: %+v", cs.CPU, cs.Discarded(), cs)
				}
			}
			lines, _ := testenv.RunBT2(t, dir)
			got := map[string]int{}
			var last string
			for _, l := range lines {
				for _, name := range []string{"getpid_whole", "getpid_piece", "klog"} {
					if strings.Contains(l, "synthetic:"+name+":") {
						got[name]++
						if name == "getpid_whole" {
							last = l
						}
					}
				}
			}
			if got["getpid_whole"] != n || got["getpid_piece"] != n || got["klog"] != wantKlog {
				t.Fatalf("babeltrace2 counts %v", got)
			}
			want := fmt.Sprintf(`pid = %d, n = %d, comm = "%s", tag = [ [0] = %d, [1] = 7, [2] = 65535 ]`, c.tid, n, childComm, n)
			if !strings.Contains(last, want) {
				t.Fatalf("babeltrace2's last getpid_whole:\n%s\nwant %s", last, want)
			}
		})
	}
}

// TestObjectErrors: objects kconsume cannot record are refused whole, and
// say why.
func TestObjectErrors(t *testing.T) {
	testenv.RequireRoot(t)
	tr := Ringbuf
	if _, err := chooseTransport(Ringbuf); err != nil {
		tr = Perf
	}
	other := Perf
	if tr == Perf {
		other = Ringbuf
	}
	otherSpec, err := gen.LoadExamplePerf()
	if other == Ringbuf {
		otherSpec, err = gen.LoadExample()
	}
	if err != nil {
		t.Fatal(err)
	}
	notOurs, err := gen.LoadBench()
	if err != nil {
		t.Fatal(err)
	}
	badSection := exampleSpec(t, tr, 1)
	badSection.Programs[gen.ExampleProgGetpidEvents].SectionName = "xdp"
	badDef := exampleSpec(t, tr, 1)
	if err := badDef.Variables[gen.ExampleVarKcDefGetpidPiece].Set(append([]byte("getpid_piece u7 x"), make([]byte, int(badDef.Variables[gen.ExampleVarKcDefGetpidPiece].Size())-17)...)); err != nil {
		t.Fatal(err)
	}
	clash, _ := synth.Parse("getpid_whole u8 x")
	for _, tc := range []struct {
		name  string
		spec  *ebpf.CollectionSpec
		synth []*synth.Event
		want  string
	}{
		{"other transport", otherSpec, nil, "transport"},
		{"not kc_synth.h", notOurs, nil, "not built on kc_synth.h"},
		{"section", badSection, nil, `section "xdp"`},
		{"definition", badDef, nil, "unknown type"},
		{"clash", exampleSpec(t, tr, 1), []*synth.Event{clash}, "is defined as"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Dir: t.TempDir(), Transport: tr, Synth: tc.synth, Objects: []*ebpf.CollectionSpec{tc.spec}})
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrConfig saying %q", err, tc.want)
			}
		})
	}
}
