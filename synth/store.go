package synth

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// DefaultStoreDir returns $KCONSUME_SYNTH_DIR, or /var/lib/kconsume/synth.
func DefaultStoreDir() string {
	if d := os.Getenv("KCONSUME_SYNTH_DIR"); d != "" {
		return d
	}
	return "/var/lib/kconsume/synth"
}

// ErrExists is returned when a definition's name is taken.
var ErrExists = errors.New("synthetic event already defined")

// ErrNotFound is returned for a name that is not defined.
var ErrNotFound = errors.New("synthetic event not defined")

// Store keeps definitions across commands: one file NAME.synth per event
// in Dir, holding its definition line, until deleted.
type Store struct{ Dir string }

const storeExt = ".synth"

// Add stores e. It fails with ErrExists when the name is taken (also
// by a built-in event), and
// never replaces or half-writes a definition: the file appears whole or
// not at all.
func (s Store) Add(e *Event) error {
	if !e.Final() {
		return fmt.Errorf("%w: %s is not finalized", ErrDefinition, e.Name)
	}
	if Builtin(e.Name) != nil {
		return fmt.Errorf("%w: %s is built into kconsume", ErrExists, e.Name)
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("synthetic event store: %w", err)
	}
	tmp, err := os.CreateTemp(s.Dir, ".add-*")
	if err != nil {
		return fmt.Errorf("synthetic event store: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(e.String() + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("synthetic event store: %w", err)
	}
	// A hard link, unlike rename, fails when the name exists.
	if err := os.Link(tmp.Name(), s.path(e.Name)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %s", ErrExists, e.Name)
		}
		return fmt.Errorf("synthetic event store: %w", err)
	}
	return nil
}

// Get returns the stored definition called name, or ErrNotFound.
func (s Store) Get(name string) (*Event, error) {
	if checkEventName(name) != nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	b, err := os.ReadFile(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (see kconsume synth list)", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("synthetic event store: %w", err)
	}
	e, err := Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.path(name), err)
	}
	return e, nil
}

// Delete removes the definition called name, or fails with ErrNotFound.
func (s Store) Delete(name string) error {
	if checkEventName(name) != nil {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err := os.Remove(s.path(name)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	} else if err != nil {
		return fmt.Errorf("synthetic event store: %w", err)
	}
	return nil
}

// List returns every stored definition, by name. A missing store is
// empty; a file that does not parse fails, naming it.
func (s Store) List() ([]*Event, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("synthetic event store: %w", err)
	}
	var out []*Event
	for _, ent := range entries {
		name, ok := strings.CutSuffix(ent.Name(), storeExt)
		if !ok || strings.HasPrefix(ent.Name(), ".") {
			continue
		}
		e, err := s.Get(name)
		if err != nil {
			return nil, err
		}
		if e.Name != name {
			return nil, fmt.Errorf("%s defines %s", s.path(name), e.Name)
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s Store) path(name string) string { return filepath.Join(s.Dir, name+storeExt) }

// LoadFile reads definitions, one per line, from path; blank lines and
// lines starting with # are skipped. It fails on a malformed line or a
// name defined twice or built in, naming the line.
func LoadFile(path string) ([]*Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("synthetic events: %w", err)
	}
	defer f.Close()
	var out []*Event
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		e, err := Parse(t)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if seen[e.Name] || Builtin(e.Name) != nil {
			return nil, fmt.Errorf("%s:%d: %w: %s", path, line, ErrExists, e.Name)
		}
		seen[e.Name] = true
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("synthetic events: %s: %w", path, err)
	}
	return out, nil
}
