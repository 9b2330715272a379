package consumer

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/relayfmt"
)

// Offsets of the fields the writers write in an element's packet header
// (relayfmt/FORMAT.md; KC_PKT_BEGIN, KC_PKT_END, KC_PKT_CONTENT).
const (
	pktBegin   = relayfmt.OffTimestampBegin
	pktEnd     = relayfmt.OffTimestampEnd
	pktContent = relayfmt.OffContentSize
)

// pktRing reads a packet-mode ring: whole elements, once their commit
// word says every byte of them is written.
type pktRing struct {
	rec     *recorder.Recorder
	keep    *crashKeep
	cpu     int
	data    []byte // the ring's elements
	esize   uint64
	mask    uint64
	consPos *uint64
	prodPos *uint64
	cons    uint64
	got     uint64 // events in the packets taken
	clockID int32
}

// newPktRing returns the reader of stream i's packet-mode ring, which
// keeps its ledger in keep.
func newPktRing(r *recorder.Recorder, keep *crashKeep, i int, clockID int32) *pktRing {
	size := uint64(r.RingBytes())
	cs := r.CPUState(i)
	p := &pktRing{
		rec:     r,
		keep:    keep,
		cpu:     i,
		data:    r.Area(i),
		esize:   uint64(r.PktElem()),
		mask:    size - 1,
		consPos: &cs.Cons,
		prodPos: &cs.Prod,
		clockID: clockID,
	}
	p.cons = atomic.LoadUint64(p.consPos)
	return p
}

// elem returns the element at the consumer position and its commit word.
func (p *pktRing) elem() ([]byte, uint64) {
	o := p.cons & p.mask
	e := p.data[o : o+p.esize : o+p.esize]
	return e, atomic.LoadUint64((*uint64)(unsafe.Pointer(&e[recorder.PktCommit])))
}

// drain hands the ring's complete packets to the channel, after the
// losses counted for the stream, and closes the open one first when
// cutoff says everything is to go out (^0): a packet still being written
// after that is waited for a while, then taken at a later drain. The
// packets begun after that flush are left to the next drain: taking
// them too, and closing each in turn, would chase a busy CPU's writers
// with packets of a few events each for as long as they write.
func (p *pktRing) drain(w *writer, l *losses, st *stream, cutoff uint64) {
	st.blocked = false
	l.placeKernel(st)
	for st.win.n > 0 {
		w.emit(st, st.win.pop()) // loss notices
	}
	flushed := uint64(0) // the end of the packet the flush closed
	for tries := 0; ; {
		e, cw := p.elem()
		if uint32(cw) != uint32(p.esize) {
			prod := atomic.LoadUint64(p.prodPos)
			if prod == p.cons || flushed != 0 && p.cons >= flushed {
				return
			}
			if flushed == 0 && prod-p.cons < p.esize && cutoff == ^uint64(0) {
				if err := p.rec.FlushPkt(p.cpu, p.clockID); err == nil {
					flushed = p.cons + p.esize
					continue
				}
			}
			if cutoff == ^uint64(0) && tries < 100 {
				// A writer inside the packet (preempted, on a
				// faultable tracepoint): a flush waits for it a
				// while.
				tries++
				time.Sleep(time.Millisecond)
				continue
			}
			return
		}
		// The padding goes out as zeroes; the events were all written
		// over what an earlier lap left.
		if c := binary.LittleEndian.Uint64(e[pktContent:]) / 8; c >= relayfmt.PacketHeaderSize && c <= p.esize {
			clear(e[c:])
		}
		// The ledger first: a kill before the packet is written
		// counts it lost, one after it never counts it twice.
		p.keep.took(p.cpu, p.got+cw>>32, p.cons+p.esize)
		ok, err := w.ch.PutPacket(st.idx, e, cw>>32)
		if !ok && err == nil {
			if cutoff != ^uint64(0) {
				// No sub-buffer free for a remote sink: later, once
				// the channel says one freed (relayfmt.Config.Room).
				st.blocked = true
				return
			}
			// The end, or a flush: the packet goes now, so a packet
			// left in the ring is never one that Close forgets. The
			// sink frees a sub-buffer, or fails for good.
			if err = w.ch.WaitRoom(st.idx); err == nil {
				continue
			}
			_ = w.ch.Lose(st.idx, cw>>32)
		} else if errors.Is(err, relayfmt.ErrBadPacket) {
			// Counted where the channel's losses are: Stats, the
			// stream. A sink's error the channel counts itself.
			_ = w.ch.Lose(st.idx, cw>>32)
		}
		p.got += cw >> 32
		p.release(e)
	}
}

// release hands the element e at the consumer position back to the
// writers. Only its header is cleared, the commit word and the fields
// the writers read or fill among them: every byte of an event is
// written by its writer, and the padding is cleared before a packet goes
// out, so the rest of the element need not be (a ring of records does
// need it, ringbuf.release).
func (p *pktRing) release(e []byte) {
	clear(e[:relayfmt.PacketHeaderSize])
	p.cons += p.esize
	atomic.StoreUint64(p.consPos, p.cons)
}

// waiting returns the bytes of the closed packets the ring holds once
// the first of them is complete, else 0: the open one is taken only when
// it closes (the watermark that wakes the drainer is at least a packet),
// and a packet a writer is still inside holds up those after it, so a
// drain now would take nothing.
func (p *pktRing) waiting() uint64 {
	if _, cw := p.elem(); uint32(cw) != uint32(p.esize) {
		return 0
	}
	return atomic.LoadUint64(p.prodPos)&^(p.esize-1) - p.cons
}

// skipAll drops the packets the ring holds (reset), the open one closed
// first; one whose writer is still inside it is written when complete.
func (p *pktRing) skipAll() {
	_ = p.rec.FlushPkt(p.cpu, p.clockID)
	for {
		e, cw := p.elem()
		if uint32(cw) != uint32(p.esize) {
			return
		}
		p.release(e)
		p.keep.took(p.cpu, p.got, p.cons)
	}
}

// lost returns 0: the recorder counts the reservations that failed.
func (p *pktRing) lost() uint64 { return 0 }

// taken returns the events in the packets taken: the writers count none.
func (p *pktRing) taken() (uint64, bool) { return p.got, true }

func (p *pktRing) close() { p.data = nil }
