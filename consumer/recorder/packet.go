package recorder

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/kconsume/kconsume/internal/clock"

	"github.com/kconsume/kconsume/consumer/layout"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/relayfmt"
)

// Packet mode (kc_pkt_on in bpf/kc/pkt.h): the elements of the
// recorder's own rings are the trace's packets, which the writers fill
// with the events as the trace holds them, so the drainer hands whole
// elements to the channel (relayfmt.Channel.PutPacket) and reads no
// record. It is LTTng's design: producers that write the sub-buffers, a
// commit count per sub-buffer in place of a header per record, and a
// consumer that only moves sub-buffers. It needs what the writers can
// write as the trace holds it: every event's record is its payload as it
// is (a direct layout), stamped in its reservation (no wakeup_latency,
// whose time is its sched_switch's), from the recorder's programs alone,
// into per-CPU rings that are not overwritten. A record that is not its
// payload as it is (__data_loc strings and arrays, holes between fields)
// is built by the program that records it, with the steps the consumer's
// transcoder would take (pktOps, kc_ctf_build), so it goes through the
// scratch record, never straight into the ring (kc_record_small).

// Element sizes of packet mode: a packet must hold the largest record
// many times over, and a ring at least pktMinElems of them.
const (
	pktMinElem  = 16 << 10
	pktMinElems = 4
	// PktCommit is the commit word's offset in an element
	// (KC_PKT_COMMIT): packet_seq_num's place until the channel writes
	// the number.
	PktCommit = relayfmt.OffPacketSeqNum
)

// pktShape returns the element size and count of a packet-mode ring of
// cfg: the largest power of two up to the sub-buffer size (the trace's
// packets are the elements), within what the ring and an array value
// allow, and at least pktMinElem.
func pktShape(cfg Config) (elem, count int) {
	elem = 1 << (bits.Len(uint(cfg.SubbufSize)) - 1)
	elem = min(elem, cfg.RingSize/pktMinElems, areaMaxElem)
	elem = max(elem, pktMinElem)
	return elem, cfg.RingSize / elem
}

// pktEligible returns nil when a session of cfg recording formats, with
// synthetic events defined or wakeup_latency hooked as wake says, can be
// written in packet mode (given kc_area rings), or why not; with raw set
// its syscall events are recorded by the raw syscall programs (sysShape),
// else by their tracepoints.
func pktEligible(cfg Config, formats []*tracefs.Format, synths int, wake, raw bool) error {
	switch {
	case Testing.NoPackets:
		return errors.New("turned off (KC_NO_PKT)")
	case cfg.Latency > 0:
		// The bound takes records out of the ring within it. In packet
		// mode that means closing the open packet, and every packet
		// fills a whole sub-buffer of the file: at 1 ms a few events a
		// period made 1.4 GB of padding in 3 s.
		return errors.New("a latency bound would close a packet, padded to a whole sub-buffer, each period")
	case wake:
		return errors.New("synthetic:wakeup_latency takes its sched_switch's time")
	case synths > 0:
		return errors.New("synthetic events are transcoded")
	case len(cfg.Objects) > 0:
		return errors.New("users' programs write records of their own")
	case cfg.Global:
		return errors.New("one stream of all CPUs carries each event's CPU")
	case cfg.Mode != relayfmt.NoOverwrite:
		return errors.New("flight-recorder mode keeps the channel's own sub-buffers")
	case len(cfg.Adjust) > 0:
		return errors.New("adjusted fields are transcoded")
	case cfg.SubbufSize < pktMinElem:
		return fmt.Errorf("sub-buffers of %d bytes are smaller than a packet of the rings, %d bytes at least", cfg.SubbufSize, pktMinElem)
	case cfg.RingSize/pktMinElem < pktMinElems:
		return fmt.Errorf("ring size %d holds fewer than %d packets of %d bytes", cfg.RingSize, pktMinElems, pktMinElem)
	}
	for _, f := range formats {
		at := layout.RingOff
		// The raw syscall programs' dispatch (rawPath.attach) takes
		// these; the others go through their tracepoints.
		if _, ok := SysShape(f); ok && raw {
			if _, known := sysNr(f); known {
				at = layout.SysRingOff
			}
		}
		l, err := layout.NewAt(f, nil, at)
		if err != nil {
			return err
		}
		if _, err := pktOps(l); err != nil {
			return err
		}
	}
	return nil
}

// maxPktOps mirrors KC_MAX_OPS (bpf/kc/event.h; TestMirrorsC).
const maxPktOps = 16

// BPF steps of kc_ctf_build (KC_OP_*).
const (
	pktOpCopy = iota
	pktOpString
	pktOpSeq
)

// pktOps returns the steps with which the BPF programs build l's payload
// in packet mode (kc_tp_info.ops), none for a layout whose payload is the
// record as it is, or why they cannot: a step they do not take (an
// adjusted field) or more steps than they take.
func pktOps(l *layout.Layout) ([]gen.RingbufKcOp, error) {
	if l.Direct {
		return nil, nil
	}
	lops := l.Ops
	if len(lops) > maxPktOps {
		return nil, fmt.Errorf("event %s takes %d steps to transcode, the BPF programs at most %d", l.Name, len(lops), maxPktOps)
	}
	ops := make([]gen.RingbufKcOp, len(lops))
	for i, o := range lops {
		op := gen.RingbufKcOp{Off: uint16(o.Off), N: uint16(o.N), Rel: uint8(boolU32(o.Rel)), Elem: uint16(o.Elem)}
		switch o.Kind {
		case layout.OpCopy:
			op.Kind = pktOpCopy
		case layout.OpString:
			op.Kind = pktOpString
		case layout.OpSeq:
			op.Kind = pktOpSeq
		default:
			return nil, fmt.Errorf("event %s has a field the BPF programs do not transcode", l.Name)
		}
		ops[i] = op
	}
	return ops, nil
}

// FlushPkt closes the packet open in cpu's ring, if it holds events, by
// running kc_pkt_flush on cpu; on a CPU that cannot run it (offline: its
// writers are done) it closes it from here, at the time now on the
// rings' clock (clock_gettime's clockID).
func (r *Recorder) FlushPkt(cpu int, clockID int32) error {
	prog := r.coll.Programs[gen.RingbufProgKcPktFlush]
	for range 8 {
		ret, err := prog.Run(&ebpf.RunOptions{CPU: uint32(cpu), Flags: unix.BPF_F_TEST_RUN_ON_CPU})
		if errors.Is(err, unix.ENXIO) {
			now, ok := clock.Now(clockID)
			if !ok {
				return fmt.Errorf("closing the packet of offline CPU %d: no clock %d", cpu, clockID)
			}
			return r.flushPktHere(cpu, now)
		}
		if err != nil {
			return fmt.Errorf("closing the packet of CPU %d: %w", cpu, err)
		}
		if ret == 0 {
			return nil
		}
	}
	return fmt.Errorf("closing the packet of CPU %d: the writers won every race", cpu)
}

// flushPktHere is kc_pkt_flush from user space, for a CPU whose writers
// cannot run.
func (r *Recorder) flushPktHere(cpu int, now uint64) error {
	cs := r.CPUState(cpu)
	esize := uint64(r.pktElem)
	for {
		old := atomic.LoadUint64(&cs.Prod)
		off := old & (esize - 1)
		if off == 0 {
			return nil
		}
		if !atomic.CompareAndSwapUint64(&cs.Prod, old, old+esize-off) {
			continue
		}
		ring := uint64(r.cfg.RingSize)
		e := r.areaMem[uint64(cpu)*ring+(old&(ring-1)&^(esize-1)):]
		le := binary.LittleEndian
		begin := le.Uint64(e[relayfmt.OffTimestampBegin:])
		le.PutUint64(e[relayfmt.OffTimestampEnd:], max(now, begin))
		le.PutUint64(e[relayfmt.OffContentSize:], off*8)
		atomic.AddUint64((*uint64)(unsafe.Pointer(&e[PktCommit])), esize-off)
		return nil
	}
}
