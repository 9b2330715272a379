package consumer

import "github.com/kconsume/kconsume/relayfmt"

// checkpoint is a place in a stream's output that a drain writing records
// straight from the ring (walkOnce) can go back to when a late record
// turns up: the channel's mark, the ring position of the first record
// written after it, and what the stream had reached there.
type checkpoint struct {
	mark      relayfmt.Mark
	pos       uint64 // ring position to walk again from
	reordered uint64 // the window's count of reordered records at the mark
}

// checkpoints is a stream's circular list of checkpoints, oldest first.
// Records written after the oldest one can still be undone and written
// again in time order: the reorder window's bound, kept while the window
// itself stays empty. It keeps one every so many records, enough of them
// to reach ReorderMax records back; the ring is released only up to the
// oldest.
type checkpoints struct {
	buf     []checkpoint
	head, n int
	every   int // records between two checkpoints
	left    int // records to write before the next checkpoint
}

func newCheckpoints(reorderMax int) checkpoints {
	every := min(64, reorderMax)
	return checkpoints{buf: make([]checkpoint, reorderMax/every+1), every: every}
}

// at returns the i-th checkpoint, oldest first; i < n.
func (c *checkpoints) at(i int) *checkpoint { return &c.buf[(c.head+i)%len(c.buf)] }

// push adds the newest checkpoint, forgetting the oldest when full.
func (c *checkpoints) push(cp checkpoint) {
	if c.n == len(c.buf) {
		c.head = (c.head + 1) % len(c.buf)
		c.n--
	}
	*c.at(c.n) = cp
	c.n++
	c.left = c.every
}

// truncate forgets the i-th checkpoint and every newer one.
func (c *checkpoints) truncate(i int) { c.n = i }

// clear forgets every checkpoint: nothing written so far can be undone.
// The next record written takes a new one.
func (c *checkpoints) clear() { c.n, c.left = 0, 0 }

// dropFinal forgets the checkpoints that only records stamped no later
// than cutoff follow up to the next one (or up to last, the newest
// timestamp written, for the newest): those records are final, as
// records leaving the window by time are. When it forgets them all, the
// next record written takes a new one.
func (c *checkpoints) dropFinal(cutoff, last uint64) {
	for c.n > 0 {
		next := last
		if c.n > 1 {
			next = c.at(1).mark.TS()
		}
		if next > cutoff {
			return
		}
		c.head = (c.head + 1) % len(c.buf)
		c.n--
	}
	c.left = 0
}

// releasePos returns how far the ring may be released for the
// checkpoints: to the oldest one's position, or read when there is none.
func (c *checkpoints) releasePos(read uint64) uint64 {
	if c.n == 0 {
		return read
	}
	return min(read, c.at(0).pos)
}
