package consumer

import (
	"os"
	"testing"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestHostLayouts builds the layout and the relayfmt class of every trace
// event of the running kernel: any of them can be recorded by name.
func TestHostLayouts(t *testing.T) {
	fs, err := tracefs.Find()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	evs, err := fs.Events("*:*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		f, err := fs.Format(e)
		if err != nil {
			if os.IsPermission(err) {
				continue
			}
			t.Fatal(err)
		}
		l, err := newLayout(f, nil)
		if err != nil {
			t.Errorf("%s: %v", e, err)
			continue
		}
		if _, err := relayfmt.NewEventClass(0, l.name, l.fields); err != nil {
			t.Errorf("%s: %v", e, err)
		}
		n++
	}
	t.Logf("%d events", n)
}
