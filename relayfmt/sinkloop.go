package relayfmt

import (
	"encoding/binary"
	"fmt"
)

// sinkLoop writes finished sub-buffers in order and releases them for
// reuse (relay's subbufs_consumed). After a sink error it stops releasing,
// so the writer drops and counts instead of overwriting unwritten data.
func (b *buffer) sinkLoop() {
	defer b.ch.wg.Done()
	for {
		cn := b.consumed.Load()
		if cn == b.produced.Load() {
			select {
			case <-b.doorbell:
				continue
			case <-b.ch.quit:
				if cn == b.produced.Load() {
					return
				}
				continue
			}
		}
		slot := int(cn % b.n)
		if b.emit(b.mem[slot*b.size:(slot+1)*b.size], b.slotEvents[slot]) != nil {
			<-b.ch.quit
			return
		}
		b.release(cn + 1)
	}
}

// release hands the sub-buffers before cn back to the writer and wakes
// whoever waits for them (waitDrained).
func (b *buffer) release(cn uint64) {
	b.mu.Lock()
	b.consumed.Store(cn)
	b.cond.Broadcast()
	b.mu.Unlock()
	b.roomFreed()
}

// waitDrained waits until the sink has released every finished
// sub-buffer, or failed.
func (b *buffer) waitDrained() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.sinkErr == nil && b.consumed.Load() != b.produced.Load() {
		b.cond.Wait()
	}
	return b.sinkErr
}

// writeOut writes the finished sub-buffers to the sink and releases them,
// on the writer's goroutine: sinkLoop's work, for a local sink (Commit).
// After a sink error it writes and releases nothing more, as sinkLoop.
func (b *buffer) writeOut() {
	for cn := b.consumed.Load(); cn != b.produced.Load(); cn++ {
		slot := int(cn % b.n)
		if b.emit(b.mem[slot*b.size:(slot+1)*b.size], b.slotEvents[slot]) != nil {
			return
		}
		b.release(cn + 1)
	}
}

// emit hands one finished packet of events events to the sink. Before a
// stream's first packet, if that packet already counts discarded events,
// it writes an empty packet with a zero count (sequence number 0), because
// a CTF reader reports a loss only as the increase between two packets.
// It returns the sink's error, or the one it returned before.
func (b *buffer) emit(pkt []byte, events uint64) error {
	b.mu.Lock()
	err := b.sinkErr
	b.mu.Unlock()
	if err != nil {
		return err
	}
	openerOut := false
	if !b.opened && binary.LittleEndian.Uint64(pkt[offEventsDiscarded:]) != 0 {
		err = b.ch.sink.WritePacket(b.name, b.opener())
		openerOut = err == nil
	}
	if err == nil {
		err = b.ch.sink.WritePacket(b.name, pkt)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if openerOut {
		b.chunkBytes += uint64(b.size)
		b.chunkPackets++
	}
	if err != nil {
		b.sinkErr = fmt.Errorf("stream %s: %w", b.name, err)
		b.cond.Broadcast()
		b.ch.failOnce.Do(func() { close(b.ch.failed) })
		// No room will ever free: whoever waits for it finds out.
		b.roomFreed()
		return b.sinkErr
	}
	b.opened = true
	b.chunkBytes += uint64(len(pkt))
	b.chunkPackets++
	b.stats.Written++ // only the one that writes packets touches it
	b.wEvents += events
	b.wSeq = binary.LittleEndian.Uint64(pkt[offPacketSeqNum:])
	b.wEnd = binary.LittleEndian.Uint64(pkt[offTimestampEnd:])
	b.wDisc = binary.LittleEndian.Uint64(pkt[offEventsDiscarded:])
	return nil
}

// opener returns an empty packet with a zero discarded count at the
// stream's first timestamp, to go before a first packet that already
// counts losses: a CTF reader reports a loss only as the increase between
// two packets, so the losses show from the stream's start.
func (b *buffer) opener() []byte {
	o := make([]byte, b.size)
	h := b.hdr
	h.TimestampBegin, h.TimestampEnd = b.firstTS, b.firstTS
	h.ContentSize = PacketHeaderSize * 8
	PutPacketHeader(o, &h)
	return o
}

// writeFinal ends a stream whose sink failed with one last packet, when
// the sink can still take it (FinalSink): empty, numbered after the last
// packet the sink took and running from its end to the stream's last
// event, its events_discarded counting, on top of the stream's losses,
// every event the sink did not take. babeltrace2 then reports them as
// discarded at the end of the stream, where they were lost. A stream
// whose sink did not fail gets nothing. It returns the sink's error.
func (b *buffer) writeFinal() error {
	b.mu.Lock()
	failed, opened, written, seq, end, wDisc := b.sinkErr, b.opened, b.wEvents, b.wSeq, b.wEnd, b.wDisc
	b.mu.Unlock()
	if _, ok := b.ch.sink.(FinalSink); failed == nil || !ok {
		return nil
	}
	unwritten := b.unwritten(written)
	if unwritten == 0 && b.discarded-b.discBase == wDisc {
		return nil
	}
	var pkts [][]byte
	if !opened {
		pkts = append(pkts, b.opener())
		end = b.firstTS
	}
	h := b.hdr
	h.TimestampBegin, h.TimestampEnd = end, max(end, b.lastTS)
	h.ContentSize = PacketHeaderSize * 8
	h.SeqNum = seq + 1
	h.EventsDiscarded = b.discarded - b.discBase + unwritten
	p := make([]byte, b.size)
	PutPacketHeader(p, &h)
	pkts = append(pkts, p)
	if err := WriteFinal(b.ch.sink, b.name, pkts...); err != nil {
		return fmt.Errorf("stream %s: last packet, of the %d events lost: %w", b.name, h.EventsDiscarded, err)
	}
	return nil
}

// unwritten returns how many of the events put into the buffer's packets
// (finished or open) are not among the written ones the sink took.
func (b *buffer) unwritten(written uint64) uint64 {
	total := b.finished
	if b.cur != nil {
		total += b.events
	}
	return total - min(written, total)
}
