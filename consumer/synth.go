package consumer

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/synth"
)

// SynthSystem is the system of synthetic events: "-e synthetic:NAME".
const SynthSystem = "synthetic"

// ErrStopped is returned when an injected event meets a closed gate: the
// session, or the chosen CPU's buffer, is stopped.
var ErrStopped = recorder.ErrStopped

// ErrInjectLost is returned when an injected event found its ring full;
// it is counted and reported in the stream like any kernel-side loss.
var ErrInjectLost = recorder.ErrInjectLost

// splitSynth separates "synthetic:" patterns from tracepoint ones.
func splitSynth(patterns []string) (tracepoints, synthetic []string) {
	for _, p := range patterns {
		if name, ok := strings.CutPrefix(p, SynthSystem+":"); ok {
			synthetic = append(synthetic, name)
		} else {
			tracepoints = append(tracepoints, p)
		}
	}
	return tracepoints, synthetic
}

// resolveSynth returns the definitions in defs matched by the name
// patterns (globs), each once, in definition order, then the built-in
// events patterns name exactly. A pattern that matches nothing fails with
// ErrUnknownEvent; a definition of a built-in name with ErrConfig.
func resolveSynth(defs []*synth.Event, patterns []string) ([]*synth.Event, error) {
	for _, d := range defs {
		if synth.Builtin(d.Name) != nil {
			return nil, fmt.Errorf("%w: synthetic:%s is built in and cannot be defined", ErrConfig, d.Name)
		}
	}
	picked := map[string]bool{}
	var builtins []*synth.Event
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("%w: synthetic:%s: %w", ErrConfig, p, err)
		}
		if b := synth.Builtin(p); b != nil {
			if !slices.ContainsFunc(builtins, func(e *synth.Event) bool { return e.Name == p }) {
				builtins = append(builtins, b)
			}
			continue
		}
		n := 0
		for _, d := range defs {
			if ok, _ := path.Match(p, d.Name); ok {
				picked[d.Name] = true
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("%w: synthetic:%s is not defined (see kconsume synth list)", ErrUnknownEvent, p)
		}
	}
	var out []*synth.Event
	for _, d := range defs {
		if picked[d.Name] {
			out = append(out, d)
			delete(picked, d.Name)
		}
	}
	return append(out, builtins...), nil
}

// addSynth declares each synthetic event in the channel; the BPF side
// needs no description of it, its payload arrives in final form. After
// New it must run on the drainer goroutine, which reads the layouts.
func (s *Session) addSynth(defs []*synth.Event) error {
	s.synthMu.Lock()
	defer s.synthMu.Unlock()
	for _, e := range defs {
		if !e.Final() {
			return fmt.Errorf("%w: synthetic:%s is not finalized", ErrConfig, e.Name)
		}
		name := SynthSystem + ":" + e.Name
		id, err := s.w.declare(name, e.RelayFields(), &layout.Layout{Name: name, Fields: e.RelayFields(), AsIs: true})
		if err != nil {
			return err
		}
		if s.synth == nil {
			s.synth = map[string]synthClass{}
		}
		s.synth[e.Name] = synthClass{ev: e, key: id}
	}
	return nil
}

type synthClass struct {
	ev  *synth.Event
	key uint32
}

// Synth returns the session's synthetic event called name, or nil.
func (s *Session) Synth(name string) *synth.Event {
	s.synthMu.Lock()
	defer s.synthMu.Unlock()
	return s.synth[name].ev
}

// SynthEvents returns the session's synthetic events, in class order.
func (s *Session) SynthEvents() []*synth.Event {
	s.synthMu.Lock()
	defer s.synthMu.Unlock()
	var out []*synth.Event
	for _, c := range s.synth {
		out = append(out, c.ev)
	}
	slices.SortFunc(out, func(a, b *synth.Event) int { return cmp.Compare(s.synth[a.Name].key, s.synth[b.Name].key) })
	return out
}

// EmitSynth writes one event of the synthetic event name, with payload
// built by synth.Event.Encode or a synth.Builder, into cpu's stream. It
// enters through the kernel (BPF_PROG_TEST_RUN of the injector on that
// CPU), so it gets a kernel timestamp and sorts among the kernel's
// events. The built-in klog is declared at its first use. It fails for
// an event the session does not record, with ErrStopped when recording
// is stopped, or with ErrInjectLost when the ring was full.
func (s *Session) EmitSynth(cpu int, name string, payload []byte) error {
	s.synthMu.Lock()
	c, ok := s.synth[name]
	s.synthMu.Unlock()
	if !ok && name == synth.Klog {
		err := s.dr.do(func() error {
			if s.Synth(name) != nil {
				return nil
			}
			return s.addSynth([]*synth.Event{synth.Builtin(name)})
		})
		if err != nil {
			return fmt.Errorf("declaring synthetic:%s: %w", name, err)
		}
		s.synthMu.Lock()
		c, ok = s.synth[name]
		s.synthMu.Unlock()
	}
	if !ok {
		return fmt.Errorf("%w: synthetic:%s is not recorded by this session", ErrUnknownEvent, name)
	}
	if len(payload) > c.ev.MaxPayload() {
		return fmt.Errorf("synthetic:%s: payload of %d bytes, at most %d", name, len(payload), c.ev.MaxPayload())
	}
	return s.rec.Inject(cpu, c.key, payload)
}

// declareSynth returns the class of synthetic event def, declaring it
// unless the session has it already; the definitions must then agree, as
// must a built-in's.
func (s *Session) declareSynth(def *synth.Event) (uint32, error) {
	if b := synth.Builtin(def.Name); b != nil && b.String() != def.String() {
		return 0, fmt.Errorf("%w: synthetic:%s is built in as %q, not %q", ErrConfig, def.Name, b, def)
	}
	for _, d := range s.cfg.Synth {
		if d.Name == def.Name && d.String() != def.String() {
			return 0, fmt.Errorf("%w: synthetic:%s is defined as %q, the object says %q", ErrConfig, def.Name, d, def)
		}
	}
	if c, ok := s.synth[def.Name]; ok {
		if c.ev.String() != def.String() {
			return 0, fmt.Errorf("%w: synthetic:%s is recorded as %q, the object says %q", ErrConfig, def.Name, c.ev, def)
		}
		return c.key, nil
	}
	if err := s.addSynth([]*synth.Event{def}); err != nil {
		return 0, err
	}
	return s.synth[def.Name].key, nil
}
