// Package consumer is kconsume's engine: it loads the BPF recorder,
// attaches it to tracepoints, maps the per-CPU rings and drains them in
// place into a relayfmt channel, accounting for every lost record.
//
// The data path reads from the file and type names: the recorder
// package is the BPF side and its counters; each stream's source
// (ringbuf.go, pktring.go, perfbuf.go behind the interface in stream.go)
// is a ring read in place; the drainer (drainer.go, hotplug.go) decides
// when to read and walks the rings (walk.go) through the reorder window
// (reorder.go, checkpoint.go); the writer (writer.go, with the layout
// package) transcodes records into the channel's events; losses
// (losses.go) places every lost record where it was lost; stats.go
// gathers the counts; crash.go keeps what a kill would lose for
// kconsume recover; filters.go resolves the field filters. A Session
// (session.go, control.go, synth.go) composes them and owns their
// lifetime.
package consumer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/consumer/layout"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/relayfmt"
	"github.com/kconsume/kconsume/synth"
)

// Errors of the session API.
var (
	ErrClosed       = errors.New("session closed")
	ErrUnknownEvent = errors.New("no tracepoint matches")
	ErrNeedsPerCPU  = errors.New("operation needs per-CPU buffers, not global mode")
	ErrNotSupported = recorder.ErrNotSupported
	ErrNoSuchCPU    = errors.New("no such CPU")
)

// Session is a running recording: the recorder's BPF programs attached,
// the rings mapped, a drainer goroutine writing into a relayfmt channel.
// Its methods are safe for concurrent use.
type Session struct {
	cfg    Config
	ncpu   int
	rec    *recorder.Recorder
	dr     *drainer
	w      *writer
	ch     *relayfmt.Channel
	events []*tracefs.Format
	stacks []layout.Stack   // the call chains each event records (nil: none)
	ctxs   []layout.Context // the contexts every event records
	symErr error            // why the kernel's symbols are not in the trace
	// kmods are the modules loaded at the last save of the kernel's
	// symbols (refreshKernelSymbols); nil when none was saved.
	kmods map[string]string
	umaps *userMaps  // what processes map, for user call chains (nil: none)
	saver *userSaver // saves umaps' symbols as they change (nil: none)
	// ustackSeen holds every process read from the recorder's map of
	// those with user call chains (userStackProcs).
	ustackMu   sync.Mutex
	ustackSeen map[int32]bool
	// mapsLost counts the kernel's mmap records it dropped (MappingsLost).
	mapsLost uint64
	// symsUnread and symsUnheld are UserFilesUnread's.
	symsUnread, symsUnheld int

	synthMu sync.Mutex // guards synth after New
	synth   map[string]synthClass

	started atomic.Bool
	first   sync.Once // the first Start's setup of the channel
	// gateMu orders Start and Stop against Close, which shuts the gate
	// for good (gateShut) before it drains; Start and Stop fail with
	// ErrClosed after it.
	gateMu    sync.Mutex
	gateShut  bool
	closeOnce sync.Once
	closeErr  error
	// final holds the counts at Close; Stats, which the control server
	// may call while Close runs, reads it.
	final atomic.Pointer[[]CPUStats]
	// finalKept holds the field filters' counts at Close (FilterKept).
	finalKept atomic.Pointer[map[string]uint64]
	// finalStacks holds the stack counts at Close (StackCounts).
	finalStacks atomic.Pointer[recorder.StackCounts]
	// finalTrig holds the triggers' counts at Close (TriggerCounts).
	finalTrig atomic.Pointer[[]TriggerCount]
	// keepErr says why a kill of this recording would lose what it
	// holds uncounted (crash.go), nil when recover would count it.
	keepErr error
}

// New loads and attaches the recorder for cfg and starts draining; the
// gate is closed until Start. It fails with ErrConfig for bad settings,
// ErrUnknownEvent (naming the pattern) when an event pattern matches no
// tracepoint, ErrNotSupported when the kernel lacks a needed feature, or
// the kernel's error when loading or attaching fails.
func New(cfg Config) (*Session, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if len(cfg.Events) == 0 && len(cfg.Objects) == 0 {
		return nil, fmt.Errorf("%w: no events", ErrConfig)
	}
	fs, err := tracefs.Find()
	if err != nil {
		return nil, err
	}
	tps, synths := splitSynth(cfg.Events)
	tps, probeSpecs := splitProbes(tps)
	formats, err := resolveEvents(fs, tps)
	if err != nil {
		return nil, err
	}
	probes, formats, err := addProbes(fs, probeSpecs, formats)
	if err != nil {
		return nil, err
	}
	users, userBuf, err := recorder.SysUsers(fs, formats)
	if err != nil {
		return nil, err
	}
	synthDefs, err := resolveSynth(cfg.Synth, synths)
	if err != nil {
		return nil, err
	}
	var hooks []*tracefs.Format
	wake := slices.ContainsFunc(synthDefs, func(e *synth.Event) bool { return e.Name == synth.WakeupLatency })
	if wake {
		if hooks, err = recorder.WakeupHooks(fs, formats); err != nil {
			return nil, err
		}
	}
	if cfg.Sink == nil {
		if _, err := os.Stat(filepath.Join(cfg.Dir, "metadata")); err == nil {
			return nil, fmt.Errorf("%w: %s already holds a trace", ErrConfig, cfg.Dir)
		}
	}
	filters, err := resolveFilters(fs, cfg.Filters, formats)
	if err != nil {
		return nil, err
	}
	stacks, err := resolveStacks(fs, cfg.Stacks, formats)
	if err != nil {
		return nil, err
	}
	ctxs, err := layout.ParseContexts(cfg.Contexts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	trigs, err := resolveTriggers(fs, cfg.Triggers, formats, users)
	if err != nil {
		return nil, err
	}
	opts := recorder.EventOptions(cfg.recorder(), formats, users, filters, stacks, ctxs, len(synthDefs), wake).WithProbes(probes).WithTriggers(trigs)
	s, err := newSession(cfg, len(formats)+len(hooks), opts)
	if err != nil {
		return nil, err
	}
	s.stacks, s.ctxs = stacks, ctxs
	// A profile's sink writes into Dir too (record's -o); a sink alone
	// (relayd without -o, tests) has nowhere for the symbols.
	if cfg.Dir != "" && slices.ContainsFunc(stacks, func(st layout.Stack) bool { return st&StackKernel != 0 }) {
		// A trace without them still shows the addresses: a note, not
		// a failure.
		s.kmods = loadedModules()
		s.symErr = saveKernelSymbols(cfg.Dir, nil)
	}
	if cfg.Dir != "" && slices.ContainsFunc(stacks, func(st layout.Stack) bool { return st&StackUser != 0 }) {
		clockID, _ := checkClock(cfg.Clock)
		if s.umaps, err = startUserMaps(s.ncpu, clockID); err != nil {
			s.symErr = err // the chains are still recorded, as addresses
		}
	}
	err = s.addTracepoints(formats, hooks, wake, users, userBuf)
	if err == nil {
		err = s.addSynth(synthDefs)
	}
	if err == nil && wake {
		err = s.linkWakeup()
	}
	if err == nil {
		err = s.rec.AddObjects(cfg.Objects, s.declareSynth)
	}
	if err != nil {
		s.Close()
		s.removeOutput()
		return nil, err
	}
	s.symbolsAtRotation()
	if s.saver = startUserSaver(s); s.saver != nil {
		s.dr.nudge = s.saver.poke
	}
	if err := s.startInterval(); err != nil {
		s.Close()
		s.removeOutput()
		return nil, err
	}
	s.dr.start()
	return s, nil
}

// linkWakeup tells the recorder's sched_switch hook the class of
// wakeup_latency, which exists only once the synthetic events are
// declared.
func (s *Session) linkWakeup() error {
	c, ok := s.synth[synth.WakeupLatency]
	if !ok {
		return fmt.Errorf("synthetic:%s is not declared", synth.WakeupLatency)
	}
	return s.rec.LinkWakeup(c.key)
}

// removeOutput removes what a session that failed to start wrote into its
// directory: the metadata (no stream file exists before the first record).
func (s *Session) removeOutput() {
	if s.cfg.Sink == nil || s.cfg.Dir != "" && relayfmt.CanRotate(s.cfg.Sink) {
		_ = os.Remove(filepath.Join(s.cfg.Dir, "metadata"))
	}
	if s.cfg.Dir != "" {
		_ = os.Remove(filepath.Join(s.cfg.Dir, KernelSymbols))
		_ = os.Remove(filepath.Join(s.cfg.Dir, UserSymbols))
	}
}

// newSession loads the recorder for nevents event keys, maps the rings
// and opens the channel; no event is attached yet and the drainer does
// not run.
func newSession(cfg Config, nevents int, opts *recorder.Options) (_ *Session, err error) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible CPUs: %w", err)
	}
	s := &Session{cfg: cfg, ncpu: ncpu}
	defer func() {
		if err != nil {
			if s.ch != nil {
				_ = s.ch.Close()
				s.removeOutput()
			}
			s.release()
		}
	}()
	transport, err := chooseTransport(cfg.Transport)
	if err != nil {
		return nil, err
	}
	clockID, err := checkClock(cfg.Clock)
	if err != nil {
		return nil, err
	}
	if s.rec, err = recorder.Load(cfg.recorder(), ncpu, transport, nevents, opts); err != nil {
		return nil, err
	}
	if s.dr, err = newDrainer(cfg, s.rec, clockID); err != nil {
		return nil, err
	}
	sink := cfg.Sink
	if sink == nil {
		if sink, err = relayfmt.NewDirSink(cfg.Dir); err != nil {
			return nil, err
		}
	}
	env := map[string]string{"transport": transport.String()}
	if u, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		env["kernel_release"] = strings.TrimSpace(string(u))
	}
	if h, err := os.Hostname(); err == nil {
		env["hostname"] = h
	}
	for k, v := range cfg.Env {
		env[k] = v
	}
	subSize, nSub := cfg.SubbufSize, cfg.NSubbufs
	if s.rec.On(recorder.PathPackets) {
		// The rings hold the packets; the channel's own sub-buffers
		// carry only losses, and packets for a remote sink.
		subSize, nSub = s.rec.PktElem(), relayfmt.MinSubbufs
	}
	sc, scLen := streamContext(cfg)
	s.ch, err = relayfmt.NewChannel(relayfmt.Config{
		SubbufSize:    subSize,
		NSubbufs:      nSub,
		CPUs:          ncpu,
		Global:        cfg.Global,
		Mode:          cfg.Mode,
		Clock:         clockDesc(cfg.Clock, clockID),
		Env:           env,
		StreamContext: sc,
		Room:          s.dr.poll.Wake,
	}, sink)
	if err != nil {
		if cfg.Sink == nil {
			_ = sink.Close()
		}
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.RotateSize > 0 || cfg.RotateInterval > 0 || cfg.rotates() {
		if !relayfmt.CanRotate(sink) {
			return nil, fmt.Errorf("%w: rotation needs a sink that writes chunks (relayfmt.Rotator, as package chunks' Sink)", ErrConfig)
		}
		// The packets are the channel's: in packet mode the rings'.
		if err := CheckRotateSize(cfg.RotateSize, s.ch.Streams(), subSize); err != nil {
			return nil, err
		}
	}
	s.w = &writer{ch: s.ch, global: cfg.Global, streamCtx: scLen}
	s.dr.setWriter(s.w)
	s.keepErr = errors.New("no local directory")
	if cfg.Dir != "" && (opts == nil || opts.Spec == nil) {
		s.keepErr = s.dr.keep.start(s.rec, cfg.Dir)
	}
	return s, nil
}

// KillCounted returns nil when kconsume recover, run on this recording's
// directory after the recording was killed, would count the events lost
// with it; else why it would not.
func (s *Session) KillCounted() error { return s.keepErr }

func chooseTransport(t Transport) (Transport, error) {
	rbErr := features.HaveMapType(ebpf.RingBuf)
	switch t {
	case Auto:
		if rbErr == nil {
			return Ringbuf, nil
		}
		return Perf, nil
	case Ringbuf:
		if rbErr != nil {
			return 0, fmt.Errorf("%w: BPF ring buffers (Linux 5.8): %w", ErrNotSupported, rbErr)
		}
	}
	return t, nil
}

// checkClock returns the clock_gettime id of c, or ErrNotSupported when
// the kernel has no BPF helper for it.
func checkClock(c Clock) (int32, error) {
	switch c {
	case Boot:
		if err := features.HaveProgramHelper(ebpf.TracePoint, asm.FnKtimeGetBootNs); err != nil {
			return 0, fmt.Errorf("%w: clock boot (bpf_ktime_get_boot_ns, Linux 5.8): %w", ErrNotSupported, err)
		}
		return unix.CLOCK_BOOTTIME, nil
	case TAI:
		if err := features.HaveProgramHelper(ebpf.TracePoint, asm.FnKtimeGetTaiNs); err != nil {
			return 0, fmt.Errorf("%w: clock tai (bpf_ktime_get_tai_ns, Linux 6.1): %w", ErrNotSupported, err)
		}
		return unix.CLOCK_TAI, nil
	}
	return unix.CLOCK_MONOTONIC, nil
}

// clockDesc describes the clock for the metadata, with its zero as wall
// time: the realtime-minus-clock difference from the closest of a few
// paired reads.
func clockDesc(c Clock, id int32) relayfmt.Clock {
	best, off := int64(-1), int64(0)
	for i := 0; i < 5; i++ {
		var a, b, r unix.Timespec
		_ = unix.ClockGettime(id, &a)
		_ = unix.ClockGettime(unix.CLOCK_REALTIME, &r)
		_ = unix.ClockGettime(id, &b)
		if d := b.Nano() - a.Nano(); best < 0 || d < best {
			best, off = d, r.Nano()-(a.Nano()+d/2)
		}
	}
	names := map[Clock]string{Mono: "monotonic", Boot: "boottime", TAI: "tai"}
	return relayfmt.Clock{Name: names[c], Description: "kernel " + names[c] + " clock", Offset: off}
}

// addTracepoints defines a class per recorded event and has the recorder
// attach it; event i gets key i, its class id. The hooks (tracepoints
// wakeup_latency needs but the trace does not record) take the keys
// after them. With wake set, the sched_waking and sched_switch keys
// carry the wakeup_latency hooks. users holds each recorded event's
// user-space fields, of which the recorder keeps userBuf bytes each
// (sysUsers).
func (s *Session) addTracepoints(formats, hooks []*tracefs.Format, wake bool, users []*recorder.SysUser, userBuf int) error {
	at, err := s.rec.AttachSyscalls(formats, users)
	if err != nil {
		return err
	}
	// One declaration for all: each one rewrites the whole metadata.
	names, layouts := make([]string, len(formats)), make([]*layout.Layout, len(formats))
	for i, f := range formats {
		if layouts[i], err = layout.NewAt(f, s.cfg.Adjust[f.FullName()], at[i]); err != nil {
			return err
		}
		var st layout.Stack
		if i < len(s.stacks) {
			st = s.stacks[i]
		}
		layouts[i].AddTail(s.ctxs, st)
		names[i] = f.FullName()
	}
	ids, err := s.w.declareAll(names, layouts)
	if err != nil {
		return err
	}
	for i, id := range ids {
		if id != uint32(i) {
			return fmt.Errorf("event %s: class id %d, want %d", names[i], id, i)
		}
	}
	if err := s.rec.AttachEvents(recorder.Events{Formats: formats, Hooks: hooks, Layouts: layouts, Users: users, UserBuf: userBuf, Wake: wake, StackDepth: s.cfg.StackDepth}); err != nil {
		return err
	}
	s.events = formats
	return nil
}

// Events returns the formats of the recorded tracepoints.
func (s *Session) Events() []*tracefs.Format { return s.events }

// Channel returns the relayfmt channel the session writes into.
func (s *Session) Channel() *relayfmt.Channel { return s.ch }

// Transport returns the transport in use.
func (s *Session) Transport() Transport { return s.rec.Transport() }

// CPUs returns the number of possible CPUs, the per-CPU stream count.
func (s *Session) CPUs() int { return s.ncpu }

// Config returns the session's configuration with defaults filled in.
func (s *Session) Config() Config { return s.cfg }

// Close stops recording, detaches every program, drains and writes out
// what the rings hold, and closes the channel (in overwrite mode writing
// the retained sub-buffers). It is idempotent; later calls return the
// first call's result.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		s.gateMu.Lock()
		s.gateShut = true
		if s.rec != nil {
			s.closeTriggers()
			if err := s.rec.SetRunning(false); err != nil {
				errs = append(errs, err)
			}
		}
		s.started.Store(false)
		s.gateMu.Unlock()
		if s.rec != nil {
			errs = append(errs, s.rec.Detach()...)
			if len(s.cfg.Triggers) > 0 {
				// A start trigger that ran as the gate closed is detached now.
				errs = append(errs, s.rec.SetRunning(false))
				s.keepTriggerCounts()
			}
		}
		if s.dr != nil && s.dr.running() {
			errs = append(errs, s.dr.do(func() error {
				s.dr.flushAll()
				return nil
			}))
			_ = s.dr.do(nil)
		}
		if s.dr != nil && s.dr.loopErr != nil {
			errs = append(errs, s.dr.loopErr)
		}
		if s.ch != nil {
			loaded := s.rec != nil && s.rec.Loaded()
			if loaded {
				// Before the channel closes, as the user symbols.
				errs = append(errs, s.refreshKernelSymbols())
			}
			if loaded && s.umaps != nil {
				// Before the channel closes: a rotated trace's last
				// chunk takes them with it.
				if s.saver != nil {
					s.saver.halt()
				}
				errs = append(errs, s.saveUserSymbols())
			}
			errs = append(errs, s.ch.Close())
			if loaded {
				final, kept := s.stats(), s.FilterKept()
				s.final.Store(&final)
				s.finalKept.Store(&kept)
				stacks, err := s.rec.StackCounts()
				errs = append(errs, err)
				s.finalStacks.Store(&stacks)
			}
		}
		s.release()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// release frees kernel objects and mappings.
func (s *Session) release() {
	if s.saver != nil {
		s.saver.halt()
	}
	if s.umaps != nil {
		s.umaps.close()
	}
	if s.dr != nil {
		if s.dr.rot.timer != nil {
			s.dr.rot.timer.Close()
		}
		s.dr.close()
	}
	if s.rec != nil {
		s.rec.Close()
	}
}

// LoadObject reads a BPF object built on bpf/kc_synth.h for
// Config.Objects (recorder.LoadObject).
func LoadObject(path string) (*ebpf.CollectionSpec, error) { return recorder.LoadObject(path) }

// FilterKept returns, for each recorded event with a field filter
// (Config.Filters), how many of its events the filter kept so far; after
// Close, in all.
func (s *Session) FilterKept() map[string]uint64 {
	if k := s.finalKept.Load(); k != nil {
		return *k
	}
	out := map[string]uint64{}
	if s.rec == nil || !s.rec.Loaded() {
		return out
	}
	for i, f := range s.events {
		if n, ok := s.rec.FilterKept(i); ok {
			out[f.FullName()] = n
		}
	}
	return out
}
