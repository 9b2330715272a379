package main

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/kconsume/kconsume/relayfmt"
)

// clockFormat prints a trace's times as babeltrace2's text output does by
// default: the wall-clock time of day, "[06:42:58.427309908]", from the
// clock's offset (its zero as a date, offset_s and offset in the
// metadata), in the local time zone; or, as chosen, with the date first
// (babeltrace2 --clock-date), in UTC (--clock-gmt), or as the clock's own
// seconds ("1301.098291682", raw).
type clockFormat struct {
	raw, date bool
	loc       *time.Location
	offset    int64  // the clock's zero, ns since the epoch
	freq      uint64 // cycles per second

	// The window [lo, hi) of epoch ns in which the date and the zone's
	// offset stay the same, so that most events need no time.Time.
	lo, hi   int64
	zoneOff  int64 // seconds east of UTC in the window
	dateText []byte
}

func newClockFormat(c relayfmt.Clock, raw, date, gmt bool) *clockFormat {
	f := &clockFormat{raw: raw, date: date, loc: time.Local, offset: c.Offset, freq: c.Freq}
	if gmt {
		f.loc = time.UTC
	}
	if f.freq == 0 {
		f.freq = 1e9
	}
	return f
}

// epochNs returns the wall time of a trace time, in ns since the epoch.
func (f *clockFormat) epochNs(cycles uint64) int64 {
	ns := cycles
	if f.freq != 1e9 {
		hi, lo := bits.Mul64(cycles, 1e9)
		if hi < f.freq {
			ns, _ = bits.Div64(hi, lo, f.freq)
		}
	}
	return f.offset + int64(ns)
}

// cycles returns the trace time of a wall time in ns since the epoch, or
// false when it is before the clock's zero.
func (f *clockFormat) cycles(epochNs int64) (uint64, bool) {
	if epochNs < f.offset {
		return 0, false
	}
	ns := uint64(epochNs - f.offset)
	if f.freq == 1e9 {
		return ns, true
	}
	hi, lo := bits.Mul64(ns, f.freq)
	if hi >= 1e9 {
		return 0, false
	}
	c, _ := bits.Div64(hi, lo, 1e9)
	return c, true
}

// appendTime appends the time of cycles as chosen: "[HH:MM:SS.nnnnnnnnn]",
// "[YYYY-MM-DD HH:MM:SS.nnnnnnnnn]" or raw seconds.
func (f *clockFormat) appendTime(dst []byte, cycles uint64) []byte {
	if f.raw {
		return appendStamp(dst, cycles)
	}
	ns := f.epochNs(cycles)
	if ns < f.lo || ns >= f.hi {
		f.window(ns)
	}
	dst = append(dst, '[')
	if f.date {
		dst = append(append(dst, f.dateText...), ' ')
	}
	sec := floorDiv(ns, 1e9)
	frac := ns - sec*1e9
	day := (sec + f.zoneOff) % 86400
	if day < 0 {
		day += 86400
	}
	dst = append2(dst, day/3600, ':')
	dst = append2(dst, day/60%60, ':')
	dst = append2(dst, day%60, '.')
	var buf [9]byte
	for i := 8; i >= 0; i-- {
		buf[i] = byte('0' + frac%10)
		frac /= 10
	}
	return append(append(dst, buf[:]...), ']')
}

func append2(dst []byte, v int64, sep byte) []byte {
	return append(dst, byte('0'+v/10), byte('0'+v%10), sep)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// window sets the span around ns in which the local date and the zone's
// offset do not change: the local day, cut at the zone's transitions.
func (f *clockFormat) window(ns int64) {
	t := time.Unix(0, ns).In(f.loc)
	y, m, d := t.Date()
	_, off := t.Zone()
	f.zoneOff = int64(off)
	f.lo = time.Date(y, m, d, 0, 0, 0, 0, f.loc).UnixNano()
	f.hi = time.Date(y, m, d+1, 0, 0, 0, 0, f.loc).UnixNano()
	zs, ze := t.ZoneBounds()
	if !zs.IsZero() && zs.UnixNano() > f.lo {
		f.lo = zs.UnixNano()
	}
	if !ze.IsZero() && ze.UnixNano() < f.hi {
		f.hi = ze.UnixNano()
	}
	f.dateText = t.AppendFormat(f.dateText[:0], "2006-01-02")
}

// parseTime reads a --since or --until time as report prints it, given
// the first event's trace time: "+1.5s" after the first event; a wall
// clock time "06:42:58.427309908" or "2026-11-25 06:42:58.427" (brackets
// allowed, as babeltrace2 prints them; in the zone report prints in; a
// time of day is on the first event's date, or the next day when that is
// more than 12 hours before the first event); or seconds of the trace's
// clock, "1301.098291682".
func (f *clockFormat) parseTime(s string, first uint64) (uint64, error) {
	if rel, ok := strings.CutPrefix(s, "+"); ok {
		d, err := time.ParseDuration(rel)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("%q: want +DURATION (+2s, +150ms)", s)
		}
		return first + uint64(d), nil
	}
	w := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(s), "["), "]")
	if !strings.Contains(w, ":") {
		return parseTraceTime(w)
	}
	const want = "want HH:MM:SS[.NNNNNNNNN], YYYY-MM-DD HH:MM:SS[.NNNNNNNNN], trace seconds or +DURATION"
	datePart, clock, hasDate := strings.Cut(w, " ")
	if !hasDate {
		clock = datePart
	}
	hms, frac, _ := strings.Cut(clock, ".")
	parts := strings.Split(hms, ":")
	if len(parts) != 3 || len(frac) > 9 {
		return 0, fmt.Errorf("%q: %s", s, want)
	}
	var v [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || len(p) != 2 || n < 0 || n > [3]int{23, 59, 60}[i] {
			return 0, fmt.Errorf("%q: %s", s, want)
		}
		v[i] = n
	}
	ns := 0
	if frac != "" {
		n, err := strconv.Atoi(frac + strings.Repeat("0", 9-len(frac)))
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q: %s", s, want)
		}
		ns = n
	}
	firstWall := time.Unix(0, f.epochNs(first)).In(f.loc)
	y, m, d := firstWall.Date()
	if hasDate {
		day, err := time.ParseInLocation("2006-01-02", datePart, f.loc)
		if err != nil {
			return 0, fmt.Errorf("%q: %s", s, want)
		}
		y, m, d = day.Date()
	}
	t := time.Date(y, m, d, v[0], v[1], v[2], ns, f.loc)
	if !hasDate && firstWall.Sub(t) > 12*time.Hour {
		t = time.Date(y, m, d+1, v[0], v[1], v[2], ns, f.loc)
	}
	c, ok := f.cycles(t.UnixNano())
	if !ok {
		return 0, fmt.Errorf("%q is before the trace clock's zero (%s)", s, time.Unix(0, f.offset).In(f.loc).Format(time.DateTime))
	}
	return c, nil
}
