package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/kconsume/kconsume/chunks"
	"github.com/kconsume/kconsume/consumer"
)

func totals(stats []consumer.CPUStats) (records, bytes, discarded uint64) {
	for _, c := range stats {
		records += c.Channel.Records
		bytes += c.Channel.Bytes
		discarded += c.Discarded()
	}
	return
}

// status rewrites the live line on the terminal.
func (r *recordRun) status() {
	stats, err := r.s.Stats()
	if err != nil {
		return
	}
	records, bytes, discarded := totals(stats)
	now := time.Now()
	rate := float64(records-r.lastRecords) / now.Sub(r.lastTick).Seconds()
	r.lastRecords, r.lastTick = records, now
	fmt.Fprintf(r.stderr, "\r\033[K%s  %s events/s  %s written  %d discarded", now.Sub(r.start).Truncate(time.Second), human(rate), humanBytes(bytes), discarded)
}

// lossTotals are the losses of every CPU, by layer.
type lossTotals struct {
	kernel, missed, missedPlaced, dropped, over, unread, disk uint64
}

// cpuTable prints a row for each CPU that saw an event or lost one, and
// sums the losses of every CPU.
func cpuTable(w io.Writer, stats []consumer.CPUStats) lossTotals {
	fmt.Fprintf(w, "%-5s %12s %12s %12s %12s %12s %12s %10s\n", "cpu", "events", "ring-lost", "missed", "dropped", "overwritten", "invalid", "reordered")
	var l lossTotals
	for _, c := range stats {
		l.unread += c.UserUnread
		if c.Emitted == 0 && c.Channel.Records == 0 && c.Discarded() == 0 && c.Missed == 0 {
			continue
		}
		fmt.Fprintf(w, "%-5d %12d %12d %12d %12d %12d %12d %10d\n", c.CPU, c.Channel.Records, c.KernelLost, c.Missed, c.Channel.Dropped, c.Channel.Overwritten, c.Channel.Invalid+c.Channel.TooLarge+c.Undecodable, c.Reordered)
		l.kernel += c.KernelLost
		l.missed += c.Missed
		l.missedPlaced += c.MissedPlaced()
		l.dropped += c.Channel.Dropped
		l.over += c.Channel.Overwritten
		l.disk += c.Channel.Unwritten
	}
	return l
}

// missedNote says what the kernel's skipped runs of the recorder cost:
// exactly the events placed in the trace when every skip was placed, at
// most the skips otherwise.
func missedNote(w io.Writer, missed, placed uint64) {
	switch {
	case missed > 0 && placed == missed:
		fmt.Fprintf(w, "note: the kernel skipped the recorder %d times because another BPF program was running on the CPU: each an event lost, in the discarded count and in the trace\n", missed)
	case missed > 0 && placed > 0:
		fmt.Fprintf(w, "note: the kernel skipped the recorder %d times because another BPF program was running on the CPU: at most that many events lost; the %d known lost are in the discarded count and in the trace\n", missed, placed)
	case missed > 0:
		fmt.Fprintf(w, "note: the kernel skipped the recorder %d times because another BPF program was running on the CPU: at most that many events lost, not in the discarded count, as a skipped run may have been of an event not recorded (filters, the raw syscall path's other syscalls)\n", missed)
	}
}

// summary prints per-CPU counts, losses by layer and advice.
func (r *recordRun) summary(stats []consumer.CPUStats, d consumer.DrainerStats) {
	w := r.stdout
	records, bytes, discarded := totals(stats)
	var unplaced uint64
	for _, c := range stats {
		unplaced += c.Missed - c.MissedPlaced()
	}
	more := ""
	if unplaced > 0 {
		more = fmt.Sprintf(", up to %d more missed (see the note)", unplaced)
	}
	fmt.Fprintf(w, "%d events recorded (%s) in %s, %d discarded%s\n", records, humanBytes(bytes), time.Since(r.start).Truncate(time.Millisecond), discarded, more)
	l := cpuTable(w, stats)
	missedNote(w, l.missed, l.missedPlaced)
	if l.kernel > 0 {
		fmt.Fprintf(w, "lost in the kernel ring: %d events, the ring being full; raise --ring-size or lower --latency\n", l.kernel)
		if d.Late > 0 {
			// No drain speed saves records produced while the consumer
			// does not run: only room in the ring does.
			fmt.Fprintf(w, "note: %d times the consumer ran more than --latency after it asked to, once %s late: its CPU was busy or, on a VM, not run by the host; a ring that holds that long is what keeps such records\n", d.Late, d.LongestOverrun.Round(10*time.Microsecond))
		}
	}
	if l.dropped > 0 {
		fmt.Fprintf(w, "lost in the sub-buffers: %d events, every sub-buffer being full; raise --subbuf-size or --n-subbufs, or write to a faster disk\n", l.dropped)
	}
	if l.unread > 0 {
		why := ""
		if r.s != nil && r.s.UserFault() != nil {
			why = fmt.Sprintf(", or memory not paged in, which the kernel's own events would hold (kconsume cannot page it in here: %v)", r.s.UserFault())
		}
		fmt.Fprintf(w, "note: %d user-space values of syscall events (paths, write buffers) could not be read and are recorded empty: bad pointers, empty in the kernel's own events too%s\n", l.unread, why)
	}
	if l.over > 0 {
		fmt.Fprintf(w, "note: overwrite mode kept the newest data; %d older events were overwritten\n", l.over)
	}
	if r.s != nil {
		filterNote(w, r.s.FilterKept())
		stackNote(w, r.s, r.s.Config().StackDepth)
		triggerNote(w, r.s)
	}
	local := ""
	if r.relay != nil {
		local = r.relay.local
	}
	switch {
	case l.disk > 0 && r.relay.enabled() && local == "":
		fmt.Fprintf(w, "lost at relayd: %d events in packets relayd never took, and no local copy (-o) has them\n", l.disk)
	case l.disk > 0:
		fmt.Fprintf(w, "lost on the disk: %d events in packets the disk did not take; the trace reports them discarded where its streams end\n", l.disk)
	}
	r.relay.summary(w)
	r.rot.summary(w)
	if r.rot != nil && r.rot.sink == nil && r.rot.enabled() && r.s != nil {
		// relayd's sink rotated: relayd archived every chunk, the last
		// one included, or none when the trace never rotated.
		if n := r.s.Channel().Chunks(); n > 1 {
			fmt.Fprintf(w, "%d chunks, each archived by relayd in the session's %s directory\n", n, chunks.ArchivesDir)
		} else {
			fmt.Fprintln(w, "not rotated: the trace is one chunk, in relayd's session directory")
		}
	}
	if records > 0 || discarded > 0 {
		where := "the trace"
		if local != "" {
			where = "the local copy in " + local
		}
		if r.rot != nil && r.rot.sink != nil {
			if st := r.rot.sink.Stats(); st.Deleted > 0 {
				fmt.Fprintf(w, "the kept chunks hold %d events and report %d lost; the deleted chunks held %d events and reported %d lost\n",
					records-min(records, st.DeletedEvents), discarded-min(discarded, st.DeletedDiscarded), st.DeletedEvents, st.DeletedDiscarded)
				return
			}
			where = "the chunks"
		}
		holds := "holds"
		if where == "the chunks" {
			holds = "hold"
		}
		if discarded == 0 {
			fmt.Fprintf(w, "%s %s all %d events\n", where, holds, records)
		} else {
			fmt.Fprintf(w, "%s %s the other %d events; babeltrace2 reports the %d lost where they were lost\n", where, holds, records, discarded)
		}
	}
}

func human(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.1fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func humanBytes(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// footprint prints the CPU time kconsume's own threads used from the gate's
// opening to the summary (draining, writing the trace, the final drain),
// which the command's time does not include, and what that is per event
// recorded.
func (r *recordRun) footprint(stats []consumer.CPUStats, used cpuTime) {
	records, _, _ := totals(stats)
	all := used.user + used.sys
	fmt.Fprintf(r.stdout, "kconsume's own CPU while recording: %s (%s user, %s system)", ms(all), ms(used.user), ms(used.sys))
	if records > 0 {
		fmt.Fprintf(r.stdout, ", %.0f ns an event", float64(all.Nanoseconds())/float64(records))
	}
	fmt.Fprintln(r.stdout)
}

// ms formats d in milliseconds with one decimal.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// filterNote says how many events each field filter kept, and which
// kept none: of those events the trace holds nothing.
func filterNote(w io.Writer, kept map[string]uint64) {
	for _, ev := range slices.Sorted(maps.Keys(kept)) {
		if n := kept[ev]; n == 0 {
			fmt.Fprintf(w, "note: the filter on %s kept none of its events: the trace holds none\n", ev)
		} else {
			fmt.Fprintf(w, "the filter on %s kept %d events\n", ev, n)
		}
	}
}

// stackNote says how many call chains were cut at their depth and how
// many were recorded empty, when any were.
func stackNote(w io.Writer, s *consumer.Session, depth int) {
	if err := s.SymbolsErr(); err != nil {
		fmt.Fprintf(w, "note: %v: report shows the kernel call chains as addresses\n", err)
	}
	c, err := s.StackCounts()
	if err != nil {
		fmt.Fprintf(w, "note: %v\n", err)
		return
	}
	if c.Truncated > 0 {
		at := "the kernel's limit (kernel.perf_event_max_stack)"
		if depth > 0 {
			at = fmt.Sprintf("--stack-depth %d", depth)
		}
		fmt.Fprintf(w, "note: %d call chains were deeper than %s and are cut there\n", c.Truncated, at)
	}
	if c.Failed > 0 {
		fmt.Fprintf(w, "note: %d call chains are recorded empty: the kernel gave none, or the event's record left no room for them\n", c.Failed)
	}
	if n := s.MappingsLost(); n > 0 {
		fmt.Fprintf(w, "note: the kernel dropped %d records of what processes mapped: some user frames may stay unnamed\n", n)
	}
	if unread, unheld := s.UserFilesUnread(); unread > 0 {
		why := "gone before kconsume could hold them open"
		if unheld > 0 {
			why += fmt.Sprintf(", or among the %d not held past the first %d", unheld, consumer.MaxHeldFiles)
		}
		fmt.Fprintf(w, "note: %d files mapped by processes of the user call chains gave no symbols (%s): their frames show as addresses\n", unread, why)
	}
	if c.CountersUnread > 0 {
		fmt.Fprintf(w, "note: %d perf counter contexts could not be read and are written as 0 (a CPU offline when the counters were opened, or a counter in error)\n", c.CountersUnread)
	}
}
