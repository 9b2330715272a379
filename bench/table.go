package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// results holds every metric of every benchmark by round:
// results[name][unit][round].
type results map[string]map[string]map[int]float64

var benchLine = regexp.MustCompile(`^Benchmark(\S+?)(-\d+)?\s+\d+\s+(.*)$`)

// parse adds the benchmark lines of go test output r as round's values,
// each benchmark's name ending in suffix.
func (res results) parse(round int, r io.Reader, suffix string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		m[1] += suffix
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			if res[m[1]] == nil {
				res[m[1]] = map[string]map[int]float64{}
			}
			if res[m[1]][f[i+1]] == nil {
				res[m[1]][f[i+1]] = map[int]float64{}
			}
			res[m[1]][f[i+1]][round] = v
		}
	}
}

// metric names one reported value: benchmark name and unit.
type metric struct{ bench, unit string }

// stat is the median, min and max of a metric's rounds; n counts them.
type stat struct {
	med, min, max float64
	n             int
}

func summarize(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{med: med, min: s[0], max: s[len(s)-1], n: len(s)}
}

// get returns the rounds' values of m, in round order.
func (res results) get(m metric) []float64 {
	rounds := res[m.bench][m.unit]
	var out []float64
	for _, r := range slices.Sorted(maps.Keys(rounds)) {
		out = append(out, rounds[r])
	}
	return out
}

// ratio returns the per-round ratios a/b over the rounds that have both.
func (res results) ratio(a, b metric) []float64 {
	var out []float64
	for r, va := range res[a.bench][a.unit] {
		if vb, ok := res[b.bench][b.unit][r]; ok && vb != 0 {
			out = append(out, va/vb)
		}
	}
	return out
}

// row is one line of the table.
type row struct {
	what  string
	cmd   string  // the command that measures it alone
	fig   metric  // the figure
	scale float64 // figure divided by this (1 when 0)
	label string  // unit shown after the figure
	extra []extra // more values of the same benchmark
	// The ratio: fig over base per round, or a metric that is a ratio.
	base      *metric
	baseName  string
	ratioOf   *metric
	target    string
	ok        func(res results, fig, ratio stat) bool // nil: no target
	needRatio bool                                    // ok reads the ratio
	// losses are counts of lost, dropped or skipped work in the
	// measured run: the target is met only where each was 0 in every
	// round, and its text says so.
	losses []metric
}

type extra struct {
	m     metric
	label string
}

func (s stat) String() string {
	return fmt.Sprintf("%s (%s–%s)", num(s.med), num(s.min), num(s.max))
}

// num prints 3 significant digits.
func num(v float64) string {
	switch a := math.Abs(v); {
	case a == 0:
		return "0"
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func scaled(v []float64, k float64) []float64 {
	if k == 0 {
		return v
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = x / k
	}
	return out
}

// render returns the header and the table of every row with data, the
// host's sections only where host; a guest section (g the guest's run,
// nil where none was asked for) says where it was measured, or in one
// line why it was not.
func render(res results, rounds int, took time.Duration, host bool, g *guestRun) string {
	var b strings.Builder
	b.WriteString(header(rounds, took, g))
	section := ""
	for _, sr := range rows() {
		if !host && !sr.guest {
			continue
		}
		if sr.section != section {
			section = sr.section
			title := section
			if sr.guest {
				title += g.heading()
			}
			fmt.Fprintf(&b, "\n## %s\n\n| measure | figure | vs baseline | target | command |\n|---|---|---|---|---|\n", title)
			if note := g.note(); sr.guest && note != "" {
				fmt.Fprintf(&b, "| every row of this section | %s | | | `make bench` |\n", note)
			}
		}
		if sr.guest && g.note() != "" {
			continue
		}
		b.WriteString(sr.row.line(res))
	}
	return b.String()
}

func (r row) line(res results) string {
	vals := res.get(r.fig)
	if len(vals) == 0 {
		return fmt.Sprintf("| %s | not measured (see the run's log) | | %s | `%s` |\n", r.what, r.target, r.cmd)
	}
	fig := summarize(scaled(vals, r.scale))
	text := fig.String() + " " + r.label
	for _, e := range r.extra {
		if v := res.get(e.m); len(v) > 0 {
			text += fmt.Sprintf("; %s %s", summarize(v), e.label)
		}
	}
	var rat stat
	ratio := ""
	switch {
	case r.base != nil:
		rat = summarize(res.ratio(r.fig, *r.base))
	case r.ratioOf != nil:
		rat = summarize(res.get(*r.ratioOf))
	}
	if rat.n > 0 {
		ratio = fmt.Sprintf("%s × %s", rat, r.baseName)
	}
	verdict := r.target
	if len(r.losses) > 0 {
		verdict += ", nothing lost"
	}
	if r.ok != nil && (!r.needRatio || rat.n > 0) {
		lost := r.lost(res)
		switch {
		case lost != "":
			verdict += ": **missed** (" + lost + ")"
		case r.ok(res, fig, rat):
			verdict += ": met"
		default:
			verdict += ": **missed**"
		}
	}
	return fmt.Sprintf("| %s | %s | %s | %s | `%s` |\n", r.what, text, ratio, verdict, r.cmd)
}

// lost returns what r's losses say was lost, "" when nothing was: the
// rounds with a loss, or a count not reported at all.
func (r row) lost(res results) string {
	var out []string
	for _, l := range r.losses {
		v := res.get(l)
		n := 0
		for _, x := range v {
			if x != 0 {
				n++
			}
		}
		switch {
		case len(v) == 0:
			out = append(out, l.unit+" not reported")
		case n > 0:
			out = append(out, fmt.Sprintf("%s in %d of %d rounds", l.unit, n, len(v)))
		}
	}
	return strings.Join(out, ", ")
}
