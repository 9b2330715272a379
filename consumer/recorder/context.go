package recorder

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/gen"
)

// Contexts: an event whose layout declares contexts (layout.Context) is,
// like one with call chains, recorded by the tracepoints' general
// program, which writes them behind the record (kc_context in
// bpf/kc/context.h). The perf contexts read counters the recorder opens
// on every CPU into kc_ctx_perf.

// putContexts sets in ti the contexts of l.
func putContexts(ti *gen.RingbufKcTpInfo, l *layout.Layout) {
	bits, size := layout.ContextBits(l.Ctx)
	ti.Ctx, ti.CtxLen = bits, uint8(size)
}

// openPerfContexts opens, on each CPU, the counter of each perf context of
// ctxs and puts it in kc_ctx_perf at its slot. A CPU that is offline is
// left out: its events read 0. It fails, naming the context, when the
// machine has no such counter (a VM without a PMU, say) or the kernel
// refuses it.
func (r *Recorder) openPerfContexts(ctxs []layout.Context) error {
	m := r.coll.Maps[gen.RingbufMapKcCtxPerf]
	slot := 0
	for _, c := range ctxs {
		if c.Perf == nil {
			continue
		}
		attr := unix.PerfEventAttr{Type: uint32(c.Perf.Type), Config: c.Perf.Config, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
		opened := 0
		for cpu := range r.ncpu {
			fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
			if errors.Is(err, unix.ENODEV) {
				continue // offline
			}
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("%w: context %s: this machine has no such counter (perf_event_open: %w)", ErrNotSupported, c.Name, err)
			}
			if err != nil {
				return fmt.Errorf("context %s: perf_event_open on CPU %d: %w", c.Name, cpu, err)
			}
			r.perfFDs = append(r.perfFDs, fd)
			if err := m.Put(uint32(slot*r.ncpu+cpu), uint32(fd)); err != nil {
				return fmt.Errorf("context %s: %w", c.Name, err)
			}
			opened++
		}
		if opened == 0 {
			return fmt.Errorf("context %s: no CPU took the counter", c.Name)
		}
		slot++
	}
	return nil
}

// closePerfContexts closes the counters openPerfContexts opened.
func (r *Recorder) closePerfContexts() {
	for _, fd := range r.perfFDs {
		_ = unix.Close(fd)
	}
	r.perfFDs = nil
}
