package consumer

// entry is a record waiting in a reorder window: still in its ring (or in
// a wrap copy), released only once it has been written out. It holds no
// pointer, so moving entries costs no write barrier and 24 bytes.
type entry struct {
	ts  uint64
	pos uint64 // ring position, to know how far the ring may be released; a loss notice's count
	off uint32 // where the record starts in its stream's data (wrapBit set: in a wrap copy)
	n   uint32 // record bytes, kc_rec header included; 0 for a loss notice
}

// wrapBit marks an entry whose record was copied out of a perf ring
// because it wrapped around the end; wrapIdx picks the copy buffer.
const (
	wrapBit = 1 << 31
	wrapIdx = 1 << 30
)

// window holds the newest records of one output stream sorted by time, so
// that a record that reached the ring late (a nested interrupt reserving
// after its clock read; CPUs interleaving in a shared ring) is written in
// its place. It is a circular array of a power-of-two capacity; records
// nearly always arrive in order and are appended at the tail.
type window struct {
	buf     []entry
	mask    int
	head, n int
	// newest is at least the newest timestamp waiting, when any waits: a
	// record stamped no earlier is appended without a search.
	newest    uint64
	reordered uint64 // records inserted before a later-stamped one
	// unsorted counts the pops until every entry that was in the window
	// at the last out-of-order insert has left; until then time order and
	// arrival (ring position) order may differ.
	unsorted int
}

func newWindow(capacity int) *window {
	c := 1
	for c < capacity {
		c <<= 1
	}
	return &window{buf: make([]entry, c), mask: c - 1}
}

func (w *window) full() bool { return w.n == len(w.buf) }

// push inserts e in time order; the window must not be full. Equal
// timestamps keep arrival order. The usual case, a record no older than
// the newest waiting, is appended inline.
func (w *window) push(e entry) {
	if e.ts >= w.newest {
		w.append(e)
	} else {
		w.insert(e)
	}
}

// append adds e at the tail: e is stamped no earlier than newest. Hot
// loops test that themselves and call it inline.
func (w *window) append(e entry) {
	w.buf[(w.head+w.n)&w.mask] = e
	w.n++
	w.newest = e.ts
}

// insert is push for a record older than the newest waiting one.
func (w *window) insert(e entry) {
	i := w.n
	w.n++
	for i > 0 {
		prev := &w.buf[(w.head+i-1)&w.mask]
		if prev.ts <= e.ts {
			break
		}
		w.buf[(w.head+i)&w.mask] = *prev
		i--
	}
	if i != w.n-1 {
		w.reordered++
		w.unsorted = w.n
	}
	w.buf[(w.head+i)&w.mask] = e
	w.newest = w.buf[(w.head+w.n-1)&w.mask].ts
}

// front returns the oldest entry; the window must not be empty.
func (w *window) front() *entry { return &w.buf[w.head] }

// pop removes the oldest entry.
func (w *window) pop() entry {
	e := w.buf[w.head]
	w.head = (w.head + 1) & w.mask
	w.n--
	if w.unsorted > 0 {
		w.unsorted--
	}
	return e
}

// releasePos returns how far the ring may be released: to the lowest
// ring position of a waiting record, or to read (all that was read) when
// none waits. Records enter a window in ring order, so while none waits
// out of time order the first record from the front has the lowest
// position; only after a reorder does it scan the whole window, which
// costs a live drain one pass per batch over up to ReorderMax entries.
func (w *window) releasePos(read uint64) uint64 {
	if w.unsorted == 0 {
		for i := 0; i < w.n; i++ {
			if e := &w.buf[(w.head+i)&w.mask]; e.n != 0 {
				return e.pos
			}
		}
		return read
	}
	pos, ok := read, false
	for i := 0; i < w.n; i++ {
		e := &w.buf[(w.head+i)&w.mask]
		if e.n != 0 && (!ok || e.pos < pos) {
			pos, ok = e.pos, true
		}
	}
	return pos
}

// last returns the newest timestamp in the window, or 0.
func (w *window) last() uint64 {
	if w.n == 0 {
		return 0
	}
	return w.buf[(w.head+w.n-1)&w.mask].ts
}
