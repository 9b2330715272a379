package consumer

import (
	"fmt"
	"path"

	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/consumer/tracefs"
)

// splitProbes separates the probe specs of patterns (probe.IsProbe)
// from the tracepoint patterns.
func splitProbes(patterns []string) (tracepoints, probes []string) {
	for _, p := range patterns {
		if probe.IsProbe(p) {
			probes = append(probes, p)
		} else {
			tracepoints = append(tracepoints, p)
		}
	}
	return tracepoints, probes
}

// addProbes parses specs, a glob of functions into a probe each
// (probe.Expand), and appends each probe's format to formats,
// after the tracepoints': it returns the probe of each event key (nil
// for a tracepoint, nil altogether without probes) and the formats. It
// fails with ErrConfig on a spec that does not parse or two probes of
// one name, and with ErrNotSupported where this architecture has no
// probes.
func addProbes(fs tracefs.FS, specs []string, formats []*tracefs.Format) ([]*probe.Probe, []*tracefs.Format, error) {
	if len(specs) == 0 {
		return nil, formats, nil
	}
	if err := probe.Supported(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	byKey := make([]*probe.Probe, len(formats), len(formats)+len(specs))
	seen := map[string]string{}
	for _, f := range formats {
		seen[f.FullName()] = f.FullName()
	}
	funcs := func() ([]string, error) { return probe.TraceableFunctions(fs.Root) }
	for _, s := range specs {
		ps, err := probe.Expand(s, funcs)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		for _, p := range ps {
			if prev, ok := seen[p.FullName()]; ok {
				return nil, nil, fmt.Errorf("%w: %q and %q are both event %s", ErrConfig, prev, s, p.FullName())
			}
			seen[p.FullName()] = s
			// No kernel event of theirs: common_type 0.
			formats = append(formats, p.Format(probe.Common(), 0))
			byKey = append(byKey, p)
		}
	}
	return byKey, formats, nil
}

// probeMatches reports whether pattern names the recorded event f:
// its spec (uprobe:PATH:SYMBOL …) or a glob of its name (uprobes:NAME).
func probeMatches(pattern string, f *tracefs.Format) bool {
	if name, ok := probe.GlobName(pattern); ok {
		// The events a glob of functions made: their names match it.
		ok, _ := path.Match(name, f.FullName())
		return ok
	}
	if probe.IsProbe(pattern) {
		p, err := probe.Parse(pattern)
		return err == nil && p.FullName() == f.FullName()
	}
	ok, _ := path.Match(pattern, f.FullName())
	return ok
}

// isProbe reports whether f is a probe's format.
func isProbe(f *tracefs.Format) bool { return probe.IsSystem(f.System) }
