package consumer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/relayfmt"
)

// KilledStream is what RecoverKilled found in one stream of a recording
// killed before its end: the events its recorder made for the stream
// (those it wrote or counted lost included), those in the file or counted
// there, and the difference, now counted as discarded at its end.
type KilledStream struct {
	Stream      string
	Made, Found uint64
	// Rescued are the events of Found that were still in the recorder's
	// ring, written into the stream now.
	Rescued uint64
	Lost    uint64
}

// KilledReport is what RecoverKilled did to a trace.
type KilledReport struct {
	Streams []KilledStream
	// Uncounted, when not empty, says why the events the recording lost
	// at its kill could not be counted.
	Uncounted string
}

// RecoverKilled counts, in the trace in dir of a recording killed before
// its end, the events its recorder made that are neither in a stream file
// nor counted there, and ends each stream that lost some with an empty
// packet that counts them as discarded; then it removes what the
// recording had pinned and its note. Run it after relayfmt.Recover has
// cut the files back to whole packets. It returns nil when dir has no
// note (the recording ended, or was recovered already). A note whose
// pins are gone (the machine restarted) gives a report that says the
// loss is uncounted. It fails when the pins or the trace cannot be read
// or a file cannot be written; the note is then kept.
func RecoverKilled(dir string) (*KilledReport, error) {
	t, err := relayfmt.Open(dir)
	if err != nil {
		return nil, err
	}
	notePath := filepath.Join(t.Dir, CrashNote)
	b, err := os.ReadFile(notePath)
	if errors.Is(err, os.ErrNotExist) && dir != t.Dir {
		notePath = filepath.Join(dir, CrashNote)
		b, err = os.ReadFile(notePath)
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	var note crashNote
	if err := json.Unmarshal(b, &note); err != nil {
		return nil, fmt.Errorf("recover: %s is not a recording's note: %w", notePath, err)
	}
	if note.Pins == "" || note.CPUs <= 0 {
		return nil, fmt.Errorf("recover: %s is not a recording's note: no pins or no CPUs", notePath)
	}
	rep := &KilledReport{}
	made, left, why, err := madeCounts(note)
	switch {
	case err != nil:
		return nil, fmt.Errorf("recover: %w", err)
	case why != "":
		rep.Uncounted = why
	default:
		if rep.Streams, err = countKilled(t, made, left); err != nil {
			return nil, fmt.Errorf("recover: %w", err)
		}
	}
	_ = os.RemoveAll(note.Pins)
	if err := os.Remove(notePath); err != nil {
		return rep, fmt.Errorf("recover: %w", err)
	}
	return rep, nil
}

// countKilled writes into each stream the packets left in its ring,
// compares made, the events made per stream number, with what the stream
// then holds, and appends the difference as discarded.
func countKilled(t *relayfmt.Trace, made []uint64, left [][]ringPacket) ([]KilledStream, error) {
	var out []KilledStream
	for n, m := range made {
		ks, err := countStream(t, n, m, left[n])
		if err != nil {
			return out, err
		}
		if ks.Made > 0 || ks.Found > 0 {
			out = append(out, ks)
		}
	}
	return out, nil
}

// countStream does countKilled's work for stream n.
func countStream(t *relayfmt.Trace, n int, made uint64, left []ringPacket) (KilledStream, error) {
	a, err := relayfmt.OpenAppender(t, n)
	if err != nil {
		return KilledStream{}, err
	}
	ks := KilledStream{Stream: relayfmt.StreamFile(n, t.Meta.Global), Made: made}
	for _, p := range left {
		// A packet the stream cannot take stays out, its events
		// counted lost below.
		if p.data == nil {
			continue
		}
		err := a.Packet(p.data, p.events)
		if err == nil {
			ks.Rescued += p.events
		} else if !errors.Is(err, relayfmt.ErrBadPacket) {
			_ = a.Close()
			return ks, err
		}
	}
	st := a.Tally()
	ks.Found = st.Events + st.Discarded
	if made > ks.Found {
		ks.Lost = made - ks.Found
		if err := a.Discarded(ks.Lost); err != nil {
			_ = a.Close()
			return ks, err
		}
	}
	return ks, a.Close()
}

// ringPacket is a packet left in a packet-mode ring.
type ringPacket struct {
	data   []byte
	events uint64
}

// madeCounts reads the pinned counts of note's recording and returns the
// events made per stream number and the packets left in each stream's
// ring, or why the counts are unknown.
func madeCounts(note crashNote) (made []uint64, left [][]ringPacket, why string, err error) {
	if note.Counts != countsRecords && note.Counts != countsPackets && note.Counts != countsArea {
		return nil, nil, fmt.Sprintf("its counts are of a kind this kconsume does not know (%q)", note.Counts), nil
	}
	state, err := ebpf.LoadPinnedMap(filepath.Join(note.Pins, "state"), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Sprintf("its counts are gone from %s (the machine restarted?)", note.Pins), nil
	}
	if err != nil {
		return nil, nil, "", fmt.Errorf("the recording's counts: %w", err)
	}
	defer state.Close()
	ledger, err := ebpf.LoadPinnedMap(filepath.Join(note.Pins, "ledger"), nil)
	if err != nil {
		return nil, nil, "", fmt.Errorf("the recording's ledger: %w", err)
	}
	defer ledger.Close()
	made = make([]uint64, note.CPUs)
	left = make([][]ringPacket, note.CPUs)
	// What each stream's closed chunks hold (a rotated trace) is not in
	// its files, which hold the current chunk alone.
	base := make([]uint64, note.CPUs)
	defer func() {
		if !note.Global {
			for i := range made {
				made[i] -= min(made[i], base[i])
			}
		}
	}()
	for cpu := range made {
		var cs [2]gen.RingbufKcCpuState
		for i, slot := range []int{cpu, note.CPUs + cpu} {
			if err := state.Lookup(uint32(slot), &cs[i]); err != nil {
				return nil, nil, "", fmt.Errorf("the recording's counts of CPU %d: %w", cpu, err)
			}
		}
		var l [ledgerWords]uint64
		if err := ledger.Lookup(uint32(cpu), &l); err != nil {
			return nil, nil, "", fmt.Errorf("the recording's ledger of CPU %d: %w", cpu, err)
		}
		made[cpu] = cs[0].Lost + cs[1].Lost + l[ledgerExtra]
		base[cpu] = l[ledgerBase]
		if note.Counts == countsRecords {
			made[cpu] += cs[0].Emitted + cs[1].Emitted
			continue
		}
		got, cons := l[ledgerCopy+2*l[ledgerWhich]], l[ledgerCopy+2*l[ledgerWhich]+1]
		made[cpu] += got
		if note.Counts == countsArea {
			if cpu == 0 || !note.Global {
				n, err := recordsLeft(note, cpu, cons, cs[0].Prod)
				if err != nil {
					return nil, nil, "", err
				}
				made[cpu] += n
			}
			continue
		}
		if left[cpu], err = packetsLeft(note, cpu, cons, cs[0].Prod, cs[0].Last); err != nil {
			return nil, nil, "", err
		}
		for _, p := range left[cpu] {
			made[cpu] += p.events
		}
	}
	if !note.Global {
		return made, left, "", nil
	}
	var all uint64
	for _, n := range made {
		all += n
	}
	return []uint64{all - min(all, base[0])}, [][]ringPacket{nil}, "", nil
}

// packetsLeft returns the packets of cpu's pinned packet ring from
// position cons to prod, which the drainer had not taken, the open one
// closed at last, the time of its last record. The writers ended with the
// recording's process, so every commit word is final; a packet whose
// commit word does not cover its bytes comes back without data, its
// events only counted.
func packetsLeft(note crashNote, cpu int, cons, prod, last uint64) ([]ringPacket, error) {
	if prod <= cons {
		return nil, nil
	}
	ring, esize := note.RingSize, note.PktElem
	if ring == 0 || esize < relayfmt.PacketHeaderSize || ring%esize != 0 || esize&(esize-1) != 0 || prod-cons > ring {
		return nil, fmt.Errorf("the packet ring of CPU %d: positions %d to %d in a ring of %d bytes of %d-byte packets", cpu, cons, prod, ring, esize)
	}
	mem, err := mapRings(note)
	if err != nil {
		return nil, err
	}
	defer unix.Munmap(mem)
	le := binary.LittleEndian
	var out []ringPacket
	for pos := cons &^ (esize - 1); pos < prod; pos += esize {
		at := uint64(cpu)*ring + pos&(ring-1)
		e := mem[at : at+esize]
		cw := le.Uint64(e[recorder.PktCommit:])
		p := ringPacket{events: cw >> 32}
		used := min(prod-pos, esize)
		if uint64(uint32(cw)) == used {
			p.data = append([]byte(nil), e...)
			if used < esize {
				begin := le.Uint64(p.data[pktBegin:])
				le.PutUint64(p.data[pktEnd:], max(begin, last))
				le.PutUint64(p.data[pktContent:], used*8)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// recordsLeft returns the records, padding not counted, of ring's pinned
// kc_area ring from position cons to prod: those not yet released to the
// writers when the recording was killed.
func recordsLeft(note crashNote, ring int, cons, prod uint64) (uint64, error) {
	size := note.RingSize
	if prod <= cons {
		return 0, nil
	}
	if size < rbHdrLen || size&(size-1) != 0 || prod-cons > size || cons%rbHdrLen != 0 {
		return 0, fmt.Errorf("the record ring of CPU %d: positions %d to %d in a ring of %d bytes", ring, cons, prod, size)
	}
	mem, err := mapRings(note)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(mem)
	return areaRecords(mem[uint64(ring)*size:uint64(ring+1)*size], size-1, cons, prod), nil
}

// mapRings maps note's pinned kc_area rings, read-only.
func mapRings(note crashNote) ([]byte, error) {
	area, err := ebpf.LoadPinnedMap(filepath.Join(note.Pins, "area"), nil)
	if err != nil {
		return nil, fmt.Errorf("the recording's rings: %w", err)
	}
	defer area.Close()
	mem, err := unix.Mmap(area.FD(), 0, roundPage(int(note.RingSize)*note.CPUs), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping the recording's rings: %w", err)
	}
	return mem, nil
}
