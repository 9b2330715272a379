package relayfmt

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Run is a writer's fast path into the open sub-buffer of one buffer, for
// a loop that writes many events in a row: the buffer's writer state is
// copied into the Run, and Put, small enough for the compiler to inline,
// writes an event with no call but the payload's copy. A Run takes only
// an event that needs nothing else, as Write's own fast path: a class id
// of at most MaxCompactID with a fixed payload size (so a compact
// header), a timestamp no lower than the last one written and less than
// 2^27 ticks after the packet's last full one, room left in the open
// sub-buffer. It refuses everything else; the caller then Syncs the Run
// and writes that event with Write or Append.
//
// The events Put reach the buffer at Sync. Every other call on the buffer
// (Write, Append, Mark, Undo, Discard, LastTS, StatsCPU, FlushCPU...) must
// come after a Sync, and a Run used after a call that changed the buffer
// (all of them but Mark, LastTS and StatsCPU) must be started again with
// Channel.Run. Only the buffer's writer may hold a Run on it.
type Run struct {
	b      *buffer
	free   []byte  // the open sub-buffer after the last event
	sizes  []int32 // b.sizes up to MaxCompactID
	lastTS uint64
	maxTS  uint64 // the latest timestamp a compact header can carry
	events uint64
	opens  uint64 // b.opens at the start: a switch ends the Run
	off    int    // b.off at the start or the last Sync
	room   int    // len(free) then
	cpu    uint32 // the cpu the Run was started for
}

// newRun returns a Run on b at its current state, for cpu; it refuses
// every event when b has no open sub-buffer or its events carry a context.
func newRun(b *buffer, cpu uint32) Run {
	r := Run{b: b, cpu: cpu, lastTS: b.lastTS, maxTS: math.MaxUint64, events: b.events, opens: b.opens, off: b.off}
	if b.lastFull <= math.MaxUint64-compactTSMask {
		r.maxTS = b.lastFull + compactTSMask
	}
	if b.cur != nil && b.ctx == 0 {
		r.free = b.cur[b.off:]
		r.sizes = b.sizes[:min(len(b.sizes), MaxCompactID+1)]
		r.room = len(r.free)
	}
	return r
}

// Put writes one event of class id with timestamp ts into the Run, as
// Write would, and reports true; or it writes nothing and reports false
// when the event needs more than a Run does (see Run).
func (r *Run) Put(ts uint64, id uint32, payload []byte) bool {
	n := len(payload)
	if uint64(id) >= uint64(len(r.sizes)) || int(r.sizes[id]) != n || ts < r.lastTS || ts > r.maxTS || n+CompactHeaderSize > len(r.free) {
		return false
	}
	binary.LittleEndian.PutUint32(r.free, id|uint32(ts&compactTSMask)<<5)
	copy(r.free[CompactHeaderSize:], payload)
	r.free = r.free[CompactHeaderSize+n:]
	r.lastTS = ts
	r.events++
	return true
}

// Reserve writes the header of one event of class id with timestamp ts
// and a payload of n bytes into the Run, as Put does, and returns the n
// bytes of the open sub-buffer its payload takes, for the caller to fill
// before its next call on the Run: a payload built in place is written
// once. It returns nil, writing nothing, when Put would refuse such an
// event.
func (r *Run) Reserve(ts uint64, id uint32, n int) []byte {
	if uint64(id) >= uint64(len(r.sizes)) || int(r.sizes[id]) != n || ts < r.lastTS || ts > r.maxTS || n+CompactHeaderSize > len(r.free) {
		return nil
	}
	binary.LittleEndian.PutUint32(r.free, id|uint32(ts&compactTSMask)<<5)
	p := r.free[CompactHeaderSize : CompactHeaderSize+n]
	r.free = r.free[CompactHeaderSize+n:]
	r.lastTS = ts
	r.events++
	return p
}

// Append is Channel.Append through the Run, for an event Put refused: it
// Syncs the Run, appends the event to the Run's buffer (on a global
// channel, with the cpu the Run was started for as its context), and
// starts the Run again there. Events Put since a Sync that fails are
// lost, as they are at that Sync. On a Run of an unknown cpu it returns
// ErrNoStream.
func (r *Run) Append(ts uint64, id uint32, payload []byte) (bool, error) {
	b, cpu := r.b, r.cpu
	if b == nil {
		return true, fmt.Errorf("run: %w", ErrNoStream)
	}
	r.Sync()
	written, err := b.writeSlow(ts, id, payload, cpu, false)
	*r = newRun(b, cpu)
	return written, err
}

// LastTS returns the timestamp of the newest event written to the Run's
// buffer, the Run's included: Put refuses an earlier one.
func (r *Run) LastTS() uint64 { return r.lastTS }

// Sync stores the events Put since the Run started, or since the last
// Sync, into the buffer, where the other calls see them; the Run may go
// on after it. It reports false, storing nothing, when the buffer was
// written, undone or switched to another sub-buffer since (the Run was
// not started again after another call): the events Put since are lost.
func (r *Run) Sync() bool {
	b := r.b
	if b == nil {
		return true
	}
	if b.opens != r.opens || b.off != r.off {
		return false
	}
	r.off += r.room - len(r.free)
	r.room = len(r.free)
	b.off, b.lastTS, b.events = r.off, r.lastTS, r.events
	return true
}
