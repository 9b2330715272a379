package consumer

import (
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kconsume/kconsume/internal/kallsyms"
)

// KernelSymbols is the file, in a trace's directory, that holds the
// kernel's function symbols (/proc/kallsyms's code lines, gzip
// compressed) as they were when the recording started, so that its
// kernel call chains resolve on another machine or after a reboot. CTF
// readers skip it, as every file whose name starts with a dot.
const KernelSymbols = ".kallsyms.gz"

// saveKernelSymbols writes KernelSymbols into dir. It fails when
// /proc/kallsyms cannot be read or hides its addresses, or the file
// cannot be written.
func saveKernelSymbols(dir string) (err error) {
	in, err := os.Open("/proc/kallsyms")
	if err != nil {
		return fmt.Errorf("saving the kernel's symbols: %w", err)
	}
	defer in.Close()
	path := filepath.Join(dir, KernelSymbols)
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("saving the kernel's symbols: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("saving the kernel's symbols: %w", cerr)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	z := gzip.NewWriter(out)
	if _, err := kallsyms.CopyText(z, in); err != nil {
		return fmt.Errorf("saving the kernel's symbols: %w", err)
	}
	if err := z.Close(); err != nil {
		return fmt.Errorf("saving the kernel's symbols: %w", err)
	}
	return nil
}

// ErrNoSymbols is returned by ReadKernelSymbols for a trace that holds
// no kernel symbols: one recorded without kernel call chains, or whose
// kernel hid its addresses.
var ErrNoSymbols = errors.New("the trace holds no kernel symbols")

// ReadKernelSymbols returns the kernel symbols saved in the trace in dir
// (KernelSymbols). It fails with ErrNoSymbols when there are none, or
// when the file is unreadable or corrupt.
func ReadKernelSymbols(dir string) (*kallsyms.Table, error) {
	f, err := os.Open(filepath.Join(dir, KernelSymbols))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoSymbols
	}
	if err != nil {
		return nil, fmt.Errorf("reading the trace's kernel symbols: %w", err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("reading the trace's kernel symbols %s: %w", f.Name(), err)
	}
	t, err := kallsyms.Parse(z)
	if errors.Is(err, kallsyms.ErrHidden) {
		return nil, ErrNoSymbols
	}
	if err != nil {
		return nil, fmt.Errorf("reading the trace's kernel symbols %s: %w", f.Name(), err)
	}
	return t, nil
}
