package consumer

// losses accounts for the records lost before the consumer could write
// them, so that each loss is placed in the stream once, where it was
// noticed: per CPU, the kernel side's failed reservations or outputs
// (perf's own lost records are a part of them), and the recorder runs the
// kernel skipped (recursion misses), whose CPU is unknown. Losses inside
// the channel (full, overwritten, too large) are counted by relayfmt, and
// records the consumer cannot decode by their stream. It is used by the
// drainer goroutine alone.
type losses struct {
	w            *writer              // writes a notice that finds its window full
	kernelLost   func(cpu int) uint64 // the recorder's count of cpu's losses
	global       bool                 // one stream takes every CPU's losses
	filtered     bool                 // the recorder filters tasks: a miss may not be a loss
	placed       []uint64             // kernel-side losses placed so far, per CPU
	missedSeen   uint64               // recursion misses counted so far (CPUStats.Missed)
	missedPlaced uint64               // the part of them placed in stream 0
}

// newLosses returns the accounting of ncpu CPUs, which writes through w
// and reads the recorder's counts with kernelLost.
func newLosses(w *writer, ncpu int, filtered bool, kernelLost func(cpu int) uint64) *losses {
	return &losses{w: w, kernelLost: kernelLost, global: w != nil && w.global, filtered: filtered, placed: make([]uint64, ncpu)}
}

// placeKernel puts the kernel-side losses of st's CPUs not yet placed
// into its window after the newest record there, so they land where they
// happened.
func (l *losses) placeKernel(st *stream) {
	first, last := st.idx, st.idx
	if l.global {
		first, last = 0, len(l.placed)-1
	}
	for cpu := first; cpu <= last; cpu++ {
		if n := l.place(cpu, l.kernelLost(cpu)); n > 0 {
			l.push(st, n)
		}
	}
}

// placeMissed puts the recursion misses that were events lost and are
// not yet placed into st (stream 0: their CPU is unknown).
func (l *losses) placeMissed(st *stream, all, lost uint64) {
	if n := l.missed(all, lost); n > 0 {
		l.push(st, n)
	}
}

// push puts a notice of n lost records into st's window.
func (l *losses) push(st *stream, n uint64) {
	if st.win.full() {
		l.w.emit(st, st.win.pop())
	}
	st.win.push(entry{ts: st.win.last(), pos: n})
}

// place returns how many of the total losses counted for cpu so far are
// not yet placed, and takes them as placed now. A total below what was
// placed (a count that lags another, as perf's lags the recorder's)
// places nothing.
func (l *losses) place(cpu int, total uint64) uint64 {
	if total <= l.placed[cpu] {
		return 0
	}
	n := total - l.placed[cpu]
	l.placed[cpu] = total
	return n
}

// missed takes the recorder's recursion misses so far, all of them and
// those that were events lost, and returns how many of the lost are new
// and to be placed. With filters, a skipped run might have been filtered
// out, so misses are only counted (an upper bound), never placed.
func (l *losses) missed(all, lost uint64) uint64 {
	l.missedSeen = max(l.missedSeen, all)
	if l.filtered || lost <= l.missedPlaced {
		return 0
	}
	n := lost - l.missedPlaced
	l.missedPlaced = lost
	return n
}

// fill sets the counts losses keeps in out, indexed by CPU: the misses
// go to CPU 0, where they are placed.
func (l *losses) fill(out []CPUStats) {
	if len(out) == 0 {
		return
	}
	out[0].Missed = l.missedSeen
	out[0].missedPlaced = l.missedPlaced
}
