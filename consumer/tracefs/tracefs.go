package tracefs

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/kconsume/kconsume/internal/mounts"
)

// FS is a mounted tracefs.
type FS struct {
	Root string
}

// ErrNotMounted is returned by Find when no tracefs is mounted.
var ErrNotMounted = mounts.ErrNotMounted

// Find returns the mounted tracefs: a tracefs mount, or the tracing
// directory of a debugfs mount on kernels that only have that. It fails
// with ErrNotMounted when there is neither.
func Find() (FS, error) {
	root, err := mounts.FindTracefs()
	return FS{Root: root}, err
}

// Event names one trace event.
type Event struct{ System, Name string }

// String returns "system:name".
func (e Event) String() string { return e.System + ":" + e.Name }

// ParseEvent splits "system:name". Either part may be a glob (path.Match
// syntax); a bare name matches that name in every system.
func ParseEvent(s string) (Event, error) {
	sys, name, found := strings.Cut(s, ":")
	if !found {
		sys, name = "*", s
	}
	if name == "" || sys == "" {
		return Event{}, fmt.Errorf("event %q: want system:name", s)
	}
	for _, p := range []string{sys, name} {
		if strings.ContainsAny(p, "/") {
			return Event{}, fmt.Errorf("event %q: bad character '/'", s)
		}
		if _, err := path.Match(p, ""); err != nil {
			return Event{}, fmt.Errorf("event %q: bad pattern: %w", s, err)
		}
	}
	return Event{System: sys, Name: name}, nil
}

// Events returns the events matching pattern ("sched:sched_switch",
// "sched:*", "*:sys_enter_get*", "sched_switch"), sorted. A pattern that
// matches nothing returns no events and no error.
func (fs FS) Events(pattern string) ([]Event, error) {
	p, err := ParseEvent(pattern)
	if err != nil {
		return nil, err
	}
	systems, err := os.ReadDir(filepath.Join(fs.Root, "events"))
	if err != nil {
		return nil, fmt.Errorf("tracefs: %w", err)
	}
	var out []Event
	for _, s := range systems {
		if !s.IsDir() {
			continue
		}
		if m, _ := path.Match(p.System, s.Name()); !m {
			continue
		}
		evs, err := os.ReadDir(filepath.Join(fs.Root, "events", s.Name()))
		if err != nil {
			return nil, fmt.Errorf("tracefs: %w", err)
		}
		for _, e := range evs {
			if !e.IsDir() {
				continue
			}
			if m, _ := path.Match(p.Name, e.Name()); m {
				out = append(out, Event{System: s.Name(), Name: e.Name()})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].System != out[j].System {
			return out[i].System < out[j].System
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// Format reads and parses the format file of e.
func (fs FS) Format(e Event) (*Format, error) {
	data, err := os.ReadFile(filepath.Join(fs.Root, "events", e.System, e.Name, "format"))
	if err != nil {
		return nil, fmt.Errorf("tracefs: event %s: %w", e, err)
	}
	return ParseFormat(e.System, data)
}

// SyscallUserBufSize returns how many bytes of the user-space data a
// syscall event points to the kernel records in the top instance's
// syscall events (the file syscall_user_buf_size, Linux 6.19+), and
// false when the kernel has no such file. It fails when the file cannot
// be read or holds no number.
func (fs FS) SyscallUserBufSize() (int, bool, error) {
	data, err := os.ReadFile(filepath.Join(fs.Root, "syscall_user_buf_size"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("tracefs: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || n < 0 {
		return 0, false, fmt.Errorf("tracefs: syscall_user_buf_size holds %q, not a size", strings.TrimSpace(string(data)))
	}
	return n, true, nil
}
