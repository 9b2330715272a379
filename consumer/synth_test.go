package consumer

import (
	"errors"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/synth"
)

// TestSynthInject: markers emitted from user space around a child's
// getpid calls land in the trace in time order among the kernel's
// events, with their fields, for our reader and babeltrace2.
func TestSynthInject(t *testing.T) {
	const n = 500
	mark, err := synth.Parse("mark char msg[]; u32 phase; u16 vals[2]")
	if err != nil {
		t.Fatal(err)
	}
	other, err := synth.Parse("unused u8 x")
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			c := startChild(t, "getpid", n, "KC_CHILD_CPU=0")
			s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid", "synthetic:ma*"}, Synth: []*synth.Event{mark, other}, PIDs: []int{c.tid}, Transport: tr})
			if s.Synth("mark") == nil || s.Synth("unused") != nil {
				t.Fatalf("session synthetic events: %v", s.SynthEvents())
			}
			emit := func(msg string, phase int) {
				t.Helper()
				b := mark.Start()
				b.Next(msg)
				b.Next(phase)
				b.Next([]int{phase, phase * 10})
				p, err := b.End(nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.EmitSynth(0, "mark", p); err != nil {
					t.Fatal(err)
				}
			}
			p, _ := mark.Encode(nil, "stopped", 0, []int{0, 0})
			if err := s.EmitSynth(0, "mark", p); !errors.Is(err, ErrStopped) {
				t.Fatalf("emit before Start: %v, want ErrStopped", err)
			}
			if err := s.EmitSynth(0, "unused", []byte{1}); !errors.Is(err, ErrUnknownEvent) {
				t.Fatalf("emit of an event not recorded: %v", err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			emit("phase 1 starts", 1)
			c.run(t)
			emit("phase 2 starts", 2)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			var seq []string
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					t.Fatalf("unexpected notice %+v", it)
				}
				if it.Class.Name == "synthetic:mark" {
					seq = append(seq, string(field(vals, "msg").Text()))
					return
				}
				if len(seq) == 0 || seq[len(seq)-1] != "getpid" {
					seq = append(seq, "getpid")
				}
			})
			if got := strings.Join(seq, "|"); got != "phase 1 starts|getpid|phase 2 starts" {
				t.Fatalf("trace order %q", got)
			}
			counts, _ := countEvents(t, dir)
			if counts["syscalls:sys_enter_getpid"] != n {
				t.Fatalf("counts %v", counts)
			}
			lines, _ := testenv.RunBT2(t, dir)
			var marks []string
			for _, l := range lines {
				if strings.Contains(l, "synthetic:mark:") {
					marks = append(marks, l)
				}
			}
			if len(marks) != 2 || !strings.Contains(marks[1], `msg = "phase 2 starts", phase = 2, vals = [ [0] = 2, [1] = 20 ]`) {
				t.Fatalf("babeltrace2 marks:\n%s", strings.Join(marks, "\n"))
			}
		})
	}
}

func TestSynthConfigErrors(t *testing.T) {
	testenv.RequireRoot(t)
	mark, _ := synth.Parse("mark u8 x")
	for _, pat := range []string{"synthetic:nosuch", "synthetic:[", "synthetic:"} {
		_, err := New(Config{Dir: t.TempDir(), Events: []string{pat}, Synth: []*synth.Event{mark}})
		if !errors.Is(err, ErrUnknownEvent) && !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", pat, err)
		}
	}
}
