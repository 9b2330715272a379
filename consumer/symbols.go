package consumer

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
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
func saveKernelSymbols(dir string) error {
	in, err := os.Open("/proc/kallsyms")
	if err != nil {
		return fmt.Errorf("saving the kernel's symbols: %w", err)
	}
	defer in.Close()
	return writeGzip(dir, KernelSymbols, "the kernel's symbols", func(w io.Writer) error {
		_, err := kallsyms.CopyText(w, in)
		return err
	})
}

// writeGzip writes into dir/name what fill writes, gzip-compressed. The
// file is written beside under a dot-name and renamed into place, so
// that a reader, a chunk's copy or a recorder killed meanwhile finds the
// old content or the new, whole. Its errors name what.
func writeGzip(dir, name, what string, fill func(io.Writer) error) (err error) {
	out, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("saving %s: %w", what, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("saving %s: %w", what, cerr)
		}
		if err == nil {
			if rerr := os.Rename(out.Name(), filepath.Join(dir, name)); rerr != nil {
				err = fmt.Errorf("saving %s: %w", what, rerr)
			}
		}
		if err != nil {
			os.Remove(out.Name())
		}
	}()
	if err := out.Chmod(0o644); err != nil {
		return fmt.Errorf("saving %s: %w", what, err)
	}
	z := gzip.NewWriter(out)
	if err := fill(z); err != nil {
		return fmt.Errorf("saving %s: %w", what, err)
	}
	if err := z.Close(); err != nil {
		return fmt.Errorf("saving %s: %w", what, err)
	}
	return nil
}

func readGzip(dir, name, what string, read func(io.Reader) error) error {
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return ErrNoSymbols
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err == nil {
		err = read(z)
	}
	if err != nil && !errors.Is(err, ErrNoSymbols) {
		return fmt.Errorf("reading %s %s: %w", what, f.Name(), err)
	}
	return err
}

// ErrNoSymbols is returned by ReadKernelSymbols for a trace that holds
// no kernel symbols: one recorded without kernel call chains, or whose
// kernel hid its addresses.
var ErrNoSymbols = errors.New("the trace holds no kernel symbols")

// ReadKernelSymbols returns the kernel symbols saved in the trace in dir
// (KernelSymbols). It fails with ErrNoSymbols when there are none, or
// when the file is unreadable or corrupt.
func ReadKernelSymbols(dir string) (*kallsyms.Table, error) {
	var t *kallsyms.Table
	err := readGzip(dir, KernelSymbols, "the trace's kernel symbols", func(r io.Reader) error {
		var err error
		if t, err = kallsyms.Parse(r); errors.Is(err, kallsyms.ErrHidden) {
			return ErrNoSymbols
		}
		return err
	})
	return t, err
}
