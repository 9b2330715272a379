package consumer

import (
	"testing"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/relayfmt"
)

// TestPidBitsCollision: the pid filter's bitmap lets through a task whose
// id shares a bit with a recorded one, and the hash set rejects it; the
// recorded child's events all arrive.
func TestPidBitsCollision(t *testing.T) {
	const n = 3000
	for _, tr := range transports(t) {
		t.Run(tr.String(), func(t *testing.T) {
			other := startChild(t, "getpid", n)
			rec := startChild(t, "getpid", n)
			// other's bit is set by an id no task has.
			pids := []int{other.tid + 65536, rec.tid}
			if b := recorder.PidBits(pids); b[uint32(other.tid)%65536/64]>>(uint32(other.tid)%64)&1 == 0 {
				t.Fatalf("pidBits(%v) leaves %d's bit clear", pids, other.tid)
			}
			s, dir := newTestSession(t, Config{Events: []string{"syscalls:sys_enter_getpid"}, PIDs: pids, Transport: tr})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			other.run(t)
			rec.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			got := 0
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					t.Fatalf("%v in the trace", it.Kind)
				}
				if pid := field(vals, "common_pid").Int(0); pid != int64(rec.tid) {
					t.Fatalf("event of %d recorded; filter is %v", pid, pids)
				}
				got++
			})
			if got != n {
				t.Fatalf("%d events of %d, want %d", got, rec.tid, n)
			}
		})
	}
}
