package elfsym

import (
	"bufio"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/procfs"
)

// build compiles testdata/kcsym.c with flags into dir, and returns the
// binary's path.
func build(t *testing.T, dir string, flags ...string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	bin := filepath.Join(dir, "kcsym")
	args := append([]string{"-O2", "-g", "-Wl,--build-id", "-o", bin, "testdata/kcsym.c"}, flags...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("cc %v: %v: %s", args, err, out)
	}
	return bin
}

// nmFuncs returns the text symbols nm lists for bin, by address (the
// names at each), from .symtab or, with dynamic, from .dynsym.
func nmFuncs(t *testing.T, bin string, dynamic bool) map[uint64][]string {
	t.Helper()
	args := []string{"--defined-only", bin}
	if dynamic {
		args = append([]string{"-D"}, args...)
	}
	out, err := exec.Command("nm", args...).Output()
	if err != nil {
		t.Skipf("nm: %v", err)
	}
	funcs := map[uint64][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || (f[1] != "T" && f[1] != "t" && f[1] != "i") {
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		funcs[a] = append(funcs[a], f[2])
	}
	return funcs
}

// readelfID returns the build id readelf -n prints for bin.
func readelfID(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command("readelf", "-n", bin).Output()
	if err != nil {
		t.Skipf("readelf: %v", err)
	}
	m := regexp.MustCompile(`Build ID: ([0-9a-f]+)`).FindSubmatch(out)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// TestSymbolsMatchNm holds Open's functions and build id to binutils'
// nm and readelf, for a PIE, a fixed-address binary, and one stripped
// whose symbols are in a separate debug file named by its debug link.
func TestSymbolsMatchNm(t *testing.T) {
	for _, c := range []struct {
		name  string
		flags []string
	}{{"pie", []string{"-fPIE", "-pie"}}, {"no-pie", []string{"-fno-PIE", "-no-pie"}}, {"debuglink", nil}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := build(t, dir, c.flags...)
			want := nmFuncs(t, bin, false)
			if c.name == "debuglink" {
				dbg := bin + ".debug"
				for _, args := range [][]string{{"--only-keep-debug", bin, dbg}, {"--strip-all", "--add-gnu-debuglink=" + dbg, bin}} {
					if out, err := exec.Command("objcopy", args...).CombinedOutput(); err != nil {
						t.Fatalf("objcopy %v: %v: %s", args, err, out)
					}
				}
			}
			o, err := Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "debuglink" && o.Debug != bin+".debug" {
				t.Errorf("debug file %q, want %q", o.Debug, bin+".debug")
			}
			if id := readelfID(t, bin); id == "" || o.BuildID != id {
				t.Errorf("build id %q, readelf says %q", o.BuildID, id)
			}
			got := map[uint64][]string{}
			for _, s := range o.Symbols() {
				got[s.Value] = append(got[s.Value], s.Name)
			}
			for a, names := range want {
				for _, n := range names {
					s, off, ok := o.Lookup(a)
					if !ok || off != 0 || !slices.Contains(names, s.Name) {
						t.Errorf("Lookup(%#x) = %q+%#x %v; nm names it %q", a, s.Name, off, ok, names)
					}
					if !slices.Contains(got[a], n) {
						t.Errorf("%s at %#x, which nm lists, is missing", n, a)
					}
				}
			}
			if len(got) == 0 || len(want) == 0 {
				t.Fatalf("%d functions, nm lists %d", len(got), len(want))
			}
		})
	}
}

// TestResolveRunning names the runtime addresses a running PIE prints
// of its own functions and of libc's write, through its mappings in
// /proc/PID/maps.
func TestResolveRunning(t *testing.T) {
	dir := t.TempDir()
	bin := build(t, dir, "-fPIE", "-pie")
	cmd := exec.Command(bin)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	addrs := map[string]uint64{}
	sc := bufio.NewScanner(stdout)
	for len(addrs) < 5 && sc.Scan() {
		var name string
		var a uint64
		if _, err := fmt.Sscanf(sc.Text(), "%s 0x%x", &name, &a); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		addrs[name] = a
	}
	proc, err := procfs.NewProc(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	maps, err := proc.ProcMaps()
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]*Object{}
	libcWrite := map[string]bool{}
	for name, a := range addrs {
		var found *procfs.ProcMap
		for _, m := range maps {
			if uint64(m.StartAddr) <= a && a < uint64(m.EndAddr) {
				found = m
			}
		}
		if found == nil || found.Pathname == "" {
			t.Fatalf("%s at %#x: no mapping of a file", name, a)
		}
		o := objs[found.Pathname]
		if o == nil {
			if o, err = Open(found.Pathname); err != nil {
				t.Fatal(err)
			}
			objs[found.Pathname] = o
		}
		for _, k := range []uint64{0, 1} {
			s, off, ok := o.Resolve(a+k, uint64(found.StartAddr), uint64(found.Offset))
			switch {
			case !ok:
				t.Errorf("%s+%d at %#x in %s: not resolved", name, k, a+k, found.Pathname)
			case name == "write":
				// libc has aliases at write (weak write and __write,
				// global __libc_write where its symbols are installed):
				// one name for the whole function, as perf chooses it.
				libcWrite[s.Name] = true
				if off != k || !strings.Contains(s.Name, "write") || len(libcWrite) > 1 {
					t.Errorf("write+%d resolved to %s+%#x (names seen: %v)", k, s.Name, off, libcWrite)
				}
			case s.Name != name || off != k:
				t.Errorf("%s+%d resolved to %s+%#x", name, k, s.Name, off)
			}
		}
	}
	t.Logf("resolved %d addresses in %d objects; libc's write is %v", len(addrs), len(objs), libcWrite)
}
