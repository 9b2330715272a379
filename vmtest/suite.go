package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kconsume/kconsume/internal/kcbuild"
)

// Suite is a Go test suite compiled on the host, ready to run in guests:
// a shell script that runs every package's test binary in its source
// directory, as go test does, and exits non-zero if any fails.
type Suite struct {
	Dir      string   // holds the binaries and the script; remove when done
	Script   string   // the guest command: sh Script
	Packages []string // import paths with tests, in run order
	Env      []string // environment the tests need (KCONSUME_BIN, KCONSUME_VMTEST)
}

// RunEnv names the guest's environment variable that holds a target's
// run pattern (Target.Run), which the suite's script passes its tests.
const RunEnv = "KCONSUME_VMTEST_RUN"

// BuildSuite compiles the tests of pkgs (go list patterns) and the
// kconsume command into a new directory under dir, and writes the script
// that runs them with testArgs (such as -test.run, -test.v). Packages
// without tests are left out. It fails when go list or a build fails.
func BuildSuite(ctx context.Context, dir string, pkgs, testArgs []string) (*Suite, error) {
	work, err := os.MkdirTemp(dir, "vmtest-suite-")
	if err != nil {
		return nil, fmt.Errorf("suite: %w", err)
	}
	s := &Suite{Dir: work}
	fail := func(err error) (*Suite, error) {
		os.RemoveAll(work)
		return nil, err
	}
	list := exec.CommandContext(ctx, "go", append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{len .TestGoFiles}}\t{{len .XTestGoFiles}}"}, pkgs...)...)
	var stderr bytes.Buffer
	list.Stderr = &stderr
	out, err := list.Output()
	if err != nil {
		return fail(fmt.Errorf("go list %s: %w: %s", strings.Join(pkgs, " "), err, strings.TrimSpace(stderr.String())))
	}
	var script strings.Builder
	script.WriteString("failed=\n")
	sc := bufio.NewScanner(bytes.NewReader(out))
	for i := 0; sc.Scan(); i++ {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 4 || (f[2] == "0" && f[3] == "0") {
			continue
		}
		bin := filepath.Join(work, fmt.Sprintf("%02d.test", i))
		build := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, f[0])
		if b, err := build.CombinedOutput(); err != nil {
			return fail(fmt.Errorf("go test -c %s: %w: %s", f[0], err, strings.TrimSpace(string(b))))
		}
		s.Packages = append(s.Packages, f[0])
		args := []string{bin, "-test.count=1", "-test.timeout=30m"}
		args = append(args, testArgs...)
		for i := range args {
			args[i] = shellQuote(args[i])
		}
		fmt.Fprintf(&script, "echo \"vmtest: testing %s\"\n", f[0])
		// A target's run (RunEnv) narrows the tests: the last -test.run
		// given is the one that counts.
		fmt.Fprintf(&script, "start=$(date +%%s)\ncd %s && %s ${%s:+\"-test.run=$%s\"}\nst=$?\nend=$(date +%%s)\n", shellQuote(f[1]), strings.Join(args, " "), RunEnv, RunEnv)
		fmt.Fprintf(&script, "if [ $st -eq 0 ]; then echo \"ok   %s $((end-start))s\"; else echo \"FAIL %s $((end-start))s (exit $st)\"; failed=\"$failed %s\"; fi\n", f[0], f[0], f[0])
	}
	script.WriteString("if [ -n \"$failed\" ]; then echo \"vmtest: failed:$failed\"; exit 1; fi\n")
	bin := filepath.Join(work, "kconsume")
	if err := kcbuild.Build(ctx, bin); err != nil {
		return fail(err)
	}
	s.Env = []string{"KCONSUME_BIN=" + bin, "KCONSUME_VMTEST=1", "KCONSUME_STRICT=1"}
	s.Script = filepath.Join(work, "suite.sh")
	if err := os.WriteFile(s.Script, []byte(script.String()), 0o644); err != nil {
		return fail(fmt.Errorf("suite: %w", err))
	}
	return s, nil
}
