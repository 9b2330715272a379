package consumer

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"
)

// FuzzSymbolFiles: a trace's symbol files, whatever they hold once
// decompressed, are read or refused with an error, and whatever is read
// resolves addresses or says it cannot; never a panic.
func FuzzSymbolFiles(f *testing.F) {
	f.Add([]byte(`{"model":{"threads":{"2":1},"procs":{"1":[{"since":0,"maps":[{"start":4096,"end":8192,"pgoff":0,"obj":0}]}]},"objects":[{"path":"/a"}]},"objects":[{"path":"/a","segments":[{"off":0,"vaddr":0,"filesz":4096}],"symbols":[{"n":"f","v":16,"s":8}]}]}`))
	f.Add([]byte(`{"model":{"procs":{"1":[{"maps":[{"start":1,"end":0,"obj":-1}]}]},"objects":[{}]},"objects":[{}]}`))
	f.Add([]byte("ffffffff81000000 T _text\nffffffff81000100 t f [mod]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		w.Write(data)
		w.Close()
		for _, name := range []string{UserSymbols, KernelSymbols} {
			if err := os.WriteFile(filepath.Join(dir, name), z.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if u, err := ReadUserSymbols(dir); err == nil {
			for _, a := range []uint64{0, 1, 16, 4096, 4100, 8191, 1 << 63} {
				u.Resolve(1, 5, a)
				u.Resolve(2, 0, a)
			}
		}
		if k, err := ReadKernelSymbols(dir); err == nil {
			k.Symbol(0xffffffff81000104)
		}
	})
}
