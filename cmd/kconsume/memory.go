package main

import (
	"flag"
	"fmt"
	"math/bits"
	"strings"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/relayfmt"
)

// The smallest buffers --memory hands out: a ring holds at least four of
// the largest records (tracefs.MaxRecordSize, 8 KiB, and their headers),
// a sub-buffer at least one with its packet header.
const (
	minMemRing   = 32 << 10
	minMemSubbuf = 16 << 10
	// minMemory is the smallest --memory: the smallest ring and two of
	// the smallest sub-buffers.
	minMemory = minMemRing + relayfmt.MinSubbufs*minMemSubbuf
	// memSubbufs is how many sub-buffers the rest is cut into, as in the
	// defaults (8 × 256 KiB), so one is written out while others fill.
	memSubbufs = 8
)

// splitMemory returns the BPF ring size and the sub-buffer geometry that
// share a per-CPU budget of bytes. The ring takes the largest power of
// two up to three quarters of it (at most consumer.MaxRingSize): records wait there whenever the
// consumer does not run, which under a saturating load is where they are
// lost first (sub-buffers only wait for the sink's write, which the
// consumer's own thread runs right after). The rest is cut into 8
// page-multiple sub-buffers of at least 16 KiB (fewer, and at least 2,
// when that does not fit). 6 MiB gives the defaults: a 4 MiB ring and
// 8 × 256 KiB. It fails when budget is under 64 KiB, which the smallest
// ring and two smallest sub-buffers need. What rounding leaves (less
// than a sub-buffer) is not used.
func splitMemory(budget int) (ring, subbufSize, nSubbufs int, err error) {
	if budget < minMemory {
		return 0, 0, 0, fmt.Errorf("--memory %d: at least %d KiB per CPU (a %d KiB ring and %d sub-buffers of %d KiB)",
			budget, minMemory>>10, minMemRing>>10, relayfmt.MinSubbufs, minMemSubbuf>>10)
	}
	ring = min(1<<(bits.Len(uint(budget*3/4))-1), consumer.MaxRingSize)
	for ring > minMemRing && budget-ring < relayfmt.MinSubbufs*minMemSubbuf {
		ring /= 2
	}
	rest := budget - ring
	subbufSize = min(rest/memSubbufs/relayfmt.PageSize*relayfmt.PageSize, relayfmt.MaxSubbufSize)
	if subbufSize < minMemSubbuf {
		subbufSize = minMemSubbuf
	}
	nSubbufs = min(rest/subbufSize, relayfmt.MaxSubbufs)
	return ring, subbufSize, nSubbufs, nil
}

// applyMemory sets the ring size and sub-buffer geometry from --memory
// when fs had it (budget > 0). It fails when --memory is too small, or
// given with one of the flags it sets.
func applyMemory(fs *flag.FlagSet, budget int, ring, subbufSize, nSubbufs *int) error {
	if budget == 0 {
		return nil
	}
	var clash []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "ring-size", "subbuf-size", "n-subbufs":
			clash = append(clash, "--"+f.Name)
		}
	})
	if len(clash) > 0 {
		return fmt.Errorf("--memory sets the ring and sub-buffer sizes: give it or %s, not both", strings.Join(clash, ", "))
	}
	var err error
	*ring, *subbufSize, *nSubbufs, err = splitMemory(budget)
	return err
}
