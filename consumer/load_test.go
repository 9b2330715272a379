package consumer

import (
	"errors"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/cilium/ebpf"

	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/relayfmt"
)

// errRefused is the kernel's refusal as refuseWhile makes it.
var errRefused = errors.New("refused by the test")

// refuseWhile makes the recorder's loads fail while the spec's variable
// name is 1, as a kernel that cannot run a path refuses the whole object.
func refuseWhile(t *testing.T, name string) {
	t.Helper()
	orig := recorder.Testing.NewCollection
	t.Cleanup(func() { recorder.Testing.NewCollection = orig })
	recorder.Testing.NewCollection = func(spec *ebpf.CollectionSpec) (*ebpf.Collection, error) {
		var v uint32
		if vs := spec.Variables[name]; name == "" || vs != nil && vs.Get(&v) == nil && v == 1 {
			return nil, errRefused
		}
		return orig(spec)
	}
}

// TestLoadFallbacks: where the kernel refuses the recorder, the load
// drops the newest optional path still there, says why in the plan, and
// records with the rest: every getpid of a child still reaches the trace.
// Where nothing is left to drop, New fails with the kernel's error.
func TestLoadFallbacks(t *testing.T) {
	for _, tt := range []struct {
		name, refuse     string
		pktWhy, ringsWhy string // what Packets and OwnRings say
	}{
		{"packet mode refused", gen.RingbufVarKcPktOn, "loading: " + errRefused.Error(), ""},
		{"own rings refused", gen.RingbufVarKcAreaOn, "no kc_area rings: loading: " + errRefused.Error(), "loading: " + errRefused.Error()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The path must be on where nothing refuses it.
			probe, _ := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}})
			if err := probe.Packets(); err != nil {
				t.Skipf("this kernel's recorder takes no packet mode to drop: %v", err)
			}
			_ = probe.Close()
			refuseWhile(t, tt.refuse)
			const n = 2000
			c := startChild(t, "getpid", n)
			s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: []int{c.tid}})
			if err := s.Packets(); err == nil || err.Error() != tt.pktWhy {
				t.Errorf("Packets() = %v, want %q", err, tt.pktWhy)
			}
			if err := s.OwnRings(); (err == nil) != (tt.ringsWhy == "") || err != nil && err.Error() != tt.ringsWhy {
				t.Errorf("OwnRings() = %v, want %q", err, tt.ringsWhy)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			got := 0
			walkTrace(t, dir, func(it *relayfmt.Item, _ []relayfmt.Value) {
				if it.Kind == relayfmt.EventItem {
					got++
				}
			})
			if got != n {
				t.Errorf("the trace holds %d events, want %d", got, n)
			}
		})
	}
	t.Run("everything refused", func(t *testing.T) {
		refuseWhile(t, "")
		_, err := New(Config{Events: []string{"syscalls:sys_enter_getpid"}, Dir: t.TempDir()})
		if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "loading the BPF recorder") {
			t.Fatalf("New: %v, want the load's refusal", err)
		}
	})
}
