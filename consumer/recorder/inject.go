package recorder

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/kconsume/kconsume/gen"
	"golang.org/x/sys/unix"
)

// The injector's returns mirror KC_INJECT_* (bpf/kc/inject.bpf.h;
// TestMirrorsC). KC_INJECT_BADLEN, a length the injector refuses,
// inject checks before.
const (
	injectOK   = 0
	injectOff  = 1
	injectLost = 3
)

// injector runs kc_inject, one caller at a time, with its record.
type injector struct {
	mu  sync.Mutex
	rec *gen.RingbufKcInjectRec
}

// run is Inject, with the recorder's collection coll of ncpu CPUs.
func (in *injector) run(coll *ebpf.Collection, ncpu, cpu int, key uint32, payload []byte) error {
	prog := coll.Programs[gen.RingbufProgKcInject]
	buf := coll.Maps[gen.RingbufMapKcInjectBuf]
	if prog == nil || buf == nil {
		return errors.New("inject: this session's recorder has no injector")
	}
	if cpu < 0 || cpu >= ncpu {
		return fmt.Errorf("%w: inject: no CPU %d (0..%d)", ErrConfig, cpu, ncpu-1)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.rec == nil {
		in.rec = new(gen.RingbufKcInjectRec)
	}
	rec := in.rec
	if len(payload) > len(rec.Data)-1 {
		return fmt.Errorf("inject: payload of %d bytes, at most %d", len(payload), len(rec.Data)-1)
	}
	rec.Key, rec.Len = key, uint32(len(payload))
	copy(rec.Data[:], payload)
	if err := buf.Put(uint32(0), rec); err != nil {
		return fmt.Errorf("inject: %w", err)
	}
	ret, err := prog.Run(&ebpf.RunOptions{CPU: uint32(cpu), Flags: unix.BPF_F_TEST_RUN_ON_CPU})
	if err != nil {
		return fmt.Errorf("inject on CPU %d: %w", cpu, err)
	}
	switch ret {
	case injectOK:
		return nil
	case injectOff:
		return fmt.Errorf("inject on CPU %d: %w", cpu, ErrStopped)
	case injectLost:
		return fmt.Errorf("inject on CPU %d: %w", cpu, ErrInjectLost)
	}
	return fmt.Errorf("inject on CPU %d: injector returned %d", cpu, ret)
}
