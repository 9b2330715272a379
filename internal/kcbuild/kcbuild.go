// Package kcbuild builds the kconsume command for the tests, the benchmarks
// and the VM suite the way make build does.
package kcbuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Build builds cmd/kconsume into out as a static binary (CGO_ENABLED=0:
// nothing in it needs C, and it must run in VM images and initramfs
// guests without the host's libc). It fails with the compiler's output
// when go build fails.
func Build(ctx context.Context, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/kconsume/kconsume/cmd/kconsume")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build kconsume: %w: %s", err, strings.TrimSpace(string(b)))
	}
	return nil
}
