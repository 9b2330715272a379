package consumer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/mounts"
)

// A recording killed (SIGKILL, a crash, the OOM killer) leaves its
// stream files cut off after their last whole packet; the events it had
// made but not yet written die with the process, and so would the
// counts that say how many there were. So that kconsume recover can
// count them as discarded, a recording pins in the BPF filesystem what
// outlives its process there: kc_state (the writers' per-CPU counts),
// the kc_area rings in packet mode, and its ledger, a small array the
// drainer keeps of what it took out of the rings. A note in the trace
// directory (CrashNote) names the pins; Close removes both.

// CrashNote is the file, in a recording's directory, that names what a
// recording killed before its end left for kconsume recover. A dot-file:
// CTF readers pass over it.
const CrashNote = ".recording"

// pinRoot is the directory, in the BPF filesystem, of the pins of
// recordings still running or killed and not yet recovered.
const pinRoot = "kconsume"

// What a recording's counts are in its note, which decides how recover
// reckons the events made: the writers count records (ring buffers,
// perf buffers), the packets in the rings count theirs (packet mode), or
// nothing counts them (kc_area record rings).
const (
	countsRecords = "records"
	countsPackets = "packets"
	countsArea    = "area"
)

// crashNote is CrashNote's content.
type crashNote struct {
	Pins     string `json:"pins"`   // the pin directory
	Counts   string `json:"counts"` // countsRecords, countsPackets, countsArea
	CPUs     int    `json:"cpus"`
	Global   bool   `json:"global"`
	RingSize uint64 `json:"ring_size,omitempty"` // packet mode: each CPU's ring
	PktElem  uint64 `json:"packet_size,omitempty"`
}

// The ledger's slot of one CPU, eight words: two copies of what the
// drainer took out of the CPU's packet ring (the events, and the ring's
// position after them), the word that says which copy is whole, the
// losses the drainer placed in the CPU's stream that no writer counted
// (recursion misses, stream 0), and the events and losses of the
// stream's closed chunks (a rotated trace: the stream files hold the
// current chunk's alone).
const (
	ledgerWhich = 0
	ledgerCopy  = 1 // words 1-2 and 3-4: got, cons
	ledgerExtra = 5
	ledgerBase  = 6
	ledgerWords = 8
)

// crashKeep is what a recording keeps for kconsume recover: the pins,
// the mapped ledger and the note. The drainer owns one from the start,
// and its sources write into it; the zero value keeps nothing until
// start.
type crashKeep struct {
	pins   string
	note   string
	ledger *ebpf.Map
	mem    []byte
}

// start pins rec's counts under the BPF filesystem and writes the note
// into dir. It returns why not when the BPF filesystem or the note
// cannot be had; a recording then goes on, k keeps nothing, and a kill
// of it loses what it held uncounted.
func (k *crashKeep) start(rec *recorder.Recorder, dir string) error {
	bpffs, _, err := mounts.BPFFS()
	if err != nil {
		return err
	}
	note := crashNote{Counts: countsRecords, CPUs: rec.CPUs(), Global: rec.Global()}
	switch {
	case rec.On(recorder.PathPackets):
		note.Counts, note.RingSize, note.PktElem = countsPackets, uint64(rec.RingBytes()), uint64(rec.PktElem())
	case rec.On(recorder.PathOwnRings):
		note.Counts, note.RingSize = countsArea, uint64(rec.RingBytes())
	}
	k.pins = filepath.Join(bpffs, pinRoot, strconv.Itoa(os.Getpid())+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	k.note = filepath.Join(dir, CrashNote)
	note.Pins = k.pins
	if err := k.pin(rec); err != nil {
		k.release()
		return err
	}
	b, err := json.Marshal(note)
	if err == nil {
		err = os.WriteFile(k.note, append(b, '\n'), 0o644)
	}
	if err != nil {
		k.release()
		return fmt.Errorf("writing %s: %w", CrashNote, err)
	}
	return nil
}

// on reports whether k keeps the ledger: start succeeded and release
// has not run.
func (k *crashKeep) on() bool { return k != nil && k.mem != nil }

// pin creates and maps the ledger and pins it, kc_state and, in packet
// mode, kc_area into k.pins.
func (k *crashKeep) pin(rec *recorder.Recorder) error {
	if err := os.MkdirAll(k.pins, 0o700); err != nil {
		return fmt.Errorf("pinning the recorder's counts: %w", err)
	}
	var err error
	k.ledger, err = ebpf.NewMap(&ebpf.MapSpec{
		Name:       "kc_ledger",
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  ledgerWords * 8,
		MaxEntries: uint32(rec.CPUs()),
		Flags:      unix.BPF_F_MMAPABLE,
	})
	if err != nil {
		return fmt.Errorf("the recorder's ledger: %w", err)
	}
	if k.mem, err = unix.Mmap(k.ledger.FD(), 0, roundPage(rec.CPUs()*ledgerWords*8), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("mapping the recorder's ledger: %w", err)
	}
	pins := rec.Maps()
	pins["ledger"] = k.ledger
	for name, m := range pins {
		if err := m.Pin(filepath.Join(k.pins, name)); err != nil {
			return fmt.Errorf("pinning the recorder's %s: %w", name, err)
		}
	}
	return nil
}

// word returns word i of cpu's ledger slot.
func (k *crashKeep) word(cpu, i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&k.mem[(cpu*ledgerWords+i)*8]))
}

// took records that the drainer has taken got events out of cpu's
// packet ring so far, up to ring position cons (in a kc_area ring of
// records, the records released so far, up to cons). It writes the copy not
// in use, then switches to it, so that a kill at any point leaves one
// whole copy. Nil-safe; the drainer goroutine alone calls it.
func (k *crashKeep) took(cpu int, got, cons uint64) {
	if k == nil || k.mem == nil {
		return
	}
	next := 1 - atomic.LoadUint64(k.word(cpu, ledgerWhich))
	atomic.StoreUint64(k.word(cpu, ledgerCopy+2*int(next)), got)
	atomic.StoreUint64(k.word(cpu, ledgerCopy+2*int(next)+1), cons)
	atomic.StoreUint64(k.word(cpu, ledgerWhich), next)
}

// placed records that n losses no writer counted are in cpu's stream so
// far. Nil-safe.
func (k *crashKeep) placed(cpu int, n uint64) {
	if k == nil || k.mem == nil {
		return
	}
	atomic.StoreUint64(k.word(cpu, ledgerExtra), n)
}

// based records that stream n's closed chunks hold n events and losses
// (Rotate). Nil-safe.
func (k *crashKeep) based(stream int, n uint64) {
	if k == nil || k.mem == nil {
		return
	}
	atomic.StoreUint64(k.word(stream, ledgerBase), n)
}

// release removes the note and the pins and unmaps the ledger: the
// recording ended and its trace says what it lost. Nil-safe.
func (k *crashKeep) release() {
	if k == nil {
		return
	}
	_ = os.Remove(k.note)
	_ = os.RemoveAll(k.pins)
	if k.mem != nil {
		_ = unix.Munmap(k.mem)
		k.mem = nil
	}
	if k.ledger != nil {
		_ = k.ledger.Close()
		k.ledger = nil
	}
}

// roundPage returns n rounded up to a whole number of pages, the length
// of a mapping.
func roundPage(n int) int {
	p := os.Getpagesize()
	return (n + p - 1) / p * p
}
