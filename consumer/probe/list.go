package probe

import (
	"debug/elf"
	"errors"
	"fmt"
	"path"
	"slices"
)

// Functions returns the names of the functions of the ELF file at file
// that a uprobe can name, those of its .symtab and .dynsym defined in
// it, which match the glob pattern, sorted, each once. It fails when the
// file cannot be read, is not ELF or pattern is malformed.
func Functions(file, pattern string) ([]string, error) {
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, fmt.Errorf("pattern %q: %w", pattern, err)
	}
	f, err := elf.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	var names []string
	for _, read := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, err := read()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || s.Name == "" {
				continue
			}
			if ok, _ := path.Match(pattern, s.Name); ok {
				names = append(names, s.Name)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
