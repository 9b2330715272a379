package consumer

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's side-band records of what processes map, fork, exec and
// exit (PERF_RECORD_MMAP2, FORK, COMM with exec, EXIT), read from a dummy
// perf event's ring on each CPU as perf record reads them; userMaps
// applies them to its model.

// sideRing is a dummy perf event's ring of side-band records on one CPU.
type sideRing struct {
	fd   int
	mem  []byte
	page int
}

// sideRingPages is the data pages of a side-band ring (256 KiB with 4 KiB
// pages): a burst of execs and mmaps between two reads.
const sideRingPages = 64

// perfCountSWDummy is PERF_COUNT_SW_DUMMY (include/uapi/linux/perf_event.h).
const perfCountSWDummy = 9

// openSideRing opens a dummy software event on cpu that records mmaps of
// executable files, forks and execs with their time on clockID, and maps
// its ring. Its reader wakes at each record: wakeup_events counts only
// samples, so side-band records alone would wake it when the ring is
// half full (kernel/events/ring_buffer.c, perf_output_begin's watermark),
// too late to open the file a short-lived program mapped before it is
// deleted; a watermark of one byte wakes it at once.
func openSideRing(cpu int, clockID int32) (*sideRing, error) {
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      perfCountSWDummy,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample_type: unix.PERF_SAMPLE_TID | unix.PERF_SAMPLE_TIME,
		Bits:        unix.PerfBitMmap | unix.PerfBitMmap2 | unix.PerfBitComm | unix.PerfBitCommExec | unix.PerfBitTask | unix.PerfBitSampleIDAll | unix.PerfBitUseClockID | unix.PerfBitWatermark,
		Wakeup:      1, // wakeup_watermark, in bytes
		Clockid:     clockID,
	}
	fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("perf_event_open on CPU %d: %w", cpu, err)
	}
	page := os.Getpagesize()
	mem, err := unix.Mmap(fd, 0, page*(1+sideRingPages), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mapping the perf ring of CPU %d: %w", cpu, err)
	}
	return &sideRing{fd: fd, mem: mem, page: page}, nil
}

func (r *sideRing) close() {
	_ = unix.Munmap(r.mem)
	_ = unix.Close(r.fd)
}

// sideRecord is one side-band record, decoded.
type sideRecord struct {
	kind                uint32
	time                uint64
	pid, tid, ppid      int32
	addr, length, pgoff uint64
	dev, ino            uint64
	path                string
}

// Offsets in struct perf_event_mmap_page of data_head and data_tail.
const (
	offDataHead = 1024
	offDataTail = 1032
)

// read appends the ring's records to recs and frees their space; lost
// counts the records the kernel dropped.
func (r *sideRing) read(recs []sideRecord, lost *atomic.Uint64) []sideRecord {
	head := atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.mem[offDataHead])))
	tail := atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.mem[offDataTail])))
	data := r.mem[r.page:]
	size := uint64(len(data))
	var buf []byte
	for tail < head {
		var h [8]byte
		r.copyAt(h[:], data, tail, size)
		n := uint64(binary.LittleEndian.Uint16(h[6:]))
		if n < 8 || n > head-tail {
			break
		}
		buf = slices.Grow(buf[:0], int(n))[:n]
		r.copyAt(buf, data, tail, size)
		if rec, ok := decodeSide(buf, lost); ok {
			recs = append(recs, rec)
		}
		tail += n
	}
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&r.mem[offDataTail])), tail)
	return recs
}

// copyAt copies len(dst) bytes of the ring data from position pos.
func (r *sideRing) copyAt(dst, data []byte, pos, size uint64) {
	off := pos % size
	n := copy(dst, data[off:])
	copy(dst[n:], data)
}

// decodeSide decodes a record (struct perf_event_header, then the
// record's fields, then struct sample_id: pid, tid, time); it reports
// false for a kind it does not use or a record too short.
func decodeSide(b []byte, lost *atomic.Uint64) (sideRecord, bool) {
	le := binary.LittleEndian
	kind, misc := le.Uint32(b), le.Uint16(b[4:])
	rec := sideRecord{kind: kind}
	if len(b) >= 24 {
		rec.time = le.Uint64(b[len(b)-8:])
	}
	switch kind {
	case unix.PERF_RECORD_LOST:
		if len(b) >= 24 {
			lost.Add(le.Uint64(b[16:]))
		}
		return rec, false
	case unix.PERF_RECORD_MMAP2:
		// pid, tid, addr, len, pgoff, maj, min, ino, ino_generation,
		// prot, flags, filename[], sample_id.
		if len(b) < 72+16 || misc&perfMiscMmapBuildID != 0 {
			return rec, false
		}
		rec.pid, rec.tid = int32(le.Uint32(b[8:])), int32(le.Uint32(b[12:]))
		rec.addr, rec.length, rec.pgoff = le.Uint64(b[16:]), le.Uint64(b[24:]), le.Uint64(b[32:])
		rec.dev = unix.Mkdev(le.Uint32(b[40:]), le.Uint32(b[44:]))
		rec.ino = le.Uint64(b[48:])
		name := b[72 : len(b)-16]
		if i := slices.Index(name, 0); i >= 0 {
			name = name[:i]
		}
		rec.path = string(name)
		return rec, len(rec.path) > 0 && rec.path[0] == '/'
	case unix.PERF_RECORD_FORK, unix.PERF_RECORD_EXIT:
		// pid, ppid, tid, ptid, time, sample_id.
		if len(b) < 8+24+16 {
			return rec, false
		}
		rec.pid, rec.ppid, rec.tid = int32(le.Uint32(b[8:])), int32(le.Uint32(b[12:])), int32(le.Uint32(b[16:]))
		rec.time = le.Uint64(b[24:])
		return rec, true
	case unix.PERF_RECORD_COMM:
		if misc&perfMiscCommExec == 0 || len(b) < 8+8+16 {
			return rec, false
		}
		rec.pid, rec.tid = int32(le.Uint32(b[8:])), int32(le.Uint32(b[12:]))
		return rec, true
	}
	return rec, false
}

// PERF_RECORD_MISC_MMAP_BUILD_ID and PERF_RECORD_MISC_COMM_EXEC.
const (
	perfMiscMmapBuildID = 1 << 14
	perfMiscCommExec    = 1 << 13
)
