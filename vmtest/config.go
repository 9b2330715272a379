package vmtest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Config is a vmtest.toml: the kernel matrix. Its [[target]] tables
// follow the schema of danobi/vmtest (name, kernel, kernel_args, command,
// and a vm table with num_cpus and memory), except that kernel may name
// a Debian kernel series instead of a bzImage path and run may narrow the
// suite.
type Config struct {
	Target []Target `toml:"target"`
}

// Target is one guest configuration of the matrix.
type Target struct {
	Name       string `toml:"name"`
	Kernel     string `toml:"kernel"`      // series ("6.1"), release, "newest", or a bzImage path
	KernelArgs string `toml:"kernel_args"` // appended to the kernel command line
	Command    string `toml:"command"`     // shell command; empty runs the Go test suite
	// Run, beyond danobi/vmtest's schema, runs only the suite's tests
	// that match this regular expression (go test -run), for a target
	// that checks one thing on one more kernel configuration.
	Run string `toml:"run"`
	VM  struct {
		NumCPUs int    `toml:"num_cpus"`
		Memory  string `toml:"memory"` // "2G", "512M"
	} `toml:"vm"`
}

// LoadConfig reads and checks a vmtest.toml. It fails on a syntax error,
// an unknown key, or a target without name or kernel.
func LoadConfig(path string) (*Config, error) {
	var c Config
	md, err := toml.DecodeFile(path, &c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("%s: unknown key %s", path, und[0])
	}
	seen := map[string]bool{}
	for i, t := range c.Target {
		if t.Name == "" || t.Kernel == "" {
			return nil, fmt.Errorf("%s: target %d needs a name and a kernel", path, i+1)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("%s: target %q given twice", path, t.Name)
		}
		seen[t.Name] = true
		if _, err := t.MemoryMB(); err != nil {
			return nil, fmt.Errorf("%s: target %q: %w", path, t.Name, err)
		}
	}
	return &c, nil
}

// Select returns the targets named in names (by name or kernel), in the
// order given; a name that is no target becomes a target of that kernel.
// No names select every target.
func (c *Config) Select(names []string) []Target {
	if len(names) == 0 {
		return c.Target
	}
	var out []Target
	for _, n := range names {
		found := false
		for _, t := range c.Target {
			if t.Name == n || t.Kernel == n {
				out = append(out, t)
				found = true
				break
			}
		}
		if !found {
			out = append(out, Target{Name: n, Kernel: n})
		}
	}
	return out
}

// MemoryMB returns the target's memory in MiB, 0 for the default. It
// fails on a size that is not a number with an optional K, M or G.
func (t Target) MemoryMB() (int, error) {
	s := strings.TrimSpace(strings.ToUpper(t.VM.Memory))
	if s == "" {
		return 0, nil
	}
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1024, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		s = strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "K"):
		mult, s = 1.0/1024, strings.TrimSuffix(s, "K")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("memory %q: want a size such as 2G or 512M", t.VM.Memory)
	}
	return int(v * mult), nil
}
