package consumer

import (
	"encoding/binary"

	"github.com/kconsume/kconsume/relayfmt"
)

// drain walks the ring in place, at most one lap. While no record waits
// in the stream's reorder window, records are written straight from the
// ring into the open sub-buffer as they are walked (walkOnce), every
// record read once; a record stamped before one already written sends the
// walk back to a checkpoint (rollback) and the window takes over. In the
// window, each record waits; when the window is full its oldest records
// are written, a sixteenth of it at a time, and once what waits is in
// ring order again it is all written out (catchUp) and the straight walk
// resumes. Ring space is released once per batch of a sixteenth of the
// ring, up to the oldest record still waiting or that a checkpoint may
// walk again.
func (r *ringbuf) drain(wr *writer, l *losses, st *stream, cutoff uint64) {
	w := st.win
	limit := r.cons + r.size // one lap per call, so other rings get their turn
	// Release space every sixteenth of the ring: a producer writing while
	// we drain sees the consumer position and must not find the ring full
	// because a whole lap was read before the first release.
	batch := r.size / 16
	room := max(1, len(w.buf)/16)
	for r.cons < limit {
		prod := min(r.producer(), r.cons+batch)
		if r.cons >= prod {
			break
		}
	walk:
		for {
			if r.cons >= st.replayEnd && (w.n == 0 || wr.catchUp(st)) {
				switch why, ts := wr.walkOnce(st, r, prod); why {
				case onceDone:
					break walk
				case onceLate:
					wr.rollback(st, r, ts, r.cons)
				}
			}
			switch why, e := fillWindow(r, w, prod); why {
			case fillDone:
				break walk
			case fillFull:
				for range room {
					wr.emit(st, w.pop())
				}
			case fillBad:
				wr.undecodable(st)
			case fillLate:
				if e.ts >= wr.ch.LastTS(st.idx) || !wr.rollback(st, r, e.ts, e.pos) {
					w.insert(e)
				}
			}
		}
		r.release(st.cps.releasePos(w.releasePos(r.cons)))
		if r.cons < prod {
			break // stopped at a record still being written
		}
	}
	l.placeKernel(st)
	for w.n > 0 && w.front().ts <= cutoff {
		wr.emit(st, w.pop())
	}
	wr.catchUp(st)
	st.cps.dropFinal(cutoff, wr.ch.LastTS(st.idx))
	r.release(st.cps.releasePos(w.releasePos(r.cons)))
}

// Why walkOnce returned.
const (
	onceDone  = iota // no finished record left before prod
	onceLate         // the record at r.cons is stamped before one written
	onceOther        // the record at r.cons goes through the window
)

// walkOnce writes the finished records of st's ring r before prod
// straight into the channel, in ring order, while each is stamped no
// earlier than the newest written and fits the open sub-buffer; st's
// window must be empty. Every cps.every records it takes a checkpoint. It
// returns at the first record it cannot write so, with the ring's walk at
// that record (and its timestamp when it is late): a late one, one that
// needs a new sub-buffer (which makes everything before it final, so it
// waits in the window past the reorder bound), one too short or long to
// be a record, or one it cannot decode (which the window counts where it
// leaves, after any late record stamped before it).
//
// A record of a class whose payload is the record as it is goes through a
// relayfmt.Run, inline; one whose layout is copies alone (a tracepoint
// without dynamic fields) has its runs copied into the room the Run
// reserves (classCache.putCopied); any other, or one the Run refuses,
// goes through write, with the Run synced around it. A global channel's Run takes nothing (its
// events carry their CPU), so walkWrite walks a global ring: a test for
// it in this loop cost the per-CPU drain a tenth of its speed.
func (w *writer) walkOnce(st *stream, r *ringbuf, prod uint64) (why int, late uint64) {
	if w.global {
		return w.walkWrite(st, r, prod)
	}
	cps := &st.cps
	data := r.data
	run := w.ch.Run(st.idx)
	defer run.Sync()
	cc := classCache{key: ^uint32(0)}
	for {
		pos := r.cons
		off, n, skip, ok := r.next(prod)
		if !ok {
			return onceDone, 0
		}
		if skip {
			continue
		}
		if n < uint32(recHdrLen) || uint64(n) > r.size {
			r.rewind(pos)
			return onceOther, 0
		}
		rec := kcRec(data[off : off+n : off+n])
		ts := rec.ts()
		if ts < run.LastTS() {
			r.rewind(pos)
			return onceLate, ts
		}
		if cps.left <= 0 {
			run.Sync()
			cps.push(checkpoint{mark: w.ch.Mark(st.idx), pos: pos, reordered: st.win.reordered})
		}
		if key, payload := w.directPayload(rec, &cc); (payload == nil || !run.Put(ts, key, payload)) && !cc.putCopied(w, &run, ts, key, rec) && !w.write(st, entry{ts: ts, pos: pos, off: off, n: n}, false, &run) {
			r.rewind(pos)
			return onceOther, 0
		}
		cps.left--
	}
}

// walkWrite is walkOnce writing every record through write.
func (w *writer) walkWrite(st *stream, r *ringbuf, prod uint64) (why int, late uint64) {
	cps := &st.cps
	data := r.data
	last := w.ch.LastTS(st.idx)
	for {
		pos := r.cons
		off, n, skip, ok := r.next(prod)
		if !ok {
			return onceDone, 0
		}
		if skip {
			continue
		}
		if n < uint32(recHdrLen) || uint64(n) > r.size {
			r.rewind(pos)
			return onceOther, 0
		}
		ts := binary.LittleEndian.Uint64(data[off:])
		if ts < last {
			r.rewind(pos)
			return onceLate, ts
		}
		if cps.left <= 0 {
			cps.push(checkpoint{mark: w.ch.Mark(st.idx), pos: pos, reordered: st.win.reordered})
		}
		if !w.write(st, entry{ts: ts, pos: pos, off: off, n: n}, false, nil) {
			r.rewind(pos)
			return onceOther, 0
		}
		last = ts
		cps.left--
	}
}

// rollback is called for a record stamped late, before the newest one
// written, at ring position pos. It undoes the channel's writes back to
// the newest checkpoint before which nothing is stamped later (or, when
// none is, the oldest that can still be undone), empties the window (its
// records come after the checkpoint) and moves the ring's walk back
// there, so that the window takes the records again and inserts the late
// one in its place. It reports false when no checkpoint can be undone,
// having only forgotten them: the late record is then written with its
// timestamp raised (Stats.Clamped), as when it comes after its place
// left the window.
func (w *writer) rollback(st *stream, r *ringbuf, late, pos uint64) bool {
	cps, win := &st.cps, st.win
	i := cps.n - 1
	for i > 0 && cps.at(i).mark.TS() > late {
		i--
	}
	for ; i >= 0 && i < cps.n; i++ {
		cp := cps.at(i)
		if !w.ch.Undo(cp.mark) {
			continue
		}
		for win.n > 0 {
			if e := win.pop(); e.n == 0 {
				w.emit(st, e) // a loss notice: not in the ring to walk again
			}
		}
		r.rewind(cp.pos)
		st.replayEnd = pos + 1
		win.newest, win.reordered = cp.mark.TS(), cp.reordered
		cps.truncate(i)
		st.rollbacks++
		return true
	}
	// A checkpoint that cannot be undone was taken in a sub-buffer that
	// is finished now, as were all the older ones.
	cps.clear()
	return false
}

// catchUp writes out every record waiting in st's window when they wait
// in ring order (no late record among them), behind a checkpoint at the
// first, and reports whether the window is empty then. It stops at a
// record that needs a new sub-buffer, or one it cannot decode: that one
// waits until the window writes it, past the reorder bound.
func (w *writer) catchUp(st *stream) bool {
	win := st.win
	if win.unsorted != 0 {
		return false
	}
	var cp checkpoint
	marked := false
	// As in walkOnce; a global channel's Run takes nothing, and starting
	// it again is not free.
	fast := !w.global
	var run relayfmt.Run
	if fast {
		run = w.ch.Run(st.idx)
	}
	defer run.Sync()
	cc := classCache{key: ^uint32(0)}
	for win.n > 0 {
		e := win.front()
		if e.n == 0 {
			run.Sync()
			w.emit(st, win.pop())
			if fast {
				run = w.ch.Run(st.idx)
			}
			continue
		}
		if !marked {
			run.Sync()
			cp = checkpoint{mark: w.ch.Mark(st.idx), pos: e.pos, reordered: win.reordered}
		}
		if fast {
			rec := kcRec(st.record(*e))
			if key, payload := w.directPayload(rec, &cc); (payload == nil || !run.Put(e.ts, key, payload)) && !cc.putCopied(w, &run, e.ts, key, rec) && !w.write(st, *e, false, &run) {
				return false
			}
		} else if !w.write(st, *e, false, nil) {
			return false
		}
		if !marked {
			st.cps.push(cp)
			marked = true
		}
		st.cps.left--
		win.pop()
	}
	return true
}

// Why fillWindow returned.
const (
	fillDone = iota // no finished record left before prod
	fillFull        // the window is full
	fillBad         // a record too short or too long to decode was skipped
	fillLate        // the returned record is older than the newest waiting
)

// fillWindow moves the finished records of r before prod into w, in ring
// order, while each is stamped no earlier than the newest waiting and w
// has room; it skips discarded records. It returns at the first record it
// cannot append, with the reason, so that the loop over the records calls
// nothing: Go spills every live register around a call, and a write
// between two records' walks made the walk reload its state each time.
func fillWindow(r *ringbuf, w *window, prod uint64) (why int, late entry) {
	data := r.data
	for w.n < len(w.buf) {
		pos := r.cons
		off, n, skip, ok := r.next(prod)
		if !ok {
			return fillDone, entry{}
		}
		if skip {
			continue
		}
		if n < uint32(recHdrLen) || uint64(n) > r.size {
			return fillBad, entry{}
		}
		e := entry{ts: binary.LittleEndian.Uint64(data[off:]), pos: pos, off: off, n: n}
		if e.ts < w.newest {
			return fillLate, e
		}
		w.append(e)
	}
	return fillFull, entry{}
}
