package relayd

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Default ports of lttng-relayd (lttng-tools' DEFAULT_NETWORK_*_PORT).
const (
	DefaultControlPort = 5342
	DefaultDataPort    = 5343
	DefaultLivePort    = 5344
)

// URL is where a relay daemon listens: its host and its control and data
// ports.
type URL struct {
	Host    string // a name or an IP address, without brackets
	Control int
	Data    int
}

// ParseURL reads LTTng's network URL form, net://HOST[:CTRL_PORT[:DATA_PORT]]
// (net6:// for an IPv6 address, which may be written in brackets:
// net6://[::1]:5342). Missing ports take the defaults, 5342 and 5343. It
// fails on another scheme, an empty host, a path, or a port outside
// 1..65535.
func ParseURL(s string) (URL, error) {
	u := URL{Control: DefaultControlPort, Data: DefaultDataPort}
	rest, ok := strings.CutPrefix(s, "net://")
	if !ok {
		if rest, ok = strings.CutPrefix(s, "net6://"); !ok {
			return u, fmt.Errorf("relayd URL %q: want net://HOST[:CONTROL_PORT[:DATA_PORT]]", s)
		}
	}
	if strings.ContainsAny(rest, "/?#") {
		return u, fmt.Errorf("relayd URL %q: a path is not supported, only HOST[:CONTROL_PORT[:DATA_PORT]]", s)
	}
	var ports string
	if strings.HasPrefix(rest, "[") {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return u, fmt.Errorf("relayd URL %q: unclosed [", s)
		}
		u.Host, ports = rest[1:end], rest[end+1:]
		if ports != "" && !strings.HasPrefix(ports, ":") {
			return u, fmt.Errorf("relayd URL %q: want :PORT after ]", s)
		}
		ports = strings.TrimPrefix(ports, ":")
	} else if strings.Count(rest, ":") > 2 {
		return u, fmt.Errorf("relayd URL %q: write an IPv6 address in brackets: net6://[ADDR]:PORT", s)
	} else {
		u.Host, ports, _ = strings.Cut(rest, ":")
	}
	if u.Host == "" {
		return u, fmt.Errorf("relayd URL %q: no host", s)
	}
	if ports != "" {
		c, d, hasData := strings.Cut(ports, ":")
		var err error
		if u.Control, err = parsePort(c); err != nil {
			return u, fmt.Errorf("relayd URL %q: control port: %w", s, err)
		}
		if hasData {
			if u.Data, err = parsePort(d); err != nil {
				return u, fmt.Errorf("relayd URL %q: data port: %w", s, err)
			}
		}
	}
	if u.Control == u.Data {
		return u, fmt.Errorf("relayd URL %q: control and data ports are both %d", s, u.Control)
	}
	return u, nil
}

func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, errors.New("want a number from 1 to 65535, got " + strconv.Quote(s))
	}
	return n, nil
}

// ControlAddr returns host:port of the control port, for net.Dial.
func (u URL) ControlAddr() string { return net.JoinHostPort(u.Host, strconv.Itoa(u.Control)) }

// DataAddr returns host:port of the data port, for net.Dial.
func (u URL) DataAddr() string { return net.JoinHostPort(u.Host, strconv.Itoa(u.Data)) }

// String returns the URL in LTTng's form, both ports spelled out.
func (u URL) String() string {
	if strings.Contains(u.Host, ":") {
		return fmt.Sprintf("net6://[%s]:%d:%d", u.Host, u.Control, u.Data)
	}
	return fmt.Sprintf("net://%s:%d:%d", u.Host, u.Control, u.Data)
}
