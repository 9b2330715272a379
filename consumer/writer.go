package consumer

import (
	"encoding/binary"
	"fmt"

	"github.com/kconsume/kconsume/consumer/layout"

	"github.com/kconsume/kconsume/relayfmt"
)

// writer turns records into events of the channel: it knows each class's
// layout (by event key, which is the class id), writes a record whose
// payload is the record as it is (a direct layout) without a copy of its
// own, transcodes the others, and counts what it cannot decode. It is
// used by the drainer goroutine alone, except for declare before the
// drainer starts.
type writer struct {
	ch      *relayfmt.Channel
	global  bool             // one buffer for every CPU: events carry their CPU
	layouts []*layout.Layout // by class id
	direct  []int32          // by class id: a direct layout's payload size, else -1
	copied  []copied         // by class id: a layout of copies alone, else zero
	// streamCtx is the bytes of the stream's event context
	// (Config.ContextsInStream), which every payload starts with: a
	// layout's tail gives them, zeros stand in for the others.
	streamCtx int
}

// copied is a layout whose payload is the record's inline runs alone
// (ops all opCopy; a tracepoint without dynamic fields but with holes
// between its fields): out bytes of payload, from a raw record of at
// least need bytes.
type copied struct {
	ops       []layout.Op
	out, need int
	// adj, with ops nil, is a layout of copies and deltas (Adjust.Delta):
	// putCopied takes it apart, so the paths of copies alone do not look.
	adj *adjusted
}

// adjusted is a layout of copies and deltas: the runs are copied, then
// each add's delta is added to the u32 at its offset in the payload.
type adjusted struct {
	runs, adds []layout.Op
	out, need  int
}

// declare adds the event class name with fields to the channel and
// records its layout; it returns the class id, or the channel's error.
func (w *writer) declare(name string, fields []relayfmt.Field, l *layout.Layout) (uint32, error) {
	cls, err := w.ch.AddEventClass(name, fields)
	if err != nil {
		return 0, fmt.Errorf("event %s: %w", name, err)
	}
	w.setLayout(cls.ID, l)
	return cls.ID, nil
}

// declareAll adds one event class per layout, ls[i] named names[i], to
// the channel in one metadata write and records their layouts; it returns
// the class ids in order, or the channel's error (then none is added).
func (w *writer) declareAll(names []string, ls []*layout.Layout) ([]uint32, error) {
	fields := make([][]relayfmt.Field, len(ls))
	for i, l := range ls {
		fields[i] = l.Fields
		if w.streamCtx > 0 && l.Tailed() {
			// The channel declares them for every class.
			fields[i] = l.Fields[len(l.Ctx):]
		}
	}
	classes, err := w.ch.AddEventClasses(names, fields)
	if err != nil {
		return nil, fmt.Errorf("declaring %d events: %w", len(names), err)
	}
	ids := make([]uint32, len(classes))
	for i, cls := range classes {
		w.setLayout(cls.ID, ls[i])
		ids[i] = cls.ID
	}
	return ids, nil
}

// setLayout records the layout of class id.
func (w *writer) setLayout(id uint32, l *layout.Layout) {
	for uint32(len(w.layouts)) <= id {
		w.layouts = append(w.layouts, nil)
		w.direct = append(w.direct, -1)
		w.copied = append(w.copied, copied{})
	}
	w.layouts[id] = l
	w.direct[id] = -1
	w.copied[id] = copied{}
	if l == nil || l.AsIs || w.streamCtx > 0 {
		return // the fast paths write no stream context
	}
	if l.Direct {
		w.direct[id] = int32(l.Fixed)
		return
	}
	c := copied{ops: l.Ops, need: l.Fixed}
	var a adjusted
	for _, o := range l.Ops {
		switch o.Kind {
		case layout.OpCopy:
			c.out += o.N
			c.need = max(c.need, o.Off+o.N)
			// Runs the deltas cut apart are one again.
			if k := len(a.runs) - 1; k >= 0 && a.runs[k].Off+a.runs[k].N == o.Off {
				a.runs[k].N += o.N
				continue
			}
			a.runs = append(a.runs, o)
		case layout.OpAdd:
			// o.off counts back from the payload written so far.
			a.adds = append(a.adds, layout.Op{Kind: layout.OpAdd, Off: c.out - o.Off, N: o.N})
		default:
			return
		}
	}
	if a.adds != nil {
		a.out, a.need = c.out, c.need
		w.copied[id] = copied{adj: &a}
		return
	}
	w.copied[id] = c
}

// directPayload returns the class id of rec, a record of at least
// recHdrLen bytes, and its payload when its class's layout is the record's
// bytes as they are (layout.direct, the usual case, decoded here inline);
// a nil payload otherwise. c remembers the last class it looked up.
//
// It reads kc_rec's key and len itself, not through kcRec's accessors:
// those cost the inliner a few units more, and inlined into the drain's
// loops it saves a call per record.
func (w *writer) directPayload(rec kcRec, c *classCache) (uint32, []byte) {
	key := binary.LittleEndian.Uint32(rec[8:])
	n := int(binary.LittleEndian.Uint16(rec[12:]))
	if key != c.key {
		c.lookup(w, key)
	}
	if uint(c.size) > uint(n) || recHdrLen+n > len(rec) { // a size of -1 is above any n
		return key, nil
	}
	return key, rec[recHdrLen : recHdrLen+c.size]
}

// classCache is the last class a drain loop met, its payload size when
// its layout is direct (else -1) and its copies when its layout is
// copied: a run of records of one class reads no table.
//
// The copies are looked up apart (ckey), by putCopied: in lookup they
// would raise directPayload's inline cost over the budget, and the
// direct path would pay a call per record.
type classCache struct {
	key  uint32
	size int
	ckey uint32 // 1 + the class whose copies are cached; 0: none
	copied
}

func (c *classCache) lookup(w *writer, key uint32) {
	c.key, c.size = key, -1
	if uint64(key) < uint64(len(w.direct)) {
		c.size = int(w.direct[key])
	}
}

// putCopied writes rec, a record of class key with timestamp ts, through
// run when the class's layout is copied (or adjusted: copied, then its
// deltas added): its runs are copied straight into the open sub-buffer,
// the payload written once, as transcode would have built it. It reports
// false, having written nothing, for any other layout, a record too short
// for its layout, or an event run refuses; write then takes the record,
// and counts what it cannot decode.
func (c *classCache) putCopied(w *writer, run *relayfmt.Run, ts uint64, key uint32, rec kcRec) bool {
	if c.ckey != key+1 {
		c.ckey, c.copied = key+1, copied{}
		if uint64(key) < uint64(len(w.copied)) {
			c.copied = w.copied[key]
		}
	}
	if c.ops == nil {
		if c.adj != nil {
			return c.adj.put(run, ts, key, rec)
		}
		return false
	}
	n := rec.size()
	if n < c.need || recHdrLen+n > len(rec) {
		return false
	}
	dst := run.Reserve(ts, key, c.out)
	if dst == nil {
		return false
	}
	raw := rec[recHdrLen : recHdrLen+n]
	for _, o := range c.ops {
		dst = dst[copy(dst, raw[o.Off:o.Off+o.N]):]
	}
	return true
}

// put is putCopied for an adjusted layout: the runs copied into the open
// sub-buffer, then the deltas added in place. It reports false, having
// written nothing, for a record too short or one run refuses.
func (a *adjusted) put(run *relayfmt.Run, ts uint64, key uint32, rec kcRec) bool {
	n := rec.size()
	if n < a.need || recHdrLen+n > len(rec) {
		return false
	}
	dst := run.Reserve(ts, key, a.out)
	if dst == nil {
		return false
	}
	raw := rec[recHdrLen : recHdrLen+n]
	p := dst
	for _, o := range a.runs {
		p = p[copy(p, raw[o.Off:o.Off+o.N]):]
	}
	for _, o := range a.adds {
		v := dst[o.Off : o.Off+4]
		binary.LittleEndian.PutUint32(v, binary.LittleEndian.Uint32(v)+uint32(o.N))
	}
	return true
}

// emit writes one waiting entry into the channel. Records the channel
// cannot take are counted there (dropped, invalid) and reported in the
// stream; a record this consumer cannot decode counts as undecodable.
func (w *writer) emit(st *stream, e entry) { w.write(st, e, true, nil) }

// write is emit, and with open false what the channel's Append does: it
// returns false, having written nothing, when the record needs a new
// sub-buffer. With run set (a Run on st's buffer) it writes through the
// Run, open false: the drain's path for a record its inline path does
// not take, which may still fit the Run once decoded (a transcoded one).
// Such a caller also gets false, nothing counted, for a record it cannot
// decode: it hands the record to the window, as it does one that needs
// the next sub-buffer, and the window counts it where it leaves, so that
// a record stamped before it and met after it still finds its place
// (counted, it could not be walked again). An entry of length 0 is a
// loss notice: its pos counts the records lost. The record is decoded
// here, not in a function of its own: a second call per record cost the
// perf drain 5 %.
func (w *writer) write(st *stream, e entry, open bool, run *relayfmt.Run) bool {
	if e.n == 0 {
		_ = w.ch.Discard(st.idx, e.pos)
		return true
	}
	rec := kcRec(st.record(e))
	key, n := rec.key(), rec.size()
	cpu := st.idx
	if w.global {
		cpu = rec.cpu()
	}
	if recHdrLen+n > len(rec) || uint64(key) >= uint64(len(w.layouts)) || w.layouts[key] == nil {
		return w.undecodableIn(st, run)
	}
	raw := rec[recHdrLen : recHdrLen+n]
	l := w.layouts[key]
	var payload []byte
	if l.AsIs {
		payload = raw
	} else if l.Direct {
		if n < l.Fixed {
			return w.undecodableIn(st, run)
		}
		payload = raw[:l.Fixed]
	} else {
		var ok bool
		if st.scratch, ok = l.Transcode(st.scratch[:0], raw); !ok {
			return w.undecodableIn(st, run)
		}
		payload = st.scratch
	}
	if w.streamCtx > 0 && len(l.Ctx) == 0 {
		// Zeros stand in for the contexts of an event the recorder
		// wrote none for.
		st.ctxScratch = append(append(st.ctxScratch[:0], make([]byte, w.streamCtx)...), payload...)
		payload = st.ctxScratch
	}
	// A record the channel rejects is counted there.
	if run != nil {
		if run.Put(e.ts, key, payload) {
			return true
		}
		written, _ := run.Append(e.ts, key, payload)
		return written
	}
	if open {
		_ = w.ch.Write(cpu, e.ts, key, payload)
		return true
	}
	written, _ := w.ch.Append(cpu, e.ts, key, payload)
	return written
}

// undecodable counts a record the consumer cannot decode and writes it
// into the stream as discarded at this place.
func (w *writer) undecodable(st *stream) {
	// Walked again after a rollback, it would be counted twice.
	st.cps.clear()
	st.undecodable++
	_ = w.ch.Discard(st.idx, 1)
}

// undecodableIn is write's answer for a record it cannot decode: false
// for a caller with a Run, which leaves the record to the window; else
// the record counted (undecodable), and true.
func (w *writer) undecodableIn(st *stream, run *relayfmt.Run) bool {
	if run != nil {
		return false
	}
	w.undecodable(st)
	return true
}
