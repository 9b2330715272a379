package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kconsume/kconsume/consumer"
)

// triggerFlags is --trigger 'EVENT[ FILTER] : ACTION[, every DURATION]'
// (docs/triggers.md), repeatable.
type triggerFlags struct{ list []consumer.Trigger }

func (f *triggerFlags) String() string { return "" }

func (f *triggerFlags) Set(s string) error {
	t, err := parseTrigger(s)
	if err != nil {
		return err
	}
	f.list = append(f.list, t)
	return nil
}

// triggerSyntax is what parseTrigger's errors show.
const triggerSyntax = "want 'EVENT[ FILTER] : ACTION[, every DURATION]', ACTION snapshot, stop or start"

// parseTrigger returns the trigger s says: EVENT (as -e takes it), an
// optional condition in the filter language after a space, then " : "
// and the action, with an optional rate limit ", every DURATION"
// (default one action a second). The action's colon is the last one
// after a space outside quotes, so a condition may hold colons in its
// strings. It
// fails for a malformed trigger, an unknown action, rotate (not in this
// build) or a rate limit that is not a positive duration; the condition
// itself is parsed against the event's format when the session starts.
func parseTrigger(s string) (consumer.Trigger, error) {
	var t consumer.Trigger
	colon := lastColonOutsideQuotes(s)
	if colon < 0 {
		return t, fmt.Errorf("%q: no action: %s", s, triggerSyntax)
	}
	head, tail := strings.TrimSpace(s[:colon]), strings.TrimSpace(s[colon+1:])
	if head == "" {
		return t, fmt.Errorf("%q: no event: %s", s, triggerSyntax)
	}
	if i := strings.IndexAny(head, " \t\n"); i >= 0 {
		t.Event, t.Expr = head[:i], strings.TrimSpace(head[i+1:])
	} else {
		t.Event = head
	}
	if strings.ContainsAny(t.Event, `"'()=<>!&|~`) {
		return t, fmt.Errorf("%q: event %q: put a space between the event and its condition: %s", s, t.Event, triggerSyntax)
	}
	action, limit, hasLimit := strings.Cut(tail, ",")
	switch a := strings.TrimSpace(action); a {
	case "snapshot":
		t.Action = consumer.TriggerSnapshot
	case "stop":
		t.Action = consumer.TriggerStop
	case "start":
		t.Action = consumer.TriggerStart
	case "rotate":
		t.Action = consumer.TriggerRotate
	case "":
		return t, fmt.Errorf("%q: no action: %s", s, triggerSyntax)
	default:
		return t, fmt.Errorf("%q: unknown action %q: %s", s, a, triggerSyntax)
	}
	if hasLimit {
		every, ok := strings.CutPrefix(strings.TrimSpace(limit), "every")
		if !ok {
			return t, fmt.Errorf("%q: rate limit %q: want ', every DURATION' (10s, 500ms)", s, strings.TrimSpace(limit))
		}
		d, err := time.ParseDuration(strings.TrimSpace(every))
		if err != nil {
			return t, fmt.Errorf("%q: rate limit: %w", s, err)
		}
		if d <= 0 {
			return t, fmt.Errorf("%q: rate limit every %v: want a positive duration", s, d)
		}
		t.Interval = d
	}
	return t, nil
}

// lastColonOutsideQuotes returns the index of the last ':' of s that is
// not inside a quoted string of the filter language, or -1.
func lastColonOutsideQuotes(s string) int {
	last := -1
	var quote byte
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == ':' && i > 0 && (s[i-1] == ' ' || s[i-1] == '\t'):
			// The action's colon follows a space; an event's
			// system:name colon does not.
			last = i
		}
	}
	return last
}

// triggerNote writes what each trigger did, one line each, to w.
func triggerNote(w io.Writer, s *consumer.Session) {
	counts, err := s.TriggerCounts()
	if err != nil || len(counts) == 0 {
		return
	}
	snaps, serr := s.TriggerSnapshots()
	for i, c := range counts {
		fmt.Fprintf(w, "trigger %d (%s): condition held %d times, %s %d times\n", i+1, c.Trigger, c.Matched, actionVerb(c.Trigger.Action), c.Fired)
	}
	if snaps > 0 {
		fmt.Fprintf(w, "triggers wrote %d snapshots\n", snaps)
	}
	if rots := s.TriggerRotations(); rots > 0 {
		fmt.Fprintf(w, "triggers rotated the trace %d times\n", rots)
	}
	if serr != nil {
		fmt.Fprintf(w, "a trigger's snapshot failed: %v\n", serr)
	}
}

// actionVerb names what an action did.
func actionVerb(a consumer.TriggerAction) string {
	switch a {
	case consumer.TriggerSnapshot:
		return "snapshot"
	case consumer.TriggerStop:
		return "stopped recording"
	case consumer.TriggerStart:
		return "started recording"
	case consumer.TriggerRotate:
		return "rotated the trace"
	}
	return a.String()
}
