package filter

import "fmt"

// Release is a kernel version, major.minor.patch.
type Release struct{ Major, Minor, Patch int }

func (r Release) String() string { return fmt.Sprintf("%d.%d.%d", r.Major, r.Minor, r.Patch) }

// Less reports whether r is older than o.
func (r Release) Less(o Release) bool {
	if r.Major != o.Major {
		return r.Major < o.Major
	}
	if r.Minor != o.Minor {
		return r.Minor < o.Minor
	}
	return r.Patch < o.Patch
}

// ParseRelease reads "6.12.117-amd64" and the like; ok is false without
// at least major.minor.
func ParseRelease(s string) (Release, bool) {
	var r Release
	n, _ := fmt.Sscanf(s, "%d.%d.%d", &r.Major, &r.Minor, &r.Patch)
	return r, n >= 2
}

// Feature names one difference between kernels.
type Feature string

// The differences, as read in the sources of Debian's 5.10.223, 6.1.192,
// 6.12.117 and 7.3.4 kernels and checked on 6.18.44.
const (
	// FeatIncomplete: a trailing && or || (with or without ! after it)
	// is refused, "Meaningless filter expression"; before, it was
	// dropped and the filter accepted.
	FeatIncomplete Feature = "refuse-incomplete"
	// FeatStacktrace: the pseudo fields stacktrace and STACKTRACE exist.
	FeatStacktrace Feature = "stacktrace-field"
	// FeatFunction: FIELD.function == SYMBOL.
	FeatFunction Feature = "function-suffix"
	// FeatCPUS: FIELD OP CPUS{list}, and data_loc cpumask fields.
	FeatCPUS Feature = "cpus-list"
	// FeatRelLoc: __rel_loc strings are strings.
	FeatRelLoc Feature = "rel-loc-strings"
	// FeatGlobLen: ~ globs stop at the field's length, and == no longer
	// matches a pattern longer than a fixed field's size by its prefix.
	FeatGlobLen Feature = "bounded-match"
)

// Change is when a Feature arrived: Since per stable series where it was
// backported, and Mainline for the rest.
type Change struct {
	Feature  Feature
	Mainline Release
	// Backports are stable releases that got it before Mainline; a
	// kernel of such a series has it from that patch level on.
	Backports []Release
	// Refuses is true when the change makes the kernel refuse what it
	// accepted before; false when it accepts what it refused.
	Refuses bool
	What    string
}

// Changes is the table of differences. Mainline releases marked as such
// in What are from the kernels read; the others are the first mainline
// release with the change.
var Changes = []Change{
	{FeatRelLoc, Release{5, 19, 0}, nil, false,
		"__rel_loc char[] fields are strings (5.10: no such fields)"},
	{FeatFunction, Release{6, 2, 0}, nil, false,
		"FIELD.function == SYMBOL|ADDRESS; before: Invalid operator"},
	{FeatStacktrace, Release{6, 4, 0}, nil, false,
		"pseudo fields stacktrace/STACKTRACE (accepted, never match); before: Field not found (absent in 6.1, present in 6.12)"},
	{FeatCPUS, Release{6, 6, 0}, nil, false,
		"CPUS{list} values and cpumask fields; before: Invalid value (did you forget quotes)?"},
	{FeatGlobLen, Release{6, 1, 0}, nil, false,
		"matching bounded by the field length (glob_match_len); 5.10 reads to the NUL and == compares only the field's bytes"},
	{FeatIncomplete, Release{7, 0, 0}, []Release{{6, 12, 115}}, true,
		"trailing && / || refused (6.12.115 stable, in 7.3; of two builds of 6.18.44, one accepts, one refuses; mainline release assumed 7.0)"},
}

// Has reports whether kernel rel has feature f: the Changes entry's
// backport for rel's series, else its mainline release.
func Has(rel Release, f Feature) bool {
	for _, c := range Changes {
		if c.Feature != f {
			continue
		}
		for _, b := range c.Backports {
			if b.Major == rel.Major && b.Minor == rel.Minor {
				return !rel.Less(b)
			}
		}
		return !rel.Less(c.Mainline)
	}
	return true
}
