package consumer

import (
	"encoding/binary"
	"unsafe"

	"github.com/kconsume/kconsume/gen"
)

// recHdrLen is sizeof(struct kc_rec) (bpf/kc/core.h).
const recHdrLen = int(unsafe.Sizeof(gen.RingbufKcRec{}))

// kcRec is a record as the recorder writes it: struct kc_rec
// (bpf/kc/core.h), then the payload. Its accessors need a record of at
// least recHdrLen bytes; they inline to plain loads.
type kcRec []byte

// ts returns the record's timestamp (kc_rec.ts).
func (r kcRec) ts() uint64 { return binary.LittleEndian.Uint64(r) }

// key returns the record's event key, its class id (kc_rec.key).
func (r kcRec) key() uint32 { return binary.LittleEndian.Uint32(r[8:]) }

// size returns the payload length the record claims (kc_rec.len).
func (r kcRec) size() int { return int(binary.LittleEndian.Uint16(r[12:])) }

// cpu returns the CPU the record was written on (kc_rec.cpu), which a
// global ring's records need.
func (r kcRec) cpu() int { return int(binary.LittleEndian.Uint16(r[14:])) }

// source is where a stream's records come from: a BPF ring buffer, a
// perf ring, or nothing (a perf CPU that was offline at the start). It is
// chosen when the stream opens, as LTTng's consumer picks a stream's
// read_subbuffer_ops, so the drain never asks which transport it has.
// Its methods run on the drainer goroutine.
type source interface {
	// drain moves the source's finished records through st's reorder
	// window into the channel with w, writing out those stamped before
	// cutoff, and places the losses counted for st with l.
	drain(w *writer, l *losses, st *stream, cutoff uint64)
	// waiting returns the bytes the source holds unread.
	waiting() uint64
	// skipAll drops what the source holds now (reset).
	skipAll()
	// lost returns the records the transport itself reported lost.
	lost() uint64
	// taken returns the records the source counted as it read them,
	// and true, where the writers do not count what they emit (kc_area
	// rings, packet mode); else false.
	taken() (uint64, bool)
	close()
}

// stream is one output stream (a buffer of the channel) and the state of
// draining its source into it.
type stream struct {
	idx         int      // buffer index in the channel (the CPU; 0 in global mode)
	src         source   // never nil
	bell        *ringbuf // a kc_area ring's doorbell, or nil
	data        []byte   // the source's data area, where entries point
	wrap        *[2][]byte
	win         *window
	scratch     []byte
	ctxScratch  []byte // a payload behind zero contexts (writer.streamCtx)
	wakeups     uint64
	undecodable uint64 // records the consumer could not decode
	cps         checkpoints
	rollbacks   int // times a late record sent the ring's walk back
	// replayEnd is just past the ring position of the late record that
	// last sent the walk back: until the walk passes it, every record
	// goes through the window, where the late one takes its place.
	replayEnd uint64
	// blocked is set when the last drain left packets in the ring for
	// want of a free sub-buffer of a remote sink (pktRing.drain).
	blocked bool
}

// record returns the bytes of a waiting entry's record: in the source's
// data area, or in a perf ring's copy of a record that wrapped.
func (st *stream) record(e entry) []byte {
	if e.off&wrapBit != 0 {
		b := st.wrap[(e.off/wrapIdx)&1]
		o := e.off &^ (wrapBit | wrapIdx)
		return b[o : o+e.n]
	}
	return st.data[e.off : e.off+e.n : e.off+e.n]
}

// reset drops what waits for st and what its source holds.
func (st *stream) reset() {
	for st.win.n > 0 {
		st.win.pop()
	}
	st.cps.clear()
	st.src.skipAll()
}

// noSource is the source of a perf CPU without a ring (offline when the
// session opened, and not yet reopened): the recorder's outputs there
// fail and are counted, and the drain places them all the same.
type noSource struct{}

func (noSource) drain(w *writer, l *losses, st *stream, cutoff uint64) {
	l.placeKernel(st)
	for st.win.n > 0 && st.win.front().ts <= cutoff {
		w.emit(st, st.win.pop())
	}
}
func (noSource) waiting() uint64       { return 0 }
func (noSource) skipAll()              {}
func (noSource) lost() uint64          { return 0 }
func (noSource) taken() (uint64, bool) { return 0, false }
func (noSource) close()                {}
