package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kconsume/kconsume/profile"
	"github.com/kconsume/kconsume/relayfmt"
)

const reportSynopsis = `report DIR [--json] [-e EVENT]... [--cpu N] [--pid PID] [--since T] [--until T]

Prints the trace's events merged by time, one line each with every field,
and the discarded ranges where they happened. T is a trace time in
seconds (as printed, 6589.325) or +DURATION from the first event (+2s).`

// reportFilter selects what report prints.
type reportFilter struct {
	events       []string // globs on the event name
	cpu          int      // -1: all
	pid          int64    // 0: all
	since, until string
	from, to     uint64 // resolved times; to == 0: no end
	// prof is the trace's naming profile: an event also matches by its
	// ftrace name (sched:sched_switch finds lttng's sched_switch).
	prof *profile.Profile
}

func report(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("report", reportSynopsis, "kconsume report /tmp/trace -e 'sched:*' --cpu 1 --since +1s --json", stderr)
	var events listFlag
	f := reportFilter{}
	fs.Var(&events, "e", "only events matching this `glob` (repeat or commas)")
	fs.IntVar(&f.cpu, "cpu", -1, "only this CPU")
	fs.Int64Var(&f.pid, "pid", 0, "only events whose common_pid (or pid) field is this `id`")
	fs.StringVar(&f.since, "since", "", "first `time` to print")
	fs.StringVar(&f.until, "until", "", "last `time` to print")
	asJSON := fs.Bool("json", false, "one JSON object per line")
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
	tr, err := relayfmt.Open(dir)
	if err != nil {
		return err
	}
	f.prof = profile.Detect(tr.Meta)
	m, err := tr.Merge()
	if err != nil {
		return err
	}
	defer m.Close()
	w := bufio.NewWriterSize(stdout, 1<<16)
	var vals []relayfmt.Value
	var line []byte
	first := true
	for m.Next() {
		it := m.Item()
		if first {
			first = false
			if err := f.resolve(it.Time); err != nil {
				return usageError{err}
			}
		}
		if it.Time < f.from || f.to != 0 && it.Time > f.to || f.cpu >= 0 && int(it.CPU) != f.cpu {
			continue
		}
		// Formatting straight into the writer's free space saves a copy
		// per line (bufio takes it in place when it fits).
		line = w.AvailableBuffer()
		if it.Kind != relayfmt.EventItem {
			if len(f.events) > 0 || f.pid != 0 {
				// A loss cannot be matched to an event name or pid: it is
				// shown only in the unfiltered view.
				continue
			}
			what := "events"
			if it.Kind == relayfmt.DiscardedPackets {
				what = "packets"
			}
			if *asJSON {
				line = fmt.Appendf(line, `{"time":%d,"cpu":%d,"lost":%d,"kind":%q,"begin":%d,"end":%d}`+"\n", it.Time, it.CPU, it.Count, what, it.Begin, it.End)
			} else {
				line = fmt.Appendf(line, "%s cpu%d LOST %d %s between %s and %s\n", stamp(it.Time), it.CPU, it.Count, what, stamp(it.Begin), stamp(it.End))
			}
		} else {
			if !f.matchName(it.Class.Name) {
				continue
			}
			if vals, err = it.Fields(vals); err != nil {
				return fmt.Errorf("%s: offset %d: %w", it.Stream, it.Offset, err)
			}
			if !f.matchPID(vals) {
				continue
			}
			if *asJSON {
				line = appendJSONEvent(line, it, vals)
			} else {
				// By hand, not fmt: this line is most of report's time.
				line = append(appendStamp(line, it.Time), " cpu"...)
				line = append(append(append(strconv.AppendUint(line, uint64(it.CPU), 10), ' '), it.Class.Name...), ':')
				for _, v := range vals {
					line = append(append(append(line, ' '), v.Field.Name...), '=')
					line = relayfmt.AppendValue(line, v)
				}
				line = append(line, '\n')
			}
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

// resolve turns --since/--until into trace times, given the first one.
func (f *reportFilter) resolve(first uint64) error {
	var err error
	if f.since != "" {
		if f.from, err = parseTraceTime(f.since, first); err != nil {
			return fmt.Errorf("--since: %w", err)
		}
	}
	if f.until != "" {
		if f.to, err = parseTraceTime(f.until, first); err != nil {
			return fmt.Errorf("--until: %w", err)
		}
	}
	if f.to != 0 && f.to < f.from {
		return fmt.Errorf("--until %s is before --since %s", f.until, f.since)
	}
	return nil
}

// parseTraceTime reads "6589.325443713" (seconds of the trace clock) or
// "+1.5s" (after the first event).
func parseTraceTime(s string, first uint64) (uint64, error) {
	if rel, ok := strings.CutPrefix(s, "+"); ok {
		d, err := time.ParseDuration(rel)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("%q: want +DURATION (+2s, +150ms)", s)
		}
		return first + uint64(d), nil
	}
	sec, frac, _ := strings.Cut(s, ".")
	whole, err := strconv.ParseUint(sec, 10, 64)
	if err != nil || len(frac) > 9 || whole > math.MaxUint64/1_000_000_000-1 {
		return 0, fmt.Errorf("%q: want seconds with up to 9 decimals, or +DURATION", s)
	}
	ns := uint64(0)
	if frac != "" {
		n, err := strconv.ParseUint(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: want seconds with up to 9 decimals, or +DURATION", s)
		}
		ns = n
	}
	return whole*1e9 + ns, nil
}

func (f *reportFilter) matchName(name string) bool {
	if len(f.events) == 0 {
		return true
	}
	if f.prof != nil {
		if orig, ok := f.prof.Original(name); ok && f.matchOne(orig) {
			return true
		}
	}
	return f.matchOne(name)
}

// matchOne reports whether one of the -e globs matches name.
func (f *reportFilter) matchOne(name string) bool {
	for _, e := range f.events {
		if ok, _ := path.Match(e, name); ok {
			return true
		}
		// A bare event name matches in any system.
		if _, short, found := strings.Cut(name, ":"); found && !strings.Contains(e, ":") {
			if ok, _ := path.Match(e, short); ok {
				return true
			}
		}
	}
	return false
}

func (f *reportFilter) matchPID(vals []relayfmt.Value) bool {
	if f.pid == 0 {
		return true
	}
	for _, name := range []string{"common_pid", "pid"} {
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
