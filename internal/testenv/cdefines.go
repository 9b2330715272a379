package testenv

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// cDefine is a `#define KC_NAME value` of the BPF sources whose value is
// a number or a bit, (1U << N).
var cDefine = regexp.MustCompile(`(?m)^#define\s+(KC_[A-Z0-9_]+)\s+(?:(0x[0-9a-fA-F]+|[0-9]+)(?:U|ULL|u)?\b|\(1U?\s*<<\s*([0-9]+)\))`)

// CheckMirrors fails t for each constant of mirrors (a C name, KC_*, and
// the Go side's value) that differs from its #define in the C sources
// under dir, that no source there defines, or that two sources define
// differently.
func CheckMirrors(t testing.TB, dir string, mirrors map[string]uint64) {
	t.Helper()
	defs := map[string]uint64{}
	where := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".h") || strings.HasSuffix(path, ".c")) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range cDefine.FindAllStringSubmatch(string(b), -1) {
			num, shift := m[2], m[3]
			v, err := strconv.ParseUint(num+shift, 0, 64)
			if err != nil {
				t.Fatalf("%s: %s: %v", path, m[0], err)
			}
			if shift != "" {
				v = 1 << v
			}
			if old, ok := defs[m[1]]; ok && old != v {
				t.Errorf("%s is %d in %s and %d in %s", m[1], old, where[m[1]], v, path)
			}
			defs[m[1]], where[m[1]] = v, path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range mirrors {
		got, ok := defs[name]
		switch {
		case !ok:
			t.Errorf("%s: no #define in %s (the Go side mirrors %d)", name, dir, want)
		case got != want:
			t.Errorf("%s is %d in %s, the Go side has %d", name, got, where[name], want)
		}
	}
}
