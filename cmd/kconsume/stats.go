package main

import (
	"fmt"
	"io"
	"sort"

	"github.com/kconsume/kconsume/relayfmt"
)

// streamStats counts one stream file of a trace.
type streamStats struct {
	events, lostEvents, lostPackets uint64
	first, last                     uint64
	byClass                         map[string]uint64
}

func statsCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("stats", "stats DIR\n\nCounts a trace's events per stream and per event, and what was lost.", "kconsume stats /tmp/trace", stderr)
	dir, err := oneDir(fs, args)
	if err != nil {
		return err
	}
	tr, err := relayfmt.Open(dir)
	if err != nil {
		return err
	}
	total := streamStats{byClass: map[string]uint64{}}
	// Times as report and babeltrace2 print them by default.
	cf := newClockFormat(tr.Meta.Clock, false, false, false)
	fmt.Fprintf(stdout, "%-8s %12s %12s %12s %22s %22s\n", "stream", "events", "lost-events", "lost-pkts", "first", "last")
	for _, name := range tr.Streams {
		sr, err := relayfmt.OpenStream(tr.Meta, tr.Dir+"/"+name)
		if err != nil {
			return err
		}
		st := streamStats{byClass: total.byClass}
		for sr.Next() {
			it := sr.Item()
			switch it.Kind {
			case relayfmt.DiscardedEvents:
				st.lostEvents += it.Count
			case relayfmt.DiscardedPackets:
				st.lostPackets += it.Count
			default:
				if st.events == 0 {
					st.first = it.Time
				}
				st.last = it.Time
				st.events++
				st.byClass[it.Class.Name]++
			}
		}
		err = sr.Err()
		sr.Close()
		if err != nil {
			return fmt.Errorf("%w (kconsume recover %s cuts damaged files back to their last whole packet)", err, dir)
		}
		fmt.Fprintf(stdout, "%-8s %12d %12d %12d %22s %22s\n", name, st.events, st.lostEvents, st.lostPackets, string(cf.appendTime(nil, st.first)), string(cf.appendTime(nil, st.last)))
		total.events += st.events
		total.lostEvents += st.lostEvents
		total.lostPackets += st.lostPackets
	}
	fmt.Fprintf(stdout, "%-8s %12d %12d %12d\n\n", "total", total.events, total.lostEvents, total.lostPackets)
	names := make([]string, 0, len(total.byClass))
	for n := range total.byClass {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return total.byClass[names[i]] > total.byClass[names[j]] || total.byClass[names[i]] == total.byClass[names[j]] && names[i] < names[j]
	})
	for _, n := range names {
		fmt.Fprintf(stdout, "%12d  %s\n", total.byClass[n], n)
	}
	if l := relaydNoteLine(dir); l != "" {
		fmt.Fprint(stdout, "\n"+l)
	}
	return nil
}
