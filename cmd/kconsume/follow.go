package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kconsume/kconsume/profile"
	"github.com/kconsume/kconsume/relayfmt"
)

// followPeriod is how often report --follow looks for new packets.
const followPeriod = 200 * time.Millisecond

// followed is what report --follow printed of one stream file.
type followed struct {
	done int64 // bytes of whole packets printed
	last int64 // offset of the last packet printed, -1 before the first
}

// followTrace prints the events of a trace being written as its packets land:
// every followPeriod it reads the whole packets each stream file gained
// (a stream file only ever grows by whole packets), the metadata again
// when new event classes were added, and prints what they hold, sorted by
// time within each round. It waits for the trace to appear, and returns
// nil when ctx ends.
func followTrace(ctx context.Context, dir string, f *reportFilter, stdout io.Writer) error {
	w := bufio.NewWriterSize(stdout, 1<<16)
	streams := map[string]*followed{}
	type line struct {
		t    uint64
		text []byte
	}
	var batch []line
	tick := time.NewTicker(followPeriod)
	defer tick.Stop()
	for {
		tr, err := relayfmt.Open(dir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		batch = batch[:0]
		if tr != nil && f.clock == nil {
			f.setClock(tr.Meta.Clock)
			f.prof = profile.Detect(tr.Meta)
			if err := f.stacks.load(tr.Dir); err != nil {
				return err
			}
		}
		for _, name := range streamsOf(tr) {
			st := streams[name]
			if st == nil {
				st = &followed{last: -1}
				streams[name] = st
			}
			err := st.read(tr, name, func(it *relayfmt.Item) error {
				text, ok, err := f.format(nil, it)
				if ok {
					batch = append(batch, line{it.Time, text})
				}
				return err
			})
			if err != nil {
				return err
			}
		}
		slices.SortStableFunc(batch, func(a, b line) int {
			switch {
			case a.t < b.t:
				return -1
			case a.t > b.t:
				return 1
			}
			return 0
		})
		for _, l := range batch {
			if _, err := w.Write(l.text); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func streamsOf(tr *relayfmt.Trace) []string {
	if tr == nil {
		return nil
	}
	return tr.Streams
}

// read hands each item of the packets stream name gained since the last
// call to emit. It re-reads the last packet printed, without printing it
// again, so that the reader counts losses from it as it would in the
// whole file.
func (st *followed) read(tr *relayfmt.Trace, name string, emit func(*relayfmt.Item) error) error {
	file, err := os.Open(filepath.Join(tr.Dir, name))
	if err != nil {
		return err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return err
	}
	size := int64(tr.Meta.SubbufSize)
	whole := fi.Size() / size * size
	if whole <= st.done {
		return nil
	}
	start := st.done
	if st.last >= 0 {
		start = st.last
	}
	r := relayfmt.NewStreamReader(tr.Meta, name, io.NewSectionReader(file, start, whole-start), whole-start)
	for r.Next() {
		if _, off := r.Packet(); st.last >= 0 && off == 0 {
			continue
		}
		if err := emit(r.Item()); err != nil {
			return err
		}
	}
	if err := r.Err(); err != nil {
		return err
	}
	st.done, st.last = whole, whole-size
	return nil
}
