package consumer

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/kconsume/kconsume/internal/kallsyms"
)

// KernelSymbols is the file, in a trace's directory, that holds the
// kernel's function symbols (/proc/kallsyms's code lines, gzip
// compressed) as they were when the recording started, so that its
// kernel call chains resolve on another machine or after a reboot. CTF
// readers skip it, as every file whose name starts with a dot.
const KernelSymbols = ".kallsyms.gz"

// saveKernelSymbols writes KernelSymbols into dir, and after the current
// symbols the lines of kept, those of modules unloaded since an earlier
// save. It fails when /proc/kallsyms cannot be read or hides its
// addresses, or the file cannot be written.
func saveKernelSymbols(dir string, kept []string) error {
	in, err := os.Open("/proc/kallsyms")
	if err != nil {
		return fmt.Errorf("saving the kernel's symbols: %w", err)
	}
	defer in.Close()
	return writeGzip(dir, KernelSymbols, "the kernel's symbols", func(w io.Writer) error {
		if _, err := kallsyms.CopyText(w, in); err != nil {
			return err
		}
		for _, l := range kept {
			if _, err := io.WriteString(w, l+"\n"); err != nil {
				return err
			}
		}
		return nil
	})
}

// loadedModules returns the modules loaded now, by name, with their load
// address (/proc/modules; its use counts change too often to compare);
// none when the file cannot be read.
func loadedModules() map[string]string {
	b, err := os.ReadFile("/proc/modules")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 6 {
			out[f[0]] = f[5]
		}
	}
	return out
}

// refreshKernelSymbols saves the kernel's symbols again when the modules
// loaded differ from those of the last save, so that the frames of a
// module loaded while recording resolve: at each rotation, and at the
// end. The symbols of a module unloaded meanwhile are kept from the
// file saved before. It does nothing for a session that saved none
// (symErr set, no kernel call chains, no directory); it returns the
// save's error.
func (s *Session) refreshKernelSymbols() error {
	if s.kmods == nil || s.symErr != nil {
		return nil
	}
	now := loadedModules()
	if maps.Equal(now, s.kmods) {
		return nil
	}
	var kept []string
	_ = readGzip(s.cfg.Dir, KernelSymbols, "the trace's kernel symbols", func(r io.Reader) error {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l := sc.Text()
			i := strings.LastIndexByte(l, '[')
			if i < 0 || !strings.HasSuffix(l, "]") {
				continue
			}
			mod := l[i+1 : len(l)-1]
			if addr, ok := now[mod]; !ok || addr != s.kmods[mod] {
				kept = append(kept, l)
			}
		}
		return sc.Err()
	})
	if err := saveKernelSymbols(s.cfg.Dir, kept); err != nil {
		return err
	}
	s.kmods = now
	return nil
}

// writeGzip writes into dir/name what fill writes, gzip-compressed, as
// writeAtomic does. Its errors name what.
func writeGzip(dir, name, what string, fill func(io.Writer) error) error {
	return writeAtomic(dir, name, what, func(w io.Writer) error {
		z := gzip.NewWriter(w)
		if err := fill(z); err != nil {
			return err
		}
		return z.Close()
	})
}

// writeAtomic writes into dir/name what fill writes. The file is written
// beside under a dot-name and renamed into place, so that a reader, a
// chunk's copy or a recorder killed meanwhile finds the old content or
// the new, whole. Its errors name what.
func writeAtomic(dir, name, what string, fill func(io.Writer) error) (err error) {
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
	bw := bufio.NewWriterSize(out, 1<<16)
	if err := fill(bw); err != nil {
		return fmt.Errorf("saving %s: %w", what, err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("saving %s: %w", what, err)
	}
	return nil
}

// readGzip calls read with the decompressed content of dir/name. It
// fails with ErrNoSymbols when the file is absent, and with read's
// error or the file's, naming what.
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
