package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/kconsume/kconsume/profile"
	"github.com/kconsume/kconsume/relayfmt"
)

const reportSynopsis = `report DIR [--follow] [--json] [-e EVENT]... [--cpu N] [--pid PID] [--since T] [--until T]
       [--clock-date] [--clock-gmt] [--trace-seconds] [--raw-addresses]

Prints the trace's events merged by time, one line each with every field,
and the discarded ranges where they happened. Times are printed as
babeltrace2 prints them by default: the wall-clock time of day in the
local zone, [06:42:58.427309908], from the trace clock's offset.
T is a time as printed (06:42:58.4273, with or without brackets; a date
may come first: 2026-11-25 06:42:58), the trace clock's seconds
(1301.098, as --trace-seconds prints), or +DURATION after the first
event (+2s).`

// reportFilter selects what report prints.
type reportFilter struct {
	events       []string // globs on the event name
	cpu          int      // -1: all
	pid          int64    // 0: all
	since, until string
	from, to     uint64       // resolved times; to == 0: no end
	clock        *clockFormat // set from the trace's metadata (setClock)
	raw          bool         // --trace-seconds
	date, gmt    bool         // --clock-date, --clock-gmt
	resolved     bool
	json         bool
	vals         []relayfmt.Value
	fields       fieldFilters // --filter
	stacks       stackNames   // call chains by name
	// prof is the trace's naming profile: an event also matches by its
	// ftrace name (sched:sched_switch finds lttng's sched_switch).
	prof *profile.Profile
}

// setClock makes f print times as the clock c of a trace's metadata.
func (f *reportFilter) setClock(c relayfmt.Clock) {
	f.clock = newClockFormat(c, f.raw, f.date, f.gmt)
}

func report(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("report", reportSynopsis, "kconsume report /tmp/trace -e 'sched:*' --cpu 1 --since +1s --json", stderr)
	var events listFlag
	f := reportFilter{}
	fs.Var(&events, "e", "only events matching this `glob` (repeat or commas)")
	fs.IntVar(&f.cpu, "cpu", -1, "only this CPU")
	fs.Var(&f.fields, "filter", "only events whose fields pass this filter, `[EVENT:]EXPR` in ftrace's event filter language (docs/filters.md), for the events EVENT names or all; repeat: all must pass")
	fs.Int64Var(&f.pid, "pid", 0, "only events whose common_pid (or pid, or tid) field is this `id`")
	fs.StringVar(&f.since, "since", "", "first `time` to print")
	fs.StringVar(&f.until, "until", "", "last `time` to print")
	asJSON := fs.Bool("json", false, "one JSON object per line (times in trace clock ns)")
	fs.BoolVar(&f.date, "clock-date", false, "print the date too, as babeltrace2 --clock-date")
	fs.BoolVar(&f.gmt, "clock-gmt", false, "print times in UTC, not the local zone, as babeltrace2 --clock-gmt")
	fs.BoolVar(&f.raw, "trace-seconds", false, "print times as the trace clock's seconds (1301.098291682)")
	fs.BoolVar(&f.stacks.raw, "raw-addresses", false, "print call chains as addresses, not func+0xoff names")
	follow := fs.Bool("follow", false, "print the events of a trace being written as its packets land (record --live-timer makes them land often), until Ctrl-C")
	// Flags may follow the directory: kconsume report DIR --json.
	var dir string
	rest := args
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		dir, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if dir == "" && fs.NArg() == 1 {
		dir = fs.Arg(0)
	} else if fs.NArg() != 0 || dir == "" {
		fs.Usage()
		return usageError{fmt.Errorf("want one trace directory")}
	}
	f.events = events
	for _, e := range f.events {
		if _, err := path.Match(e, ""); err != nil {
			return usageError{fmt.Errorf("-e %q: %w", e, err)}
		}
	}
	if *follow {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		f.json = *asJSON
		return followTrace(ctx, dir, &f, stdout)
	}
	tr, err := relayfmt.Open(dir)
	if err != nil {
		return err
	}
	f.prof = profile.Detect(tr.Meta)
	if err := f.stacks.load(tr.Dir); err != nil {
		return err
	}
	m, err := tr.Merge()
	if err != nil {
		return err
	}
	defer m.Close()
	f.setClock(tr.Meta.Clock)
	f.json = *asJSON
	w := bufio.NewWriterSize(stdout, 1<<16)
	var line []byte
	for m.Next() {
		// Formatting straight into the writer's free space saves a copy
		// per line (bufio takes it in place when it fits).
		var ok bool
		if line, ok, err = f.format(w.AvailableBuffer(), m.Item()); err != nil {
			return err
		} else if !ok {
			continue
		}
		if _, err := w.Write(line); err != nil {
			return err
		}
	}
	if err := m.Err(); err != nil {
		w.Flush()
		return fmt.Errorf("%w (kconsume recover %s cuts damaged files back to their last whole packet)", err, dir)
	}
	return w.Flush()
}

// format appends it to line as report prints it, and reports whether it
// passes the filters. The first item it sees resolves --since/--until.
func (f *reportFilter) format(line []byte, it *relayfmt.Item) ([]byte, bool, error) {
	if !f.resolved {
		f.resolved = true
		if err := f.resolve(it.Time); err != nil {
			return line, false, usageError{err}
		}
	}
	if it.Time < f.from || f.to != 0 && it.Time > f.to || f.cpu >= 0 && int(it.CPU) != f.cpu {
		return line, false, nil
	}
	if it.Kind != relayfmt.EventItem {
		if len(f.events) > 0 || f.pid != 0 || f.fields.on() {
			// A loss cannot be matched to an event name or pid: it is
			// shown only in the unfiltered view.
			return line, false, nil
		}
		what := "events"
		if it.Kind == relayfmt.DiscardedPackets {
			what = "packets"
		}
		if f.json {
			return fmt.Appendf(line, `{"time":%d,"cpu":%d,"lost":%d,"kind":%q,"begin":%d,"end":%d}`+"\n", it.Time, it.CPU, it.Count, what, it.Begin, it.End), true, nil
		}
		tf := f.clock
		line = fmt.Appendf(tf.appendTime(line, it.Time), " cpu%d LOST %d %s between ", it.CPU, it.Count, what)
		return append(tf.appendTime(append(tf.appendTime(line, it.Begin), " and "...), it.End), '\n'), true, nil
	}
	if !f.matchName(it.Class.Name) {
		return line, false, nil
	}
	var err error
	if f.vals, err = it.Fields(f.vals); err != nil {
		return line, false, fmt.Errorf("%s: offset %d: %w", it.Stream, it.Offset, err)
	}
	if !f.matchPID(f.vals) {
		return line, false, nil
	}
	if f.fields.on() {
		if ok, err := f.fields.pass(it.Class, f.prof, f.vals, it.CPU); err != nil || !ok {
			return line, false, usageErrorOf(err)
		}
	}
	if f.json {
		return appendJSONEvent(line, it, f.vals), true, nil
	}
	// By hand, not fmt: this line is most of report's time.
	line = append(f.clock.appendTime(line, it.Time), " cpu"...)
	line = append(append(append(strconv.AppendUint(line, uint64(it.CPU), 10), ' '), it.Class.Name...), ':')
	for _, v := range f.vals {
		line = append(append(append(line, ' '), v.Field.Name...), '=')
		var named bool
		if line, named = f.stacks.appendValue(line, v, f.vals, it.Time); !named {
			line = relayfmt.AppendValue(line, v)
		}
	}
	return append(line, '\n'), true, nil
}

// resolve turns --since/--until into trace times, given the first one.
func (f *reportFilter) resolve(first uint64) error {
	var err error
	if f.since != "" {
		if f.from, err = f.clock.parseTime(f.since, first); err != nil {
			return fmt.Errorf("--since: %w", err)
		}
	}
	if f.until != "" {
		if f.to, err = f.clock.parseTime(f.until, first); err != nil {
			return fmt.Errorf("--until: %w", err)
		}
	}
	if f.to != 0 && f.to < f.from {
		return fmt.Errorf("--until %s is before --since %s", f.until, f.since)
	}
	return nil
}

// parseTraceTime reads seconds of the trace clock, "6589.325443713".
func parseTraceTime(s string) (uint64, error) {
	sec, frac, _ := strings.Cut(s, ".")
	whole, err := strconv.ParseUint(sec, 10, 64)
	if err != nil || len(frac) > 9 || whole > math.MaxUint64/1_000_000_000-1 {
		return 0, fmt.Errorf("%q: want HH:MM:SS[.NNNNNNNNN], YYYY-MM-DD HH:MM:SS[.NNNNNNNNN], trace seconds with up to 9 decimals, or +DURATION", s)
	}
	ns := uint64(0)
	if frac != "" {
		n, err := strconv.ParseUint(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: want HH:MM:SS[.NNNNNNNNN], YYYY-MM-DD HH:MM:SS[.NNNNNNNNN], trace seconds with up to 9 decimals, or +DURATION", s)
		}
		ns = n
	}
	return whole*1e9 + ns, nil
}

// matchName reports whether one of the -e patterns names the event
// called name, by that name or, under another profile, its ftrace one.
func (f *reportFilter) matchName(name string) bool {
	if len(f.events) == 0 {
		return true
	}
	orig := ftraceName(f.prof, name)
	for _, e := range f.events {
		if matchPattern(e, name, orig) {
			return true
		}
	}
	return false
}

func (f *reportFilter) matchPID(vals []relayfmt.Value) bool {
	if f.pid == 0 {
		return true
	}
	for _, name := range []string{"common_pid", "pid", "tid"} {
		for _, v := range vals {
			if v.Field.Name == name && v.Field.Kind == relayfmt.Scalar {
				return v.Int(0) == f.pid || !v.Field.Elem.Signed() && int64(v.Uint(0)) == f.pid
			}
		}
	}
	return false
}

// appendJSONEvent writes {"time":…,"cpu":…,"event":…,"fields":{…}}.
func appendJSONEvent(b []byte, it *relayfmt.Item, vals []relayfmt.Value) []byte {
	b = fmt.Appendf(b, `{"time":%d,"cpu":%d,"event":`, it.Time, it.CPU)
	b = appendJSONString(b, []byte(it.Class.Name))
	b = append(b, `,"fields":{`...)
	for i, v := range vals {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, []byte(v.Field.Name))
		b = append(b, ':')
		f := v.Field
		switch {
		case f.Kind == relayfmt.String || f.Text:
			b = appendJSONString(b, v.Text())
		case f.Kind == relayfmt.Scalar:
			b = appendJSONNumber(b, v, 0)
		default:
			b = append(b, '[')
			for j := range v.Len() {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendJSONNumber(b, v, j)
			}
			b = append(b, ']')
		}
	}
	return append(b, "}}\n"...)
}

func appendJSONNumber(b []byte, v relayfmt.Value, i int) []byte {
	if v.Field.Elem.Signed() {
		return strconv.AppendInt(b, v.Int(i), 10)
	}
	return strconv.AppendUint(b, v.Uint(i), 10)
}

// appendJSONString quotes s as a JSON string; bytes that are not UTF-8
// become U+FFFD, as encoding/json does.
func appendJSONString(b, s []byte) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for len(s) > 0 {
		r, n := utf8.DecodeRune(s)
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, `\ufffd`...)
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[r>>4], hex[r&15])
		default:
			b = append(b, s[:n]...)
		}
		s = s[n:]
	}
	return append(b, '"')
}

// usageErrorOf wraps err, when set, as a usageError.
func usageErrorOf(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}
