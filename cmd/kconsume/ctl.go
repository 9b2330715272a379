package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/profile"
	"github.com/kconsume/kconsume/relayfmt"
)

// controlRoot is where control directories go; tests point it elsewhere.
var controlRoot = control.DefaultRoot

// ctlCommands are what kconsume ctl and the control socket accept.
var ctlCommands = []string{"start", "stop", "flush", "rotate", "snapshot", "rewind", "reset", "status", "statedump", "filter"}

// handler carries out control commands on a recording session.
type handler struct {
	mu    sync.Mutex
	s     *consumer.Session
	relay *relaydOut   // nil without --relayd
	rot   *rotateFlags // nil in tests that make no recording
}

func (h *handler) session() (*consumer.Session, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.s == nil {
		return nil, errors.New("session is starting")
	}
	return h.s, nil
}

func (h *handler) set(s *consumer.Session) {
	h.mu.Lock()
	h.s = s
	h.mu.Unlock()
}

// Do runs one control command; cpu < 0 means every CPU.
func (h *handler) Do(cmd string, cpu int, arg string) (string, error) {
	s, err := h.session()
	if err != nil {
		return "", err
	}
	all := cpu < 0
	switch cmd {
	case "start":
		if all {
			return "", s.Start()
		}
		return "", s.StartCPU(cpu)
	case "stop":
		if all {
			return "", s.Stop()
		}
		return "", s.StopCPU(cpu)
	case "flush":
		if all {
			return "", s.Flush()
		}
		return "", s.FlushCPU(cpu)
	case "rotate":
		if !all {
			return "", errors.New("rotate acts on every CPU; drop --cpu")
		}
		return h.rotate(s)
	case "reset":
		if all {
			return "", s.Reset()
		}
		return "", s.ResetCPU(cpu)
	case "snapshot":
		if !all {
			return "", errors.New("snapshot acts on every CPU; drop --cpu")
		}
		if s.Config().Mode != relayfmt.Overwrite {
			return "", errors.New("snapshot needs a session recording with --mode overwrite")
		}
		return "", s.Snapshot()
	case "rewind":
		if s.Config().Mode != relayfmt.Overwrite {
			return "", errors.New("rewind needs a session recording with --mode overwrite")
		}
		return rewind(s, cpu)
	case "status":
		return h.status(s, cpu)
	case "emit":
		return emit(s, cpu, arg)
	case "statedump":
		return ctlStatedump(s, cpu)
	case "filter":
		if !all {
			return "", errors.New("filter acts on every CPU; drop --cpu")
		}
		event, expr, ok := splitFilter(arg)
		if !ok {
			return "", fmt.Errorf("filter %q: want EVENT:EXPR (EXPR 0 removes the filter)", arg)
		}
		return "", s.SetFilter(event, expr)
	}
	return "", fmt.Errorf("unknown command %q: want one of %s", cmd, strings.Join(ctlCommands, ", "))
}

// rewind writes every sub-buffer still held, from the oldest, into a new
// trace beside the session's.
func rewind(s *consumer.Session, cpu int) (string, error) {
	// Beside the trace, not inside it: babeltrace2 would merge a
	// trace found in a subdirectory with the main one. A trace laid
	// out as an LTTng session (SESSION/kernel) is rewound into a
	// session of its own, SESSION.rewind-N/kernel.
	base, sub := filepath.Clean(s.Config().Dir), ""
	if filepath.Base(base) == "kernel" {
		base, sub = filepath.Dir(base), "kernel"
	}
	for n := 1; ; n++ {
		top := fmt.Sprintf("%s.rewind-%d", base, n)
		if _, err := os.Lstat(top); err == nil {
			continue
		}
		dir := filepath.Join(top, sub)
		if sub != "" {
			if err := os.Mkdir(top, 0o755); err != nil {
				return "", fmt.Errorf("rewind: %w", err)
			}
		}
		if err := s.Rewind(dir, cpu); err != nil {
			if sub != "" {
				_ = os.Remove(top)
			}
			return "", err
		}
		// The rewound trace is written past the session's sink:
		// its names are given the session's profile here.
		if err := profile.Relabel(s.Config().Sink, dir); err != nil {
			return "", fmt.Errorf("rewound into %s: %w", top, err)
		}
		return "rewound into " + top + ": every sub-buffer still held, from the oldest\n", nil
	}
}

func (h *handler) status(s *consumer.Session, cpu int) (string, error) {
	stats, err := s.Stats()
	if err != nil {
		return "", err
	}
	cfg := s.Config()
	var b strings.Builder
	state := "stopped"
	if s.Running() {
		state = "running"
	}
	fmt.Fprintf(&b, "state %s\nmode %s\ntransport %s\nnr_sub %d\nsub_size %d\n", state, cfg.Mode, s.Transport(), cfg.NSubbufs, cfg.SubbufSize)
	fmt.Fprintf(&b, "%-5s %8s %12s %12s %12s %12s\n", "cpu", "enabled", "events", "dropped", "ring-lost", "missed")
	for _, c := range stats {
		if cpu >= 0 && c.CPU != cpu {
			continue
		}
		fmt.Fprintf(&b, "%-5d %8v %12d %12d %12d %12d\n", c.CPU, !c.Disabled, c.Channel.Records, c.Discarded(), c.KernelLost, c.Missed)
	}
	if chains, err := s.StackCounts(); err == nil {
		if chains.Truncated+chains.Failed > 0 {
			fmt.Fprintf(&b, "call chains: %d cut at the depth, %d recorded empty\n", chains.Truncated, chains.Failed)
		}
		if chains.CountersUnread > 0 {
			fmt.Fprintf(&b, "perf contexts: %d unread, written as 0\n", chains.CountersUnread)
		}
	}
	triggerNote(&b, s)
	h.relay.status(&b)
	h.rot.status(&b, s)
	return b.String(), nil
}

// rotate closes the session's current chunk and begins the next.
func (h *handler) rotate(s *consumer.Session) (string, error) {
	if h.rot == nil || !h.rot.enabled() {
		return "", errors.New("rotate needs a session recording with --rotate-size or --rotate-interval (its trace is written in chunks)")
	}
	c, err := s.Rotate()
	if err != nil {
		return "", err
	}
	where := "archived by relayd"
	if h.rot.sink != nil {
		local := "deleted at once under the budget"
		if last := h.rot.sink.Stats().Last; last != "" {
			local = "in " + last
		}
		if h.rot.relay {
			where += ", and " + local
		} else {
			where = local
		}
	}
	return fmt.Sprintf("chunk %d closed, %s: %d events, %d discarded, %s\n", c.Index, where, c.Events, c.Discarded, humanBytes(c.Bytes)), nil
}

// Files returns the control directory's read files.
func (h *handler) Files() map[string]string {
	s, err := h.session()
	if err != nil {
		return map[string]string{"state": "stopped", "dropped": "0", "nr_sub": "0", "sub_size": "0"}
	}
	state := "stopped"
	if s.Running() {
		state = "running"
	}
	var n uint64
	if stats, err := s.Stats(); err == nil {
		for _, c := range stats {
			n += c.Discarded()
		}
	}
	dropped := strconv.FormatUint(n, 10)
	cfg := s.Config()
	m := map[string]string{
		"state":    state,
		"dropped":  dropped,
		"nr_sub":   strconv.Itoa(cfg.NSubbufs),
		"sub_size": strconv.Itoa(cfg.SubbufSize),
	}
	h.relay.files(m)
	return m
}

const ctlSynopsis = `ctl [--session NAME] [--cpu N] start|stop|flush|rotate|snapshot|rewind|reset|status|statedump
ctl [--session NAME] filter EVENT:EXPR

Drives a running kconsume record from another shell. Without --session,
the one running session. --cpu acts on one CPU's buffer. rotate closes
the current chunk of a trace recorded with --rotate-size or
--rotate-interval and begins the next (docs/rotation.md). In overwrite
mode, snapshot writes the newest data into the trace, and rewind writes
everything still held, from the oldest, into a new trace DIR.rewind-N
(SESSION.rewind-N/kernel for a trace laid out as an LTTng session).
statedump (--profile lttng sessions) writes the processes, open files,
block devices, IRQs and CPUs into the trace again (--cpu: its stream).
filter gives the recorded events EVENT names the field filter EXPR in
place of theirs (0 removes it), each event recorded once across the
change; it needs events recorded through their tracepoints.`

func ctl(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ctl", ctlSynopsis, "kconsume ctl --session web stop", stderr)
	name := fs.String("session", "", "session `name` (see kconsume record --session)")
	cpu := fs.Int("cpu", -1, "act on this CPU's buffer only")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	cmd, arg := fs.Arg(0), ""
	switch {
	case cmd == "filter" && fs.NArg() == 2:
		arg = fs.Arg(1)
		if _, _, ok := splitFilter(arg); !ok {
			return usageError{fmt.Errorf("filter %q: want EVENT:EXPR (EXPR 0 removes the filter)", arg)}
		}
	case cmd == "filter":
		return usageError{errors.New("filter takes one argument, EVENT:EXPR")}
	case fs.NArg() != 1:
		return usageError{fmt.Errorf("want one command (%s), got %d arguments", strings.Join(ctlCommands, ", "), fs.NArg())}
	}
	known := false
	for _, c := range ctlCommands {
		known = known || c == cmd
	}
	if !known {
		return usageError{fmt.Errorf("unknown command %q: want one of %s", cmd, strings.Join(ctlCommands, ", "))}
	}
	if *cpu < -1 {
		return usageError{fmt.Errorf("--cpu %d: not a CPU", *cpu)}
	}
	if *name == "" {
		live, err := control.Sessions(controlRoot)
		if err != nil {
			return err
		}
		switch len(live) {
		case 0:
			return errors.New("no session is running")
		case 1:
			*name = live[0]
		default:
			return usageError{fmt.Errorf("%d sessions are running (%s): pick one with --session", len(live), strings.Join(live, ", "))}
		}
	}
	out, err := control.Send(controlRoot, *name, cmd, *cpu, arg)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, out)
	return nil
}
