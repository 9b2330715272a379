package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/filter"
	"github.com/kconsume/kconsume/profile"
	"github.com/kconsume/kconsume/relayfmt"
)

// fieldFilters is report --filter: expressions in ftrace's event filter
// language over the recorded events' fields, each for the events its
// pattern names (all, without one). An event is printed when every
// filter that names it passes; with filters given, an event none names
// is not printed, as trace-cmd report -F has it.
//
// The filter package evaluates a raw record laid out as a tracefs format:
// each event class gets a format made from its fields (integers and
// character arrays inline, strings as __data_loc), and each event a
// record of its decoded values in that layout.
type fieldFilters struct {
	specs   []fieldFilterSpec
	classes map[*relayfmt.EventClass]*classFilters
	rec     []byte
}

// fieldFilterSpec is one --filter: an event pattern ("" for all) and an
// expression.
type fieldFilterSpec struct {
	event, expr string
}

// classFilters is what the filters are for one event class: the ones
// that name it, parsed against its format (nil: none names it), and
// where the format puts each field.
type classFilters struct {
	flts []*filter.Filter
	lay  []fieldSlot
	size int // the fixed part of the record
}

// fieldSlot is where a payload field goes in the record: at off, size
// bytes inline, or a __data_loc word for a string; skip for a field no
// expression can name (arrays of integers, sequences).
type fieldSlot struct {
	off, size int
	str, skip bool
}

// Set takes one --filter: EVENT:EXPR, or EXPR for every event.
func (f *fieldFilters) Set(s string) error {
	// An expression has no ':' but in its strings, so one before the
	// first byte no event pattern holds ends the events' pattern.
	event, expr, ok := splitFilter(s)
	if !ok {
		event, expr = "", s
	}
	if strings.TrimSpace(expr) == "" {
		return errors.New("an empty filter")
	}
	f.specs = append(f.specs, fieldFilterSpec{event, expr})
	return nil
}

func (f *fieldFilters) String() string { return "" }

// on reports whether any --filter was given.
func (f *fieldFilters) on() bool { return len(f.specs) > 0 }

// pass reports whether the event of class c with values vals, on cpu,
// passes the filters. It fails when an expression that names c's events
// does not parse against its fields: the kernel's error, with the event.
func (f *fieldFilters) pass(c *relayfmt.EventClass, prof *profile.Profile, vals []relayfmt.Value, cpu uint32) (bool, error) {
	cf, err := f.class(c, prof)
	if err != nil || cf.flts == nil {
		return false, err
	}
	f.rec = cf.record(f.rec[:0], vals)
	for _, flt := range cf.flts {
		if !flt.Match(f.rec, "", int(cpu)) {
			return false, nil
		}
	}
	return true, nil
}

// class returns c's filters, parsing them the first time; an event
// pattern names c's events by their name or, under prof, their ftrace
// one.
func (f *fieldFilters) class(c *relayfmt.EventClass, prof *profile.Profile) (*classFilters, error) {
	if cf, ok := f.classes[c]; ok {
		return cf, nil
	}
	if f.classes == nil {
		f.classes = map[*relayfmt.EventClass]*classFilters{}
	}
	cf := &classFilters{}
	f.classes[c] = cf
	format := cf.format(c)
	for _, sp := range f.specs {
		if sp.event != "" && !matchPattern(sp.event, c.Name, ftraceName(prof, c.Name)) {
			continue
		}
		flt, err := filter.Parse(sp.expr, format)
		if err != nil {
			if sp.event == "" {
				// A filter for every event does not apply to the
				// events that lack its fields: they fail it (a jump
				// past the program's end is the kernel's FALSE).
				cf.flts = append(cf.flts, &filter.Filter{Prog: []filter.Inst{{Pred: &filter.Pred{Kind: filter.KindNever}, Jump: 2}}})
				continue
			}
			return nil, fmt.Errorf("--filter for %s: %w", c.Name, err)
		}
		for _, p := range flt.Preds() {
			if p.Field.Loc == filter.LocComm {
				return nil, fmt.Errorf("--filter for %s: position %d: COMM: a trace does not record each event's task name; use common_pid", c.Name, p.Pos)
			}
		}
		cf.flts = append(cf.flts, flt)
	}
	return cf, nil
}

// format returns a tracefs format of c's fields for the filter package,
// and sets where each field goes.
func (cf *classFilters) format(c *relayfmt.EventClass) *tracefs.Format {
	f := &tracefs.Format{Name: c.Name}
	off := 8 // past what the kernel's records hold of the common fields
	for _, fl := range c.Fields {
		s := fieldSlot{off: off}
		tf := tracefs.Field{Name: fl.Name, Offset: off}
		switch {
		case fl.Kind == relayfmt.Scalar:
			s.size = fl.Elem.Size()
			tf.Type, tf.Size, tf.Signed = intName(fl.Elem), s.size, fl.Elem.Signed()
		case fl.Kind == relayfmt.Array && fl.Text:
			s.size = fl.Len
			tf.Type, tf.Size, tf.ArrayLen = "char", fl.Len, fl.Len
		case fl.Kind == relayfmt.String:
			s.size, s.str = 4, true
			tf.Type, tf.Size, tf.ArrayLen, tf.Loc = "char", 4, -1, tracefs.DataLoc
		default:
			cf.lay = append(cf.lay, fieldSlot{skip: true})
			continue
		}
		off += s.size
		cf.lay = append(cf.lay, s)
		f.Fields = append(f.Fields, tf)
	}
	cf.size = off
	return f
}

// intName is a C type of t's size and sign, as format files name them.
func intName(t relayfmt.IntType) string {
	n := fmt.Sprintf("u%d", 8*t.Size())
	if t.Signed() {
		n = "s" + n[1:]
	}
	return n
}

// record appends to rec the record of vals laid out as cf's format.
func (cf *classFilters) record(rec []byte, vals []relayfmt.Value) []byte {
	rec = append(rec, make([]byte, cf.size)...)
	for i, v := range vals {
		if i >= len(cf.lay) || cf.lay[i].skip {
			continue
		}
		s := cf.lay[i]
		switch {
		case s.str:
			// __data_loc: offset in the low 16 bits, length (with the
			// NUL) in the high ones.
			text := v.Raw()
			loc := uint32(len(rec)) | uint32(len(text)+1)<<16
			binary.LittleEndian.PutUint32(rec[s.off:], loc)
			rec = append(append(rec, text...), 0)
		case v.Field.Kind == relayfmt.Array:
			copy(rec[s.off:s.off+s.size], v.Raw())
		default:
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], v.Uint(0))
			copy(rec[s.off:s.off+s.size], b[:s.size])
		}
	}
	return rec
}

// ftraceName returns the tracefs name of the event called name under
// prof, or "" where it has none or prof is nil.
func ftraceName(prof *profile.Profile, name string) string {
	if prof == nil {
		return ""
	}
	orig, _ := prof.Original(name)
	return orig
}

// matchPattern reports whether the event pattern p names the event
// called name (or orig, its ftrace name under another profile).
func matchPattern(p, name, orig string) bool {
	for _, n := range []string{name, orig} {
		if n == "" {
			continue
		}
		if ok, _ := path.Match(p, n); ok {
			return true
		}
		if _, short, found := strings.Cut(n, ":"); found && !strings.Contains(p, ":") {
			if ok, _ := path.Match(p, short); ok {
				return true
			}
		}
	}
	return false
}
