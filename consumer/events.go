package consumer

import (
	"fmt"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// resolveEvents expands the patterns into formats, each event once.
func resolveEvents(fs tracefs.FS, patterns []string) ([]*tracefs.Format, error) {
	var out []*tracefs.Format
	seen := map[tracefs.Event]bool{}
	for _, p := range patterns {
		evs, err := fs.Events(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if len(evs) == 0 {
			return nil, fmt.Errorf("%w: %q (see kconsume list)", ErrUnknownEvent, p)
		}
		for _, e := range evs {
			if seen[e] {
				continue
			}
			seen[e] = true
			f, err := fs.Format(e)
			if err != nil {
				return nil, err
			}
			out = append(out, f)
		}
	}
	return out, nil
}
