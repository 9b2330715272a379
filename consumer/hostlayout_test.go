package consumer

import (
	"os"
	"testing"

	"github.com/kconsume/kconsume/consumer/layout"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestHostLayouts builds the layout and the relayfmt class of every trace
// event of the running kernel: any of them can be recorded by name. An
// event of inline fields without holes between them (sched_switch, the
// syscalls) is written to the trace as the ring holds it (direct).
func TestHostLayouts(t *testing.T) {
	fs, err := tracefs.Find()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	evs, err := fs.Events("*:*")
	if err != nil {
		t.Fatal(err)
	}
	n, direct := 0, 0
	for _, e := range evs {
		f, err := fs.Format(e)
		if err != nil {
			if os.IsPermission(err) {
				continue
			}
			t.Fatal(err)
		}
		l, err := layout.New(f, nil)
		if err != nil {
			t.Errorf("%s: %v", e, err)
			continue
		}
		if _, err := relayfmt.NewEventClass(0, l.Name, l.Fields); err != nil {
			t.Errorf("%s: %v", e, err)
		}
		n++
		packed := true
		sum := 0
		for _, fl := range f.All() {
			packed = packed && fl.Loc == tracefs.Inline
			if !layout.Unknowable[fl.Name] {
				sum += fl.Size
			}
		}
		if packed && sum == layout.RingOff(f.FixedSize()) {
			if !l.Direct {
				t.Errorf("%s: inline fields without holes, but the layout is not direct: %+v", e, l.Ops)
			}
			direct++
		}
		if f.FullName() == "sched:sched_switch" && !l.Direct {
			t.Errorf("sched:sched_switch is not direct: %+v", l.Ops)
		}
	}
	t.Logf("%d events, %d of them direct", n, direct)
}
