package recorder

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/gen"
)

// Call chains: an event whose layout declares them (layout.Stack) is
// recorded by the tracepoints' general program, which writes them behind
// the record with bpf_get_stack (kc_stack_tail in bpf/kc/stack.h); the
// other paths leave such events to it (EventOptions, rawPath.attach).

// KC_STACK_* of bpf/kc/stack.h (TestMirrorsC).
const (
	stackKernel  = 1
	stackUser    = 2
	stackAtLimit = 4
)

// stackLimitFile holds the kernel's most frames of a call chain, which
// bpf_get_stack obeys (kernel/bpf/stackmap.c).
const stackLimitFile = "/proc/sys/kernel/perf_event_max_stack"

// StackLimit returns the most frames the running kernel gives a call
// chain: kernel.perf_event_max_stack, at most layout.MaxStack. It fails
// when the setting cannot be read.
func StackLimit() (int, error) {
	b, err := os.ReadFile(stackLimitFile)
	if err != nil {
		return 0, fmt.Errorf("reading the kernel's stack depth limit: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("reading the kernel's stack depth limit: %s holds %q", stackLimitFile, strings.TrimSpace(string(b)))
	}
	return min(n, layout.MaxStack), nil
}

// putStack sets in ti the call chains s at depth frames (0: the kernel's
// limit). It fails for a depth past that limit.
func putStack(ti *gen.RingbufKcTpInfo, s layout.Stack, depth int) error {
	limit, err := StackLimit()
	if err != nil {
		return err
	}
	if depth == 0 {
		depth = limit
	}
	if depth < 1 || depth > limit {
		return fmt.Errorf("%w: stack depth %d: want 1 to %d, the kernel's limit (kernel.perf_event_max_stack)", ErrConfig, depth, limit)
	}
	if s&layout.StackKernel != 0 {
		ti.Stack |= stackKernel
	}
	if s&layout.StackUser != 0 {
		ti.Stack |= stackUser
	}
	if depth == limit {
		ti.Stack |= stackAtLimit
	}
	ti.StackDepth = uint8(depth)
	return nil
}

// tail reports whether event key i records call chains or contexts
// behind its record, which only the tracepoints' general program writes.
func (r *Recorder) tail(i int) bool {
	return i < len(r.stacks) && r.stacks[i] != 0 || len(r.ctxs) > 0
}

// StackCounts are the call chains and contexts the recorder could not
// record whole.
type StackCounts struct {
	// Truncated were cut at the depth: the chain went deeper.
	Truncated uint64
	// Failed were recorded empty: the kernel gave none (bpf_get_stack
	// failed), or the record left no room for them.
	Failed uint64
	// CountersUnread are perf counter contexts the kernel would not
	// read, each written as 0: a CPU offline when the counters were
	// opened, or a counter in error.
	CountersUnread uint64
}

// StackCounts returns the counts of all CPUs: zero call chains when no
// event records any, zero counters when no event records a perf
// context. It fails when the counters cannot be read.
func (r *Recorder) StackCounts() (StackCounts, error) {
	var c StackCounts
	if m := r.coll.Maps[gen.RingbufMapKcStackStats]; m != nil && slices.ContainsFunc(r.stacks, func(s layout.Stack) bool { return s != 0 }) {
		var per []gen.RingbufKcStackCount
		if err := m.Lookup(uint32(0), &per); err != nil {
			return c, fmt.Errorf("reading the stack counts: %w", err)
		}
		for _, p := range per {
			c.Truncated += p.Truncated
			c.Failed += p.Failed
		}
	}
	if m := r.coll.Maps[gen.RingbufMapKcCtxStats]; m != nil && len(r.perfFDs) > 0 {
		var per []uint64
		if err := m.Lookup(uint32(0), &per); err != nil {
			return c, fmt.Errorf("reading the perf contexts' counts: %w", err)
		}
		for _, n := range per {
			c.CountersUnread += n
		}
	}
	return c, nil
}

// errStackUser is why an event with user-space fields records no call
// chain: kc_sys_user_fault builds its record, not kc_record.
var errStackUser = errors.New("its user-space fields are recorded by a program that records no call chain")

// UserStackProcs returns the processes whose user call chains were
// recorded, of those the recorder's map holds now: once full it lets go
// of the least recently used. It fails when the map cannot be read.
func (r *Recorder) UserStackProcs() ([]int32, error) {
	m := r.coll.Maps[gen.RingbufMapKcUstackProcs]
	if m == nil {
		return nil, nil
	}
	var out []int32
	var pid uint32
	var one uint8
	it := m.Iterate()
	for it.Next(&pid, &one) {
		out = append(out, int32(pid))
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("reading the processes with user call chains: %w", err)
	}
	return out, nil
}
