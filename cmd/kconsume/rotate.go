package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kconsume/kconsume/chunks"
	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/relayfmt"
)

// rotateFlags are record's rotation flags, then the chunks' sink.
type rotateFlags struct {
	size, maxSize sizeFlag
	interval      time.Duration
	intervalSet   bool // --rotate-interval given, 0 included
	maxChunks     int
	trigger       bool         // a rotate trigger is given; set by check
	sink          *chunks.Sink // set by open
	relay         bool         // relayd rotates too; set by open
}

// defineRotateFlags adds record's rotation flags to fs.
func defineRotateFlags(fs *flag.FlagSet) *rotateFlags {
	r := &rotateFlags{}
	fs.Var(&r.size, "rotate-size", "close the trace's current chunk and begin the next once its packets reach `SIZE` (at least a sub-buffer per CPU); closed chunks go to DIR/archives/BEGIN-END-ID, each a complete trace (docs/rotation.md)")
	fs.DurationVar(&r.interval, "rotate-interval", 0, "close the current chunk and begin the next at least this often (`duration`, 10m say)")
	fs.Var(&r.maxSize, "max-size", "with rotation, delete the oldest closed chunks so that they and the current chunk's --rotate-size fit in `SIZE`")
	fs.IntVar(&r.maxChunks, "max-chunks", 0, "with rotation, keep at most `N` chunks (2 or more), the current one included, deleting the oldest closed ones")
	return r
}

// enabled reports whether the trace is to rotate: by size, by interval,
// or when a rotate trigger fires.
func (r *rotateFlags) enabled() bool { return r.size > 0 || r.interval > 0 || r.trigger }

// check refuses, before anything is traced, rotation settings that
// cannot work: a zero or negative interval, a size under one sub-buffer
// per stream, a budget without rotation or too small to keep a closed
// chunk, rotation with a flight recorder, and, with relayd, rotation of
// a live session, or a budget without a local copy (relayd keeps what it
// archives).
func (r *rotateFlags) check(fs *flag.FlagSet, cfg consumer.Config, relay *relaydOut, local bool) error {
	fs.Visit(func(f *flag.Flag) { r.intervalSet = r.intervalSet || f.Name == "rotate-interval" })
	r.trigger = slices.ContainsFunc(cfg.Triggers, func(t consumer.Trigger) bool { return t.Action == consumer.TriggerRotate })
	if r.intervalSet && r.interval <= 0 {
		return fmt.Errorf("--rotate-interval %v: want a positive duration", r.interval)
	}
	if r.maxChunks < 0 {
		return fmt.Errorf("--max-chunks %d: want 2 or more", r.maxChunks)
	}
	if !r.enabled() {
		if r.maxSize > 0 || r.maxChunks > 0 {
			return errors.New("--max-size and --max-chunks need --rotate-size, --rotate-interval or a rotate trigger: without rotation the trace is one chunk, which is not deleted in part")
		}
		return nil
	}
	if cfg.Mode == relayfmt.Overwrite {
		return errors.New("rotation (--rotate-size, --rotate-interval, a rotate trigger) needs --mode discard: a flight recorder writes its sub-buffers only at a snapshot (ctl snapshot)")
	}
	if relay.enabled() {
		switch {
		case relay.live != 0:
			return errors.New("rotation (--rotate-size, --rotate-interval, a rotate trigger) does not go with --live-timer: live viewers cannot follow a chunk's new trace UUID (LTTng rotates only sessions in normal or network streaming mode, not live ones: lttng-rotate(1))")
		case !local && (r.maxSize > 0 || r.maxChunks > 0):
			return errors.New("--max-size and --max-chunks bound a local trace (-o DIR): lttng-relayd keeps every chunk it archives")
		}
	}
	if r.maxChunks == 1 {
		return errors.New("--max-chunks 1 keeps only the chunk being written, deleting every closed one: want 2 or more")
	}
	streams := 1
	if !cfg.Global {
		n, err := ebpf.PossibleCPU()
		if err != nil {
			return fmt.Errorf("possible CPUs: %w", err)
		}
		streams = n
	}
	packet := cfg.SubbufSize
	if packet == 0 {
		packet = consumer.DefaultSubbufSize
	}
	minChunk := uint64(streams) * uint64(packet)
	if r.size > 0 && uint64(r.size) < minChunk {
		return fmt.Errorf("--rotate-size %s is under one packet per stream: %d streams of %s sub-buffers need %s or more", humanBytes(uint64(r.size)), streams, humanBytes(uint64(packet)), humanBytes(minChunk))
	}
	chunk := max(uint64(r.size), minChunk)
	if r.maxSize > 0 && uint64(r.maxSize) < 2*chunk {
		return fmt.Errorf("--max-size %s is smaller than two chunks of %s: it would keep no closed chunk beside the current one", humanBytes(uint64(r.maxSize)), humanBytes(chunk))
	}
	return nil
}

// open makes the sink that writes the trace in chunks, in the session
// directory (DIR, whose trace is in DIR/kernel under --profile lttng),
// as cfg's sink.
func (r *rotateFlags) open(o *recordOpts, cfg *consumer.Config, stderr io.Writer) error {
	if !r.enabled() {
		return nil
	}
	cfg.RotateSize, cfg.RotateInterval = uint64(r.size), r.interval
	r.relay = o.relay.enabled()
	if o.relay.enabled() {
		// relayd's sink rotates (relayd.Sink.CloseChunk); a local copy
		// beside it rotates too, in the chunks sink made below, which
		// relayd's Tee wraps (relaydOut.connect).
		fmt.Fprintf(stderr, "kconsume record: the trace rotates on relayd: each closed chunk, a complete trace, goes to the session's %s directory there\n", filepath.Join(chunks.ArchivesDir, "BEGIN-END-ID"))
		if o.out == "" {
			return nil
		}
	}
	root, trace := o.out, ""
	if o.sessionDir != "" {
		root, trace = o.sessionDir, filepath.Base(o.out)
	}
	s, err := chunks.New(chunks.Config{
		Root:      root,
		Trace:     trace,
		Carry:     []string{consumer.KernelSymbols, consumer.UserSymbols},
		MaxChunks: r.maxChunks,
		MaxSize:   uint64(r.maxSize),
		ChunkSize: uint64(r.size),
	})
	if err != nil {
		return err
	}
	r.sink = s
	cfg.Sink = s
	fmt.Fprintf(stderr, "kconsume record: the trace rotates: each closed chunk, a complete trace, goes to %s\n", filepath.Join(root, chunks.ArchivesDir, "BEGIN-END-ID"))
	return nil
}

// status writes the chunks' counts for ctl status.
func (r *rotateFlags) status(w io.Writer, s *consumer.Session) {
	if r == nil || !r.enabled() {
		return
	}
	if r.relay {
		// relayd's sink rotates: relayd archives the closed chunks.
		n := s.Channel().Chunks() - 1
		fmt.Fprintf(w, "chunk %d being written on relayd; %d closed, in the session's %s directory there\n", n, n, chunks.ArchivesDir)
	}
	if r.sink == nil {
		return // relayd's alone
	}
	st := r.sink.Stats()
	fmt.Fprintf(w, "chunk %d being written; %d closed, %d kept (%s)\n", s.Channel().Chunks()-1, st.Closed, st.Kept, humanBytes(st.KeptBytes))
	fmt.Fprintf(w, "deleted %d chunks (%s): %d events, %d discarded\n", st.Deleted, humanBytes(st.DeletedBytes), st.DeletedEvents, st.DeletedDiscarded)
}

// summary writes the chunks' counts at the end of the recording.
func (r *rotateFlags) summary(w io.Writer) {
	if r == nil || r.sink == nil {
		return
	}
	st := r.sink.Stats()
	if st.Closed == 0 {
		fmt.Fprintln(w, "not rotated: the trace is one chunk, in place")
		return
	}
	fmt.Fprintf(w, "%d chunks, %d kept (%s) in %s\n", st.Closed, st.Kept, humanBytes(st.KeptBytes), filepath.Dir(st.Last))
	if st.Deleted > 0 {
		fmt.Fprintf(w, "deleted the %d oldest chunks (%s) under the budget: %d events, %d discarded\n", st.Deleted, humanBytes(st.DeletedBytes), st.DeletedEvents, st.DeletedDiscarded)
	}
}
