package consumer

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/relayfmt"
)

// renameComm is the NUL-terminated name the "rename" child gives itself
// on its i-th call.
func renameComm(i int) []byte { return []byte(fmt.Sprintf("kc-rn-%d\x00", i)) }

// TestTaskRename: task:task_rename, a 46-byte record (two comm strings
// and a trailing short), goes straight into the ring by the recorder copy
// of its size where there are cookies and ring buffers, and every field
// of every call of a child comes out as the kernel gave it.
func TestTaskRename(t *testing.T) {
	const n = 2000
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			c := startChild(t, "rename", n)
			s, dir := newTestSession(t, Config{Events: []string{"task:task_rename"}, PIDs: []int{c.tid}, Transport: tr})
			want := "kc_tp_0"
			switch {
			case s.rec.useCookie && tr == Ringbuf:
				want = "kc_tp_s46"
			case s.rec.useCookie:
				want = "kc_tracepoint"
			}
			if s.rec.tpProgs[0] != want {
				t.Fatalf("recorded by %s, want %s", s.rec.tpProgs[0], want)
			}
			// Not 0, so a trailing short left out reads wrong.
			adjf := fmt.Sprintf("/proc/%d/oom_score_adj", c.tid)
			if err := os.WriteFile(adjf, []byte("123"), 0); err != nil {
				t.Fatal(err)
			}
			adj, err := os.ReadFile(adjf)
			if err != nil {
				t.Fatal(err)
			}
			oom, err := strconv.Atoi(strings.TrimSpace(string(adj)))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			i := 0
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					t.Fatalf("%v in the trace", it.Kind)
				}
				newc := strings.TrimSuffix(string(renameComm(i)), "\x00")
				if got := field(vals, "newcomm").Text(); string(got) != newc {
					t.Fatalf("event %d: newcomm %q, want %q", i, got, newc)
				}
				if i > 0 {
					old := strings.TrimSuffix(string(renameComm(i-1)), "\x00")
					if got := field(vals, "oldcomm").Text(); string(got) != old {
						t.Fatalf("event %d: oldcomm %q, want %q", i, got, old)
					}
				}
				if got := field(vals, "pid").Int(0); got != int64(c.tid) {
					t.Fatalf("event %d: pid %d, want %d", i, got, c.tid)
				}
				if got := field(vals, "common_pid").Int(0); got != int64(c.tid) {
					t.Fatalf("event %d: common_pid %d, want %d", i, got, c.tid)
				}
				if got := field(vals, "oom_score_adj").Int(0); got != int64(oom) {
					t.Fatalf("event %d: oom_score_adj %d, want %d", i, got, oom)
				}
				i++
			})
			if i != n {
				t.Fatalf("%d events, want %d", i, n)
			}
		})
	}
}
