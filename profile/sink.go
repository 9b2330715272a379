package profile

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/relayfmt"
)

// Env is what a profile adds to the metadata's env block.
type Env struct {
	Strings map[string]string
	Ints    map[string]int64
}

// LTTngEnv returns the env entries lttng-modules writes for the kernel
// domain (src/metadata-ctf-1-8.c): hostname, sysname, kernel_release,
// kernel_version (from uname), the tracer's name and version,
// trace_buffering_scheme, trace_name and trace_creation_datetime (at
// created, in LTTng's ISO 8601 basic form). It fails only when uname
// fails.
func LTTngEnv(traceName string, created time.Time) (Env, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return Env{}, fmt.Errorf("uname: %w", err)
	}
	return Env{
		Strings: map[string]string{
			"hostname":                unix.ByteSliceToString(u.Nodename[:]),
			"sysname":                 unix.ByteSliceToString(u.Sysname[:]),
			"kernel_release":          unix.ByteSliceToString(u.Release[:]),
			"kernel_version":          unix.ByteSliceToString(u.Version[:]),
			"trace_buffering_scheme":  "global",
			"trace_name":              traceName,
			"trace_creation_datetime": created.Format("20060102T150405-0700"),
		},
		Ints: map[string]int64{"tracer_major": LTTngMajor, "tracer_minor": LTTngMinor, "tracer_patchlevel": LTTngPatchlevel},
	}, nil
}

// Sink returns a sink that writes through inner, each metadata text
// renamed by p and given env; packets pass as they are, so the profile
// costs nothing per event. The metadata is rewritten only when the
// channel changes it (an event class is added).
func (p *Profile) Sink(inner relayfmt.Sink, env Env) relayfmt.Sink {
	return &sink{Sink: inner, p: p, env: env, cache: map[*relayfmt.EventClass]*relayfmt.EventClass{}}
}

type sink struct {
	relayfmt.Sink
	p     *Profile
	env   Env
	cache map[*relayfmt.EventClass]*relayfmt.EventClass
}

// WriteMetadata parses metadata text relayfmt wrote, renames it and
// writes the result. It fails when text is not such metadata.
func (s *sink) WriteMetadata(text []byte) error {
	m, err := relayfmt.ParseMetadata(text)
	if err != nil {
		return fmt.Errorf("profile %s: %w", s.p.Name, err)
	}
	return s.write(m, nil)
}

// WriteMetadataOf renames a copy of the channel's metadata (each class
// once over the channel's life) and writes it: no parse, so a channel of
// hundreds of classes starts as fast as without a profile.
func (s *sink) WriteMetadataOf(m *relayfmt.Metadata) error {
	c := *m
	c.Classes = slices.Clone(m.Classes)
	return s.write(&c, s.cache)
}

// Local reports whether the inner sink is a local one (relayfmt.LocalSink):
// the profile adds nothing to a packet's way.
func (s *sink) Local() bool { return relayfmt.IsLocal(s.Sink) }

// WriteFinal forwards the last packets of a failed stream to the inner
// sink (relayfmt.FinalSink) and returns its error.
func (s *sink) WriteFinal(name string, packets ...[]byte) error {
	return relayfmt.WriteFinal(s.Sink, name, packets...)
}

// CloseChunk forwards to the inner sink (relayfmt.Rotator), which must
// be one: the profile rotates only as its sink does.
func (s *sink) CloseChunk(c relayfmt.Chunk, next bool) error {
	r, ok := s.Sink.(relayfmt.Rotator)
	if !ok {
		return relayfmt.ErrNoRotate
	}
	return r.CloseChunk(c, next)
}

// Rotates reports whether the inner sink writes chunks.
func (s *sink) Rotates() bool { return relayfmt.CanRotate(s.Sink) }

// Reserve forwards to the inner sink (relayfmt.Reserver) and returns
// its error.
func (s *sink) Reserve(names []string, packetSize int) error {
	return relayfmt.Reserve(s.Sink, names, packetSize)
}

// write gives m, which it may change, the env and the names, and writes
// it through.
func (s *sink) write(m *relayfmt.Metadata, cache map[*relayfmt.EventClass]*relayfmt.EventClass) error {
	m.Env = maps.Clone(m.Env)
	if m.Env == nil {
		m.Env = map[string]string{}
	}
	maps.Copy(m.Env, s.env.Strings)
	m.EnvInt = maps.Clone(m.EnvInt)
	if len(s.env.Ints) > 0 {
		if m.EnvInt == nil {
			m.EnvInt = map[string]int64{}
		}
		maps.Copy(m.EnvInt, s.env.Ints)
		for k := range s.env.Ints {
			delete(m.Env, k)
		}
	}
	if err := s.p.apply(m, cache); err != nil {
		return err
	}
	return s.Sink.WriteMetadata(m.TSDL())
}

// Unrename returns a copy of m with the class names of the profile it
// was written with turned back into ftrace names (fields keep theirs),
// so a reader can count and filter traces of every profile alike.
func Unrename(m *relayfmt.Metadata) *relayfmt.Metadata {
	p := Detect(m)
	if p.rename == nil {
		return m
	}
	out := *m
	out.Classes = make([]*relayfmt.EventClass, len(m.Classes))
	for i, c := range m.Classes {
		if c == nil {
			continue
		}
		if name, ok := p.Original(c.Name); ok && !strings.Contains(c.Name, ":") {
			nc := *c
			nc.Name = name
			out.Classes[i] = &nc
			continue
		}
		out.Classes[i] = c
	}
	return &out
}

// Relabel rewrites the metadata of the trace in dir, which the session
// whose sink is s wrote past its sink (kconsume ctl rewind), in the
// profile of s with its env; packets are left as they are. It does
// nothing when s is not a profile's sink, and fails when the metadata
// cannot be read, parsed or written.
func Relabel(s relayfmt.Sink, dir string) error {
	ps, ok := s.(*sink)
	if !ok {
		return nil
	}
	text, err := os.ReadFile(filepath.Join(dir, relayfmt.MetadataFile))
	if err != nil {
		return fmt.Errorf("profile %s: %w", ps.p.Name, err)
	}
	ds, err := relayfmt.NewDirSink(dir)
	if err != nil {
		return err
	}
	err = ps.p.Sink(ds, ps.env).WriteMetadata(text)
	return errors.Join(err, ds.Close())
}
