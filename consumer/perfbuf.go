package consumer

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Offsets in struct perf_event_mmap_page (include/uapi/linux/perf_event.h).
const (
	perfDataHead   = 1024
	perfDataTail   = 1032
	perfDataOffset = 1040
	perfDataSize   = 1048
)

// Record types of a perf ring (enum perf_event_type).
const (
	perfRecordLost   = 2
	perfRecordSample = 9
)

// perfRing is one CPU's perf ring buffer, read in place. Unlike a BPF ring
// buffer its data area is mapped once, so a record that wraps around the
// end is copied out; two copy buffers suffice, since the tail cannot move
// past the oldest waiting record and so at most two wrapped records (one
// per lap parity) can wait at once.
type perfRing struct {
	cpu   int
	fd    int
	mem   []byte
	data  []byte
	size  uint64
	mask  uint64
	tail  uint64
	nlost uint64 // records perf reported lost
	wrap  [2][]byte
}

// openPerfRing opens the BPF output perf event of cpu and maps its ring
// of size bytes. The kernel wakes the consumer once watermark bytes wait.
func openPerfRing(cpu, size, watermark int) (*perfRing, error) {
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      unix.PERF_COUNT_SW_BPF_OUTPUT,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample_type: unix.PERF_SAMPLE_RAW,
		Wakeup:      uint32(watermark),
		Bits:        unix.PerfBitWatermark,
	}
	fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("perf event on cpu %d: %w", cpu, err)
	}
	page := os.Getpagesize()
	mem, err := unix.Mmap(fd, 0, page+size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("perf ring of cpu %d: %w", cpu, err)
	}
	off := binary.NativeEndian.Uint64(mem[perfDataOffset:])
	n := binary.NativeEndian.Uint64(mem[perfDataSize:])
	if off == 0 { // kernels before 4.1 leave them 0
		off, n = uint64(page), uint64(size)
	}
	p := &perfRing{cpu: cpu, fd: fd, mem: mem, data: mem[off : off+n], size: n, mask: n - 1}
	p.tail = atomic.LoadUint64(p.tailPtr())
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		p.close()
		return nil, fmt.Errorf("enabling perf event on cpu %d: %w", cpu, err)
	}
	return p, nil
}

func (p *perfRing) headPtr() *uint64 { return (*uint64)(unsafe.Pointer(&p.mem[perfDataHead])) }
func (p *perfRing) tailPtr() *uint64 { return (*uint64)(unsafe.Pointer(&p.mem[perfDataTail])) }

// head returns data_head; the acquire load orders the record reads after
// it (perf_output_put_handle publishes it after the data).
func (p *perfRing) head() uint64 { return atomic.LoadUint64(p.headPtr()) }

// release hands ring space before pos back to the kernel.
func (p *perfRing) release(pos uint64) { atomic.StoreUint64(p.tailPtr(), pos) }

// badSample is next's length for a sample whose raw size does not fit its
// record: it is consumed and must be counted, not decoded.
const badSample = ^uint32(0)

// next returns the record at the tail and moves past it: where a sample's
// raw bytes start (in data, or with wrapBit in a wrap copy) and their
// length (badSample for a malformed one), or the count of a lost record;
// ok is false at head. Record types other than samples and losses are
// skipped.
func (p *perfRing) next(head uint64) (off, n uint32, lost, pos uint64, ok bool) {
	for p.tail+8 <= head {
		pos = p.tail
		o := pos & p.mask
		typ := binary.NativeEndian.Uint32(p.data[o:])
		size := uint64(binary.NativeEndian.Uint16(p.data[o+6:]))
		if size < 8 {
			// A corrupt header would loop forever; skip to head.
			p.tail = head
			return 0, 0, 0, 0, false
		}
		p.tail += size
		rec, base := p.data[o:], uint32(o)
		if o+size > p.size {
			i := (pos / p.size) & 1
			b := p.wrap[i][:0]
			b = append(b, p.data[o:]...)
			b = append(b, p.data[:size-(p.size-o)]...)
			p.wrap[i] = b
			rec, base = b, wrapBit|uint32(i)*wrapIdx
		}
		rec = rec[:size]
		switch typ {
		case perfRecordSample:
			if size < 12 {
				return 0, badSample, 0, pos, true
			}
			n := binary.NativeEndian.Uint32(rec[8:])
			if 12+uint64(n) > size {
				return 0, badSample, 0, pos, true
			}
			return base + 12, n, 0, pos, true
		case perfRecordLost:
			if size < 24 {
				continue
			}
			return 0, 0, binary.NativeEndian.Uint64(rec[16:]), pos, true
		}
	}
	return 0, 0, 0, 0, false
}

// waiting returns the bytes in the ring not yet read.
func (p *perfRing) waiting() uint64 { return p.head() - p.tail }

// lost returns the records perf reported lost so far.
func (p *perfRing) lost() uint64 { return p.nlost }

// taken returns false: the recorder counts what it hands to perf.
func (p *perfRing) taken() (uint64, bool) { return 0, false }

func (p *perfRing) skipAll() {
	p.tail = p.head()
	p.release(p.tail)
}

func (p *perfRing) close() {
	if p.mem != nil {
		_ = unix.Munmap(p.mem)
		p.mem, p.data = nil, nil
	}
	if p.fd >= 0 {
		_ = unix.Close(p.fd)
		p.fd = -1
	}
}

// drain walks the perf ring as a ringbuf's drain does, through st's
// reorder window; perf's lost records enter the window as loss notices
// at their place.
func (p *perfRing) drain(wr *writer, l *losses, st *stream, cutoff uint64) {
	w := st.win
	head := p.head()
	// Release every sixteenth of the ring, as a ringbuf's drain does. A record
	// that starts before stop is whole: data_head only moves past whole
	// records.
	stop := min(head, p.tail+p.size/16)
	for {
		if p.tail >= stop && stop < head {
			p.release(w.releasePos(p.tail))
			stop = min(head, p.tail+p.size/16)
		}
		off, n, lost, pos, ok := p.next(stop)
		if !ok {
			break
		}
		if n == badSample {
			wr.undecodable(st)
			continue
		}
		if w.full() {
			wr.emit(st, w.pop())
		}
		if n == 0 {
			// perf's count is a subset of the recorder's own lost counter
			// (every failed bpf_perf_event_output is counted there too),
			// which placeKernel may have placed already: place only what
			// is new, here, where perf says it happened.
			p.nlost += lost
			if n := l.place(p.cpu, p.nlost); n > 0 {
				w.push(entry{ts: w.last(), pos: n})
			}
			continue
		}
		e := entry{pos: pos, off: off, n: n}
		if n < uint32(recHdrLen) {
			wr.undecodable(st)
			continue
		}
		e.ts = binary.LittleEndian.Uint64(st.record(e))
		w.push(e)
	}
	l.placeKernel(st)
	for w.n > 0 && w.front().ts <= cutoff {
		wr.emit(st, w.pop())
	}
	p.release(w.releasePos(p.tail))
}
