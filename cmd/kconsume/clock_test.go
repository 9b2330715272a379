package main

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

var goldenBasic = filepath.Join("..", "..", "relayfmt", "testdata", "golden", "basic")

// TestClockFormatAcrossDays prints times in ascending and in random order
// across midnights and daylight-saving changes, where the cached window
// of one date and zone offset must move, and checks each against
// time.Format.
func TestClockFormatAcrossDays(t *testing.T) {
	for _, zone := range []string{"UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		// A zero on 2026-03-07 local, so the times span New York's March
		// change and several midnights.
		zero := time.Date(2026, 3, 7, 20, 0, 0, 0, loc).UnixNano()
		f := newClockFormat(relayfmt.Clock{Offset: zero}, false, true, false)
		f.loc = loc
		var cycles []uint64
		for c := uint64(0); c < 4*24*3600e9; c += 7*60e9 + 123456789 {
			cycles = append(cycles, c)
		}
		rnd := slices.Clone(cycles)
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(rnd), func(i, j int) { rnd[i], rnd[j] = rnd[j], rnd[i] })
		for _, c := range append(cycles, rnd...) {
			got := string(f.appendTime(nil, c))
			want := time.Unix(0, zero+int64(c)).In(loc).Format("[2006-01-02 15:04:05.000000000]")
			if got != want {
				t.Fatalf("%s: cycles %d: %s, want %s", zone, c, got, want)
			}
		}
	}
}

// bt2Times returns the time of each event line of babeltrace2's text
// output of dir ("[22:13:20.124458320]"), run with env and args.
func bt2Times(t *testing.T, dir string, env []string, args ...string) []string {
	t.Helper()
	cmd := exec.Command(testenv.BT2(t), append(args, dir)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("babeltrace2 %v: %v", args, err)
	}
	return firstFields(string(out))
}

// firstFields returns each event line's time: up to the "]" of a
// bracketed time, or else up to the first space. LOST lines are skipped.
func firstFields(out string) []string {
	var ts []string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if l == "" || strings.Contains(l, " LOST ") {
			continue
		}
		if i := strings.Index(l, "]"); strings.HasPrefix(l, "[") && i > 0 {
			ts = append(ts, l[:i+1])
			continue
		}
		f, _, _ := strings.Cut(l, " ")
		ts = append(ts, f)
	}
	return ts
}

// reportTimes returns the time of each event line report prints for dir
// in loc, with the date or not.
func reportTimes(t *testing.T, dir string, loc *time.Location, date bool) []string {
	t.Helper()
	tr, err := relayfmt.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tr.Merge()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	f := newClockFormat(tr.Meta.Clock, false, date, false)
	f.loc = loc
	var ts []string
	for m.Next() {
		if it := m.Item(); it.Kind == relayfmt.EventItem {
			ts = append(ts, string(f.appendTime(nil, it.Time)))
		}
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
	return ts
}

// checkAgainstBT2 compares report's event times on dir with
// babeltrace2's: as the command prints them by default and with
// --clock-date --clock-gmt, and in zones with daylight saving and half
// hours as TZ sets them for babeltrace2.
func checkAgainstBT2(t *testing.T, dir string) {
	t.Helper()
	code, out, stderr := runCmd("report", dir)
	if code != 0 {
		t.Fatalf("report: exit %d: %s", code, stderr)
	}
	got, want := firstFields(out), bt2Times(t, dir, nil)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Fatalf("report and babeltrace2 differ: %d and %d events; first %v and %v", len(got), len(want), got[:min(3, len(got))], want[:min(3, len(want))])
	}
	code, out, stderr = runCmd("report", dir, "--clock-date", "--clock-gmt")
	if code != 0 {
		t.Fatalf("report: exit %d: %s", code, stderr)
	}
	if got, want := firstFields(out), bt2Times(t, dir, nil, "--clock-date", "--clock-gmt"); !slices.Equal(got, want) {
		t.Fatalf("--clock-date --clock-gmt: report %v, babeltrace2 %v", got[:min(3, len(got))], want[:min(3, len(want))])
	}
	for _, zone := range []string{"America/New_York", "Asia/Kolkata"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := reportTimes(t, dir, loc, true), bt2Times(t, dir, []string{"TZ=" + zone}, "--clock-date"); !slices.Equal(got, want) {
			t.Fatalf("%s: report %v, babeltrace2 %v", zone, got[:min(3, len(got))], want[:min(3, len(want))])
		}
	}
}

// TestReportTimesAsBabeltrace2 checks report's times against babeltrace2
// on the golden trace, and that its losses carry babeltrace2's ranges.
func TestReportTimesAsBabeltrace2(t *testing.T) {
	checkAgainstBT2(t, goldenBasic)
	code, out, _ := runCmd("report", goldenBasic, "--clock-gmt")
	if code != 0 {
		t.Fatal("report failed")
	}
	var lost []string
	for _, l := range strings.Split(out, "\n") {
		if _, r, ok := strings.Cut(l, " events between "); ok {
			lost = append(lost, r)
		}
	}
	_, discards := testenv.RunBT2(t, goldenBasic)
	var want []string
	for _, d := range discards {
		if d.Kind == "events" {
			want = append(want, "["+d.Begin+"] and ["+d.End+"]")
		}
	}
	if len(want) == 0 || !slices.Equal(lost, want) {
		t.Fatalf("LOST ranges %q, babeltrace2 %q", lost, want)
	}
}

// TestRecordTimesAsBabeltrace2 records a trace on this machine and checks
// report's times against babeltrace2's.
func TestRecordTimesAsBabeltrace2(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "t")
	// The command's sleep switches: an idle guest may not in 300 ms.
	if code, _, stderr := runCmd("record", "-q", "-o", dir, "-e", "sched:sched_switch", "--", "sleep", "0.3"); code != 0 {
		t.Fatalf("record: exit %d: %s", code, stderr)
	}
	checkAgainstBT2(t, dir)
}

// TestReportSinceWallClock selects the same events by wall-clock times
// (as printed, bracketed or not, with a date or not) as by trace seconds.
func TestReportSinceWallClock(t *testing.T) {
	_, wall, _ := runCmd("report", goldenBasic, "--clock-gmt", "--clock-date")
	_, secs, _ := runCmd("report", goldenBasic, "--trace-seconds")
	w, s := firstFields(wall), firstFields(secs)
	if len(w) != len(s) || len(w) < 40 {
		t.Fatalf("%d and %d events", len(w), len(s))
	}
	i, j := len(w)/4, 3*len(w)/4
	bySecs := func(args ...string) string {
		_, out, stderr := runCmd(append([]string{"report", goldenBasic, "--clock-gmt"}, args...)...)
		if out == "" {
			t.Fatalf("report %v: nothing: %s", args, stderr)
		}
		return out
	}
	want := bySecs("--since", s[i], "--until", s[j])
	_, clock, _ := strings.Cut(strings.Trim(w[i], "[]"), " ")
	for _, since := range []string{w[i], strings.Trim(w[i], "[]"), clock, "[" + clock + "]"} {
		_, untilClock, _ := strings.Cut(strings.Trim(w[j], "[]"), " ")
		if got := bySecs("--since", since, "--until", untilClock); got != want {
			t.Errorf("--since %q --until %q: not the events of --since %s --until %s", since, untilClock, s[i], s[j])
		}
	}
	for _, bad := range []string{"25:00:00", "22:13", "2023-13-01 22:13:20", "1970-01-01 00:00:00"} {
		if code, _, stderr := runCmd("report", goldenBasic, "--since", bad); code != 2 || stderr == "" {
			t.Errorf("--since %q: exit %d, want 2", bad, code)
		}
	}
}
