package main

import (
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
