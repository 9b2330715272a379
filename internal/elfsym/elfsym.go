// Package elfsym reads an ELF object's function symbols and build id, to
// name the code addresses of a process that mapped it: the symbols of
// .symtab and .dynsym, or of its separate debug file where the object
// itself was stripped.
package elfsym

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// Symbol is a function of an object: its name, and its start and size
// in the object's virtual addresses.
type Symbol struct {
	Name        string
	Value, Size uint64
	rank        int // of the names at one address, the lowest is shown
}

// Object is what addresses of one ELF file need to be named.
type Object struct {
	Path    string
	BuildID string // hex; "" when the object has none
	// Debug is the separate debug file the symbols came from, or "".
	Debug string
	syms  []Symbol // by Value
	loads []elf.ProgHeader
}

// DebugDir is where separate debug files are looked for by build id
// (.build-id/xx/yyyy.debug) and by debug link (DIR/NAME), as gdb looks.
var DebugDir = "/usr/lib/debug"

// Open returns the function symbols, build id and loadable segments of
// the ELF file at path; where it has no .symtab, the symbols of its
// debug file (found by build id, then by .gnu_debuglink) are added. It
// fails when path cannot be read or is not ELF.
func Open(path string) (*Object, error) { return OpenAt(path, path) }

// OpenAt is Open for the ELF file at path read from from, another name
// of it (/proc/self/fd/N of a file held open, which stays readable once
// deleted): path, its name, is where a debug link is looked for.
func OpenAt(path, from string) (*Object, error) {
	f, err := elf.Open(from)
	if err != nil {
		return nil, fmt.Errorf("elfsym: %w", err)
	}
	defer f.Close()
	o := &Object{Path: path, BuildID: buildID(f)}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			o.loads = append(o.loads, p.ProgHeader)
		}
	}
	syms, err := f.Symbols()
	var fs []Symbol
	if errors.Is(err, elf.ErrNoSymbols) {
		if d, dsyms := o.debugSymbols(f); d != "" {
			o.Debug, fs = d, dsyms
		}
	} else {
		fs = functions(f, syms)
	}
	dyn, _ := f.DynamicSymbols()
	o.syms = sorted(append(fs, functions(f, dyn)...))
	return o, nil
}

// functions returns the defined functions of syms, symbols of f; one
// without a size reaches the end of its section.
func functions(f *elf.File, syms []elf.Symbol) []Symbol {
	var out []Symbol
	for _, s := range syms {
		t := elf.ST_TYPE(s.Info)
		if (t != elf.STT_FUNC && t != elf.STT_GNU_IFUNC) || s.Section == elf.SHN_UNDEF || s.Value == 0 {
			continue
		}
		size := s.Size
		if i := int(s.Section); size == 0 && i < len(f.Sections) {
			if sec := f.Sections[i]; s.Value >= sec.Addr && s.Value < sec.Addr+sec.Size {
				size = sec.Addr + sec.Size - s.Value
			}
		}
		out = append(out, Symbol{Name: s.Name, Value: s.Value, Size: size, rank: rank(s)})
	}
	return out
}

// rank orders the names of one address as perf's choose_best_symbol
// (tools/perf/util/symbol.c) does: not weak before weak, global before
// local, then fewer leading underscores; sorted breaks the remaining
// ties by the shorter name.
func rank(s elf.Symbol) int {
	r := 0
	switch elf.ST_BIND(s.Info) {
	case elf.STB_WEAK:
		r = 2
	case elf.STB_GLOBAL:
	default:
		r = 1
	}
	return r*1000 + len(s.Name) - len(strings.TrimLeft(s.Name, "_"))
}

// sorted returns syms by address, without repeats; a symbol still
// without a size reaches the next one.
func sorted(out []Symbol) []Symbol {
	slices.SortFunc(out, func(a, b Symbol) int {
		if a.Value != b.Value {
			return cmp.Compare(a.Value, b.Value)
		}
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		if len(a.Name) != len(b.Name) {
			return len(a.Name) - len(b.Name)
		}
		return strings.Compare(a.Name, b.Name)
	})
	out = slices.CompactFunc(out, func(a, b Symbol) bool { return a.Value == b.Value && a.Name == b.Name })
	for i := range out {
		if out[i].Size == 0 && i+1 < len(out) {
			out[i].Size = out[i+1].Value - out[i].Value
		}
	}
	return out
}

// buildID returns the hex of f's NT_GNU_BUILD_ID note, or "".
func buildID(f *elf.File) string {
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		data, err := s.Data()
		if err != nil {
			continue
		}
		if id := noteBuildID(data, f.ByteOrder); id != "" {
			return id
		}
	}
	return ""
}

// noteBuildID walks the notes in data (Elf_Nhdr, then name and
// descriptor each padded to 4 bytes) for a GNU build id.
func noteBuildID(data []byte, bo binary.ByteOrder) string {
	const ntGNUBuildID = 3
	for len(data) >= 12 {
		namesz, descsz, typ := bo.Uint32(data), bo.Uint32(data[4:]), bo.Uint32(data[8:])
		nameEnd := 12 + (uint64(namesz)+3)&^3
		descEnd := nameEnd + (uint64(descsz)+3)&^3
		if descEnd > uint64(len(data)) || nameEnd > uint64(len(data)) {
			return ""
		}
		name := data[12 : 12+uint64(namesz)]
		if typ == ntGNUBuildID && bytes.Equal(bytes.TrimRight(name, "\x00"), []byte("GNU")) {
			return hex.EncodeToString(data[nameEnd : nameEnd+uint64(descsz)])
		}
		data = data[descEnd:]
	}
	return ""
}

// debugSymbols returns the debug file of f, found by build id or by its
// .gnu_debuglink, and that file's functions; "" where none is found with
// a matching build id.
func (o *Object) debugSymbols(f *elf.File) (string, []Symbol) {
	var cands []string
	if len(o.BuildID) > 2 {
		cands = append(cands, filepath.Join(DebugDir, ".build-id", o.BuildID[:2], o.BuildID[2:]+".debug"))
	}
	if s := f.Section(".gnu_debuglink"); s != nil {
		if data, err := s.Data(); err == nil {
			if i := bytes.IndexByte(data, 0); i > 0 {
				name := string(data[:i])
				dir := filepath.Dir(o.Path)
				cands = append(cands, filepath.Join(dir, name), filepath.Join(dir, ".debug", name), filepath.Join(DebugDir, dir, name))
			}
		}
	}
	for _, c := range cands {
		if c == o.Path {
			continue
		}
		df, err := elf.Open(c)
		if err != nil {
			continue
		}
		syms, err := df.Symbols()
		id := buildID(df)
		funcs := functions(df, syms)
		df.Close()
		if err == nil && (o.BuildID == "" || id == o.BuildID) {
			return c, funcs
		}
	}
	return "", nil
}

// Segment is a loadable segment: Filesz bytes at file offset Off, mapped
// at virtual address Vaddr.
type Segment struct {
	Off    uint64 `json:"off"`
	Vaddr  uint64 `json:"vaddr"`
	Filesz uint64 `json:"filesz"`
}

// Segments returns the object's loadable segments.
func (o *Object) Segments() []Segment {
	out := make([]Segment, len(o.loads))
	for i, p := range o.loads {
		out[i] = Segment{Off: p.Off, Vaddr: p.Vaddr, Filesz: p.Filesz}
	}
	return out
}

// Saved returns an object made of parts another one gave (Segments,
// Symbols), as a trace keeps them: symbols in address order, the name to
// show of an address first.
func Saved(path, buildID string, segs []Segment, syms []Symbol) *Object {
	o := &Object{Path: path, BuildID: buildID, syms: slices.Clone(syms)}
	slices.SortStableFunc(o.syms, func(a, b Symbol) int { return cmp.Compare(a.Value, b.Value) })
	for _, s := range segs {
		o.loads = append(o.loads, elf.ProgHeader{Type: elf.PT_LOAD, Off: s.Off, Vaddr: s.Vaddr, Filesz: s.Filesz})
	}
	return o
}

// Symbols returns the object's functions, by address.
func (o *Object) Symbols() []Symbol { return o.syms }

// Vaddr returns the virtual address in the object of the byte at file
// offset off, found in its loadable segments; ok is false outside them.
func (o *Object) Vaddr(off uint64) (uint64, bool) {
	for _, p := range o.loads {
		if off >= p.Off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr, true
		}
	}
	return 0, false
}

// Lookup returns the function holding virtual address vaddr and vaddr's
// offset into it; ok is false where no function holds it.
func (o *Object) Lookup(vaddr uint64) (s Symbol, off uint64, ok bool) {
	i, found := slices.BinarySearchFunc(o.syms, vaddr, func(s Symbol, v uint64) int { return cmp.Compare(s.Value, v) })
	if !found {
		i--
	}
	if i < 0 {
		return Symbol{}, 0, false
	}
	// The best name of that address is its first.
	for i > 0 && o.syms[i-1].Value == o.syms[i].Value {
		i--
	}
	s = o.syms[i]
	if s.Size > 0 && vaddr >= s.Value+s.Size {
		return Symbol{}, 0, false
	}
	return s, vaddr - s.Value, true
}

// Resolve returns the function holding addr, an address of a process
// that maps the object at start from file offset pgoff (a line of
// /proc/PID/maps), and addr's offset into it.
func (o *Object) Resolve(addr, start, pgoff uint64) (s Symbol, off uint64, ok bool) {
	if addr < start {
		return Symbol{}, 0, false
	}
	v, ok := o.Vaddr(addr - start + pgoff)
	if !ok {
		return Symbol{}, 0, false
	}
	return o.Lookup(v)
}

// ReadBuildID returns the build id of the ELF file at path, "" when it
// has none. It fails when path cannot be read or is not ELF.
func ReadBuildID(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("elfsym: %w", err)
	}
	defer f.Close()
	return buildID(f), nil
}
