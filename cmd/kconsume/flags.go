package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/relayfmt"
)

// listFlag is a flag that may repeat and takes comma-separated lists.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// sizeFlag takes a byte count with an optional K, M or G suffix (powers of
// 1024): 4K, 256K, 1M.
type sizeFlag int

func (s *sizeFlag) String() string { return strconv.Itoa(int(*s)) }

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func parseSize(v string) (int, error) {
	mult := 1
	t := strings.ToUpper(strings.TrimSpace(v))
	t = strings.TrimSuffix(t, "IB")
	t = strings.TrimSuffix(t, "B")
	switch {
	case strings.HasSuffix(t, "K"):
		mult, t = 1<<10, t[:len(t)-1]
	case strings.HasSuffix(t, "M"):
		mult, t = 1<<20, t[:len(t)-1]
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<30, t[:len(t)-1]
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("size %q: want a positive number with an optional K, M or G suffix (4K, 256K, 1M)", v)
	}
	return n * mult, nil
}

func parseMode(m string) (relayfmt.Mode, error) {
	switch m {
	case "discard":
		return relayfmt.NoOverwrite, nil
	case "overwrite":
		return relayfmt.Overwrite, nil
	}
	return 0, fmt.Errorf("--mode %q: want discard or overwrite", m)
}

func parseTransport(t string) (consumer.Transport, error) {
	for _, v := range []consumer.Transport{consumer.Auto, consumer.Ringbuf, consumer.Perf} {
		if v.String() == t {
			return v, nil
		}
	}
	return 0, fmt.Errorf("--transport %q: want auto, ringbuf or perf", t)
}

func parseSyscalls(y string) (consumer.Syscalls, error) {
	for _, v := range []consumer.Syscalls{consumer.SyscallsAuto, consumer.SyscallsRaw, consumer.SyscallsTracepoint, consumer.SyscallsFentry} {
		if v.String() == y {
			return v, nil
		}
	}
	return 0, fmt.Errorf("--syscalls %q: want auto, raw, tracepoint or fentry", y)
}

func parseClock(c string) (consumer.Clock, error) {
	for _, v := range []consumer.Clock{consumer.Mono, consumer.Boot, consumer.TAI} {
		if v.String() == c {
			return v, nil
		}
	}
	return 0, fmt.Errorf("--clock %q: want mono, boot or tai", c)
}

// eventsFlag is -e: the event patterns, and those of the last -e, which
// a -f after it filters.
type eventsFlag struct {
	list, last []string
}

func (e *eventsFlag) String() string { return strings.Join(e.list, ",") }

func (e *eventsFlag) Set(s string) error {
	var l listFlag
	if err := l.Set(s); err != nil {
		return err
	}
	e.list, e.last = append(e.list, l...), l
	return nil
}

// filterFlags is -f, and gathers --filter: the field filters, each -f on
// the events of the -e before it, as trace-cmd record takes -f.
type filterFlags struct {
	events *eventsFlag
	list   []consumer.EventFilter
}

func (f *filterFlags) String() string { return "" }

func (f *filterFlags) Set(expr string) error {
	if len(f.events.last) == 0 {
		return errors.New("-f applies to the events of an -e before it: give -e EVENT first")
	}
	for _, e := range f.events.last {
		f.list = append(f.list, consumer.EventFilter{Event: e, Expr: expr})
	}
	return nil
}

// stackFlags is --stack: the call chains of the events of the -e before
// it, or of all events when it comes before any -e.
type stackFlags struct {
	events *eventsFlag
	list   []consumer.EventStack
}

func (f *stackFlags) String() string { return "" }

func (f *stackFlags) Set(s string) error {
	var st consumer.Stack
	switch s {
	case "kernel":
		st = consumer.StackKernel
	case "user":
		st = consumer.StackUser
	case "both":
		st = consumer.StackKernel | consumer.StackUser
	default:
		return fmt.Errorf("%q: want kernel, user or both", s)
	}
	if len(f.events.last) == 0 {
		f.list = append(f.list, consumer.EventStack{Stack: st})
		return nil
	}
	for _, e := range f.events.last {
		f.list = append(f.list, consumer.EventStack{Event: e, Stack: st})
	}
	return nil
}

// filterFlag is --filter EVENT:EXPR.
type filterFlag struct{ f *filterFlags }

func (f filterFlag) String() string { return "" }

func (f filterFlag) Set(s string) error {
	event, expr, ok := splitFilter(s)
	if !ok {
		return fmt.Errorf("%q: want EVENT:EXPR, as sched:sched_switch:'prev_pid > 0'", s)
	}
	f.f.list = append(f.f.list, consumer.EventFilter{Event: event, Expr: expr})
	return nil
}

// splitFilter splits EVENT:EXPR where EVENT is system:name, a glob of
// one or a bare name: EVENT ends at the last ':' before the first byte
// that no event pattern or field name holds (a space, an operator, a
// quote, a parenthesis), since an expression starts with a field name,
// '!' or '('.
func splitFilter(s string) (event, expr string, ok bool) {
	end := strings.IndexFunc(s, func(r rune) bool {
		return !(r == ':' || r == '_' || r == '*' || r == '?' || r == '[' || r == ']' || r == '-' ||
			r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
	if end < 0 {
		end = len(s)
	}
	i := strings.LastIndexByte(s[:end], ':')
	if i <= 0 || strings.TrimSpace(s[i+1:]) == "" {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}
