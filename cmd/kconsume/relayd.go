package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/relayd"
	"github.com/kconsume/kconsume/relayfmt"
)

// relaydOut is record's --relayd: the flags, then the stream to
// lttng-relayd.
type relaydOut struct {
	url     string
	host    string
	timeout time.Duration
	live    time.Duration

	u     relayd.URL
	sink  atomic.Pointer[relayd.Sink] // set once connected; read by the control and metrics servers
	local string                      // -o DIR, when a local copy is kept
	tee   *relayd.Tee                 // the local copy and relayd, with -o
	lost  bool                        // poll reported the loss of relayd

	notes    chan string   // what the reconnector says, printed by poll
	quit     chan struct{} // ends the reconnector
	stopOnce sync.Once
	done     chan struct{}
}

// relaydFlags adds record's relayd flags to fs.
func relaydFlags(fs *flag.FlagSet) *relaydOut {
	r := &relaydOut{}
	fs.StringVar(&r.url, "relayd", "", "also stream to lttng-relayd at `URL` net://HOST[:CONTROL_PORT[:DATA_PORT]] (ports 5342, 5343 by default); -o is then optional and keeps a local copy")
	fs.StringVar(&r.host, "relayd-hostname", "", "host `name` under which relayd files the session (default: this machine's hostname)")
	fs.DurationVar(&r.timeout, "relayd-timeout", relayd.DefaultTimeout, "longest wait for relayd to connect or to take a packet before recording goes on without it")
	fs.DurationVar(&r.live, "live-timer", 0, "every `period` (1s, say) flush the sub-buffers, so kconsume report --follow DIR shows events as they happen; with --relayd the session is live: idle streams send beacons and babeltrace2 --input-format=lttng-live shows it")
	return r
}

// enabled reports whether --relayd was given.
func (r *relaydOut) enabled() bool { return r != nil && r.url != "" }

// check validates the relayd flags and the configuration: with --relayd
// and no -o, the trace's sink is relayd, connected later.
func (r *relaydOut) check(cfg consumer.Config) error {
	if r.live != 0 && (r.live < 10*time.Millisecond || r.live > time.Hour) {
		return fmt.Errorf("--live-timer %v: want 10ms to 1h", r.live)
	}
	if !r.enabled() {
		if r.host != "" {
			return errors.New("--relayd-hostname needs --relayd")
		}
		return cfg.Check()
	}
	var err error
	if r.u, err = relayd.ParseURL(r.url); err != nil {
		return err
	}
	if r.timeout <= 0 {
		return fmt.Errorf("--relayd-timeout %v: want a positive duration", r.timeout)
	}
	if cfg.Dir == "" {
		cfg.Sink = &relayfmt.DiscardSink{}
	}
	return cfg.Check()
}

// sessionName returns --session, or the output directory's name, or
// "kconsume" when only relayd receives the trace.
func sessionName(session, out string) string {
	switch {
	case session != "":
		return session
	case out == "":
		return "kconsume"
	}
	return filepath.Base(filepath.Clean(out))
}

// connect creates the session on relayd and sets cfg.Sink: relayd alone,
// or relayd beside the local directory cfg.Dir. It fails, before anything
// is traced, when relayd is unreachable or refuses the session.
func (r *relaydOut) connect(cfg *consumer.Config, name string, stderr io.Writer) error {
	if !r.enabled() {
		return nil
	}
	host := r.host
	if host == "" {
		var err error
		if host, err = os.Hostname(); err != nil {
			return fmt.Errorf("hostname for relayd: %w (give --relayd-hostname)", err)
		}
	}
	streams := []string{"trace"}
	if !cfg.Global {
		n, err := ebpf.PossibleCPU()
		if err != nil {
			return fmt.Errorf("possible CPUs: %w", err)
		}
		streams = streams[:0]
		for i := range n {
			streams = append(streams, "trace"+strconv.Itoa(i))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	s, err := relayd.NewSink(ctx, relayd.Config{URL: r.u, Session: relayd.Session{Host: host, Name: name, Timeout: r.timeout, LiveTimer: r.live}, Streams: streams})
	if err != nil {
		return fmt.Errorf("%w; nothing was traced", err)
	}
	r.sink.Store(s)
	r.notes, r.quit, r.done = make(chan string, 16), make(chan struct{}), make(chan struct{})
	go r.reconnector(s)
	if cfg.Dir == "" {
		cfg.Sink = s
	} else {
		// A local copy that rotates (rotateFlags.open) is the Tee's.
		local, ok := cfg.Sink.(relayd.LocalCopy)
		if !ok {
			if local, err = relayfmt.NewDirSink(cfg.Dir); err != nil {
				s.Close()
				return err
			}
		}
		r.local = cfg.Dir
		r.tee = &relayd.Tee{Dir: local, Remote: s}
		cfg.Sink = r.tee
	}
	fmt.Fprintf(stderr, "kconsume record: streaming to relayd %s, which writes %s/%s\n", r.u, s.Client().OutputPath, relayd.DomainPath)
	if r.live != 0 {
		fmt.Fprintf(stderr, "kconsume record: live: babeltrace2 --input-format=lttng-live net://%s:%d/host/%s/%s\n", r.u.Host, relayd.DefaultLivePort, host, name)
	} else {
		// As LTTng's: a session created without a live timer is not
		// listed to live viewers, which then say "Not a live session".
		fmt.Fprintf(stderr, "kconsume record: not a live session: babeltrace2 --input-format=lttng-live will not show it (add --live-timer 1s to make it live); the trace is read from relayd's directory\n")
	}
	return nil
}

// startLive runs the live timer of a --live-timer session until the
// returned function is called: every period it reads the trace clock,
// flushes the session (whose packets go to the local copy, where report
// --follow sees them, and to relayd) and sends the idle streams' beacons
// to relayd stamped with that time.
func (r *relaydOut) startLive(s *consumer.Session) (stop func()) {
	if r.live == 0 {
		return func() {}
	}
	sink := r.stream()
	clk := int32(unix.CLOCK_MONOTONIC)
	switch s.Config().Clock {
	case consumer.Boot:
		clk = unix.CLOCK_BOOTTIME
	case consumer.TAI:
		clk = unix.CLOCK_TAI
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.live)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			var now unix.Timespec
			if unix.ClockGettime(clk, &now) != nil || s.Flush() != nil {
				continue
			}
			if sink == nil {
				continue
			}
			if r.tee != nil {
				// The packets flushed go to relayd from the Tee's
				// senders: the beacon goes after them, or, relayd
				// being a period behind, not this period.
				ctx, cancel := context.WithTimeout(context.Background(), r.live)
				err := r.tee.Sync(ctx)
				cancel()
				if err != nil {
					continue
				}
			}
			// A failure stops the sink, which poll and summary report.
			_ = sink.Live(uint64(now.Nano()))
		}
	}()
	return func() { close(quit); <-done }
}

// abort closes the sink of a session that failed to start, and removes
// the metadata it wrote into the local directory.
func (r *relaydOut) abort(cfg consumer.Config) {
	if r.sink.Load() == nil {
		return
	}
	r.stop()
	_ = cfg.Sink.Close()
	if r.local != "" {
		_ = os.Remove(filepath.Join(r.local, relayfmt.MetadataFile))
	}
}

// reconnector creates the session on relayd again after it was lost, at
// growing intervals (1 s to 30 s), until stop; it says what happens
// through r.notes.
func (r *relaydOut) reconnector(s *relayd.Sink) {
	defer close(r.done)
	backoff, last := time.Second, ""
	for {
		select {
		case <-r.quit:
			return
		case <-time.After(backoff):
		}
		if s.Err() == nil {
			backoff, last = time.Second, ""
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		err := s.Reconnect(ctx)
		cancel()
		switch {
		case errors.Is(err, net.ErrClosed):
			return
		case err == nil:
			r.note(fmt.Sprintf("relayd is back: streaming again; relayd writes %s/%s", s.Client().OutputPath, relayd.DomainPath))
			backoff, last = time.Second, ""
		default:
			if msg := err.Error(); msg != last {
				r.note(fmt.Sprintf("relayd still lost, retrying every %v up to 30s: %v", backoff, err))
				last = msg
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}
}

func (r *relaydOut) note(msg string) {
	select {
	case r.notes <- msg:
	default: // poll is behind: drop the note, not the recording
	}
}

// stop ends the reconnector.
func (r *relaydOut) stop() {
	if r.quit == nil {
		return
	}
	r.stopOnce.Do(func() { close(r.quit); <-r.done })
}

// poll says, while recording, when relayd went away and what the
// reconnector did since.
func (r *relaydOut) poll(stderr io.Writer, live bool) {
	s := r.stream()
	if s == nil {
		return
	}
	clear := func() {
		if live {
			fmt.Fprint(stderr, "\r\033[K")
		}
	}
	err := s.Err()
	if err != nil && !r.lost {
		clear()
		if r.local != "" {
			fmt.Fprintf(stderr, "kconsume record: relayd lost, recording goes on into %s only: %v\n", r.local, err)
		} else {
			fmt.Fprintf(stderr, "kconsume record: relayd lost and no local copy (-o): %v\n", err)
		}
	}
	r.lost = err != nil
	for {
		select {
		case msg := <-r.notes:
			clear()
			fmt.Fprintf(stderr, "kconsume record: %s\n", msg)
		default:
			return
		}
	}
}

// summary prints what reached relayd and what did not.
func (r *relaydOut) summary(w io.Writer) {
	s := r.stream()
	if s == nil {
		return
	}
	r.stop()
	st := s.Stats()
	again := ""
	if st.Reconnects > 0 {
		again = fmt.Sprintf(", session created again %d times (last in %s)", st.Reconnects, s.Client().OutputPath)
	}
	fmt.Fprintf(w, "relayd %s: %d packets sent (%s), %d packets not sent%s\n", r.u, st.Sent, humanBytes(st.Bytes), st.NotSent, again)
	where := "they are in no trace: pass -o DIR to keep a local copy"
	if r.local != "" {
		where = "the local copy in " + r.local + " has them"
	}
	if st.Err != nil {
		fmt.Fprintf(w, "warning: relayd stopped taking packets: %v\n", st.Err)
	}
	if st.NotSent > 0 {
		fmt.Fprintf(w, "lost at relayd: %d packets relayd never confirmed (it died, hung past --relayd-timeout or refused them); %s\n", st.NotSent, where)
	}
	if r.local != "" {
		// The local copy remembers, for kconsume stats, what relayd missed.
		text := fmt.Sprintf("url %s\nsent %d\nnot_sent %d\nreconnects %d\n", r.u, st.Sent, st.NotSent, st.Reconnects)
		if err := os.WriteFile(filepath.Join(r.local, relaydNote), []byte(text), 0o640); err != nil {
			fmt.Fprintf(w, "warning: %v\n", err)
		}
	}
}

// relaydNote is the dot-file (CTF readers skip dot-files) in which the
// local copy of a --relayd recording keeps what relayd missed.
const relaydNote = ".relayd"

// relaydNoteLine returns what stats says about relayd for the trace in
// dir, or "" when it was not streamed.
func relaydNoteLine(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, relaydNote))
	if err != nil {
		return ""
	}
	v := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, val, ok := strings.Cut(l, " "); ok {
			v[k] = val
		}
	}
	line := fmt.Sprintf("relayd %s: %s packets sent, %s packets not sent", v["url"], v["sent"], v["not_sent"])
	if v["reconnects"] != "" && v["reconnects"] != "0" {
		line += ", session created again " + v["reconnects"] + " times"
	}
	if v["not_sent"] != "" && v["not_sent"] != "0" {
		line += " (this local copy has them)"
	}
	return line + "\n"
}

// behind returns how many packets of the local copy relayd has not been
// sent yet: 0 without a local copy.
func (r *relaydOut) behind() uint64 {
	if r == nil || r.tee == nil {
		return 0
	}
	return r.tee.Behind()
}

// stream returns the relayd sink, or nil before it is connected or
// without --relayd.
func (r *relaydOut) stream() *relayd.Sink {
	if r == nil {
		return nil
	}
	return r.sink.Load()
}

// files adds the relayd counters to the control directory's files.
func (r *relaydOut) files(m map[string]string) {
	if s := r.stream(); s != nil {
		st := s.Stats()
		m["relayd_sent"] = strconv.FormatUint(st.Sent, 10)
		m["relayd_not_sent"] = strconv.FormatUint(st.NotSent, 10)
		m["relayd_behind"] = strconv.FormatUint(r.behind(), 10)
	}
}

// status adds a relayd line to kconsume ctl status.
func (r *relaydOut) status(b *strings.Builder) {
	if s := r.stream(); s != nil {
		st := s.Stats()
		state := "connected"
		if st.Err != nil {
			state = "lost: " + st.Err.Error()
		}
		fmt.Fprintf(b, "relayd %s %s, %d packets sent, %d not sent, %d behind\n", r.u, state, st.Sent, st.NotSent, r.behind())
	}
}

// prom adds the relayd counters to the metrics.
func (r *relaydOut) prom(b *bytes.Buffer) {
	s := r.stream()
	if s == nil {
		return
	}
	st := s.Stats()
	up := 1
	if st.Err != nil {
		up = 0
	}
	fmt.Fprintf(b, "# HELP kconsume_relayd_up Whether relayd takes the session's packets.\n# TYPE kconsume_relayd_up gauge\nkconsume_relayd_up %d\n", up)
	fmt.Fprintf(b, "# HELP kconsume_relayd_packets_total Packets by what became of them at relayd.\n# TYPE kconsume_relayd_packets_total counter\n")
	fmt.Fprintf(b, "kconsume_relayd_packets_total{result=\"sent\"} %d\nkconsume_relayd_packets_total{result=\"not_sent\"} %d\n", st.Sent, st.NotSent)
	fmt.Fprintf(b, "# HELP kconsume_relayd_behind_packets Packets of the local copy not yet sent to relayd.\n# TYPE kconsume_relayd_behind_packets gauge\nkconsume_relayd_behind_packets %d\n", r.behind())
	fmt.Fprintf(b, "# HELP kconsume_relayd_bytes_total Packet bytes relayd took.\n# TYPE kconsume_relayd_bytes_total counter\nkconsume_relayd_bytes_total %d\n", st.Bytes)
}
