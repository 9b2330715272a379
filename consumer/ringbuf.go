package consumer

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/kconsume/kconsume/consumer/recorder"

	"golang.org/x/sys/unix"
)

// Record header bits of a BPF ring buffer (include/uapi/linux/bpf.h:
// BPF_RINGBUF_BUSY_BIT, BPF_RINGBUF_DISCARD_BIT, BPF_RINGBUF_HDR_SZ).
const (
	rbBusy   = 1 << 31
	rbDisc   = 1 << 30
	rbHdrLen = 8
	// areaLapMask selects the lap in a kc_area record's header (its
	// upper word; bpf/kc/area.h: kc_area_commit).
	areaLapMask = 0xffffffff << 32
)

// ringbuf is one BPF ring buffer mapped into this process, read in place.
// The layout mirrors kernel/bpf/ringbuf.c: the consumer position on the
// first page (the only one user space may write), the producer position on
// the second, then the data area mapped twice in a row so a record that
// wraps is still contiguous.
//
// It reads a kc_area ring too (recorder/area.go), whose records have the same
// 8-byte header and never wrap: there a record is finished when its
// header holds the lap the ring's walk is in, plus one (vmask and
// lapShift select it), where a BPF ring buffer clears the busy bit.
type ringbuf struct {
	fd       int
	size     uint64 // data area bytes, a power of two
	mask     uint64
	consMem  []byte
	prodMem  []byte
	consPos  *uint64
	prodPos  *uint64
	data     []byte // 2*size bytes; size bytes of a kc_area ring
	cons     uint64 // local copy of the consumer position
	vmask    uint64 // header bits that tell a finished record
	lapShift uint   // position >> lapShift is the lap (64: none)
	area     bool
	got      uint64 // records read, discarded ones not counted; rewind takes back
	// A kc_area ring's ledger (crash.go) and stream, and the records
	// released to the writers so far, which the ledger keeps.
	keep     *crashKeep
	idx      int
	released uint64
}

// newRingbuf maps the ring buffer map fd with a data area of size bytes.
func newRingbuf(fd int, size int) (*ringbuf, error) {
	page := os.Getpagesize()
	if size <= 0 || size&(size-1) != 0 || size%page != 0 {
		return nil, fmt.Errorf("ringbuf: size %d is not a power-of-two number of pages", size)
	}
	cons, err := unix.Mmap(fd, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ringbuf: mapping consumer page: %w", err)
	}
	prod, err := unix.Mmap(fd, int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Munmap(cons)
		return nil, fmt.Errorf("ringbuf: mapping producer page and data: %w", err)
	}
	r := &ringbuf{
		fd:      fd,
		size:    uint64(size),
		mask:    uint64(size - 1),
		consMem: cons,
		prodMem: prod,
		consPos: (*uint64)(unsafe.Pointer(&cons[0])),
		prodPos: (*uint64)(unsafe.Pointer(&prod[0])),
		data:    prod[page:],
		vmask:   rbBusy,
		// A shift by 64 gives 0 in Go: no lap to compare.
		lapShift: 64,
	}
	r.cons = atomic.LoadUint64(r.consPos)
	return r, nil
}

// next returns where the record at the local consumer position (r.cons,
// its ring position) starts in data and its length, and moves past it;
// ok is false when the ring holds no finished record. A discarded record
// (bpf_ringbuf_discard, or a kc_area ring's padding) comes back with
// skip set; a header whose length reaches past the data comes back with
// n 0, which the callers count as undecodable. The producer publishes
// with a release store of the header after the data (bpf_ringbuf_commit;
// kc_area_commit), so the acquire load of the header orders the reads of
// the data after it.
func (r *ringbuf) next(prod uint64) (off, n uint32, skip, ok bool) {
	if r.cons >= prod {
		return
	}
	o := r.cons & r.mask
	hdr := atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.data[o])))
	if (hdr^(r.cons>>r.lapShift+1)<<32)&r.vmask != 0 {
		return
	}
	n = uint32(hdr) &^ (rbBusy | rbDisc)
	skip = hdr&rbDisc != 0
	r.cons += (uint64(n) + rbHdrLen + 7) &^ 7
	r.got += uint64(^uint32(hdr)>>30) & 1 // not discarded (rbDisc)
	if o+rbHdrLen+uint64(n) > uint64(len(r.data)) {
		n = 0
	}
	return uint32(o + rbHdrLen), n, skip, true
}

// rewind moves the walk back to pos, a record boundary it passed, and
// takes the records between out of got, so that each record read counts
// once however often a walk goes over it (rollback). The headers are
// still there: the ring is released only up to where a walk may return.
func (r *ringbuf) rewind(pos uint64) {
	for p := pos; p < r.cons; {
		hdr := atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.data[p&r.mask])))
		r.got -= uint64(^uint32(hdr)>>30) & 1
		p += (uint64(uint32(hdr)&^(rbBusy|rbDisc)) + rbHdrLen + 7) &^ 7
	}
	r.cons = pos
}

// producer returns the producer position (acquire).
func (r *ringbuf) producer() uint64 { return atomic.LoadUint64(r.prodPos) }

// release hands the ring space before pos back to the producer with one
// release store: once per batch, not per record. A kc_area ring's space
// is zeroed first, so that a writer finds the slot of every header it
// reserves zero until it stores the header: bytes of an earlier lap there
// could pass for a written record (bpf/kc/area.h: kc_area). The store
// that follows publishes the zeroes with the position (x86 keeps stores
// in order), and the writers store only inside space they reserved after
// reading that position.
func (r *ringbuf) release(pos uint64) {
	if r.area {
		old := atomic.LoadUint64(r.consPos)
		if r.keep.on() && pos > old {
			// The ledger before the zeroes: a kill after it finds
			// these records counted, one before it in the ring.
			r.released += areaRecords(r.data, r.mask, old, pos)
			r.keep.took(r.idx, r.released, pos)
		}
		r.zero(old, pos)
	}
	atomic.StoreUint64(r.consPos, pos)
}

// areaRecords returns the records, padding not counted, of the kc_area
// ring data between positions from and to, which must hold finished
// records only.
func areaRecords(data []byte, mask, from, to uint64) uint64 {
	var n uint64
	for p := from; p < to; {
		hdr := binary.LittleEndian.Uint32(data[p&mask:])
		if hdr&rbDisc == 0 {
			n++
		}
		p += (uint64(hdr&^(rbBusy|rbDisc)) + rbHdrLen + 7) &^ 7
	}
	return n
}

// zero clears the bytes of a kc_area ring between positions from and to.
func (r *ringbuf) zero(from, to uint64) {
	switch {
	case to <= from:
	case to-from >= r.size:
		clear(r.data)
	case from&r.mask < to&r.mask:
		clear(r.data[from&r.mask : to&r.mask])
	default:
		clear(r.data[from&r.mask:])
		clear(r.data[:to&r.mask])
	}
}

// waiting returns the bytes written into the ring and not yet released.
func (r *ringbuf) waiting() uint64 { return r.producer() - atomic.LoadUint64(r.consPos) }

// lost returns 0: a BPF ring buffer reports no losses of its own; the
// recorder counts the reservations that failed.
func (r *ringbuf) lost() uint64 { return 0 }

// taken returns the records read, for a kc_area ring, whose writers do
// not count them; a BPF ring buffer's writers do.
func (r *ringbuf) taken() (uint64, bool) { return r.got, r.area }

// skipAll drops everything the ring holds now (reset), up to a record
// still being written.
func (r *ringbuf) skipAll() {
	prod := r.producer()
	for {
		if _, _, _, ok := r.next(prod); !ok {
			break
		}
	}
	r.release(r.cons)
}

func (r *ringbuf) close() {
	if r.area {
		r.data = nil // the recorder's mapping
		return
	}
	if r.consMem != nil {
		_ = unix.Munmap(r.consMem)
		_ = unix.Munmap(r.prodMem)
		r.consMem, r.prodMem, r.data = nil, nil, nil
	}
}

// newAreaRing returns the reader of stream i's kc_area ring: its bytes,
// and its positions in i's slot of kc_state; it keeps its ledger in keep.
func newAreaRing(r *recorder.Recorder, keep *crashKeep, i int) *ringbuf {
	size := uint64(r.RingBytes())
	cs := r.CPUState(i)
	rb := &ringbuf{
		fd:       -1,
		size:     size,
		mask:     size - 1,
		consPos:  &cs.Cons,
		prodPos:  &cs.Prod,
		data:     r.Area(i),
		vmask:    areaLapMask,
		lapShift: uint(bits.TrailingZeros64(size)),
		area:     true,
		keep:     keep,
		idx:      i,
	}
	rb.cons = atomic.LoadUint64(rb.consPos)
	return rb
}
