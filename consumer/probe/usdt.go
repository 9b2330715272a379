package probe

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Note is one USDT probe site of an ELF file, as its .note.stapsdt note
// describes it (systemtap's sys/sdt.h, "SystemTap SDT probes"): where it
// is, the semaphore that turns it on, and its arguments' specs.
type Note struct {
	Provider, Name string
	// Offset is the site's offset in the file, where a uprobe goes;
	// Semaphore the file offset of its semaphore, 0 for none.
	Offset, Semaphore uint64
	// Args is the arguments' spec as the compiler wrote it: blank
	// separated [-]SIZE@OPERAND in the assembler's syntax.
	Args string
}

// Notes returns the USDT probe sites of the ELF file at file, those of
// provider:name matching the glob pattern, in note order. It fails when
// the file cannot be read or a note is malformed.
func Notes(file, pattern string) ([]Note, error) {
	f, err := elf.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	notes, err := notesOf(f, pattern)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return notes, nil
}

// notesOf is Notes of the ELF file f.
func notesOf(f *elf.File, pattern string) ([]Note, error) {
	sec := f.Section(".note.stapsdt")
	if sec == nil {
		return nil, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf(".note.stapsdt: %w", err)
	}
	// A prelinked file moved its code: the sites move with
	// .stapsdt.base, whose link-time address each note records.
	var base uint64
	if b := f.Section(".stapsdt.base"); b != nil {
		base = b.Addr
	}
	var out []Note
	for len(data) > 0 {
		if len(data) < 12 {
			return nil, errors.New(".note.stapsdt: a truncated note")
		}
		nsz, dsz, typ := f.ByteOrder.Uint32(data), f.ByteOrder.Uint32(data[4:]), f.ByteOrder.Uint32(data[8:])
		nameEnd := 12 + align4(uint64(nsz))
		end := nameEnd + align4(uint64(dsz))
		if nameEnd > uint64(len(data)) || end > uint64(len(data)) {
			return nil, errors.New(".note.stapsdt: a note overruns the section")
		}
		owner, desc := data[12:12+nsz], data[nameEnd:nameEnd+uint64(dsz)]
		data = data[end:]
		if string(bytes.TrimRight(owner, "\x00")) != "stapsdt" || typ != 3 {
			continue
		}
		n, err := parseNote(f, desc, base)
		if err != nil {
			return nil, err
		}
		if ok, _ := path.Match(pattern, n.Provider+":"+n.Name); ok {
			out = append(out, n)
		}
	}
	return out, nil
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// parseNote reads a stapsdt note's description: three addresses (the
// site, .stapsdt.base at link time, the semaphore), then the provider,
// the name and the arguments, each NUL-terminated.
func parseNote(f *elf.File, desc []byte, base uint64) (Note, error) {
	var n Note
	if len(desc) < 24 {
		return n, errors.New("a stapsdt note too short")
	}
	pc, linkBase, sem := f.ByteOrder.Uint64(desc), f.ByteOrder.Uint64(desc[8:]), f.ByteOrder.Uint64(desc[16:])
	strs := strings.SplitN(string(desc[24:]), "\x00", 4)
	if len(strs) < 4 {
		return n, errors.New("a stapsdt note without its provider, name and arguments")
	}
	n.Provider, n.Name, n.Args = strs[0], strs[1], strs[2]
	if base != 0 && linkBase != 0 {
		pc += base - linkBase
		if sem != 0 {
			sem += base - linkBase
		}
	}
	var err error
	if n.Offset, err = vaddrOffset(f, pc, true); err != nil {
		return n, fmt.Errorf("usdt %s:%s: %w", n.Provider, n.Name, err)
	}
	if sem != 0 {
		if n.Semaphore, err = vaddrOffset(f, sem, false); err != nil {
			return n, fmt.Errorf("usdt %s:%s semaphore: %w", n.Provider, n.Name, err)
		}
	}
	return n, nil
}

// vaddrOffset returns the file offset of virtual address a, in an
// executable segment where exec is set.
func vaddrOffset(f *elf.File, a uint64, exec bool) (uint64, error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && (!exec || p.Flags&elf.PF_X != 0) && a >= p.Vaddr && a < p.Vaddr+p.Filesz {
			return a - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("address 0x%x is in no loaded segment of the file", a)
}

// usdtArgs returns the fetch arguments of a USDT site's spec, arg1 to
// argN, each stored at the size and sign its spec gives. It fails for an
// operand the recorder cannot fetch (an index register, a segment, a
// symbol).
func usdtArgs(spec string) ([]Arg, error) {
	var out []Arg
	for i, w := range strings.Fields(spec) {
		a, err := usdtArg(w)
		if err != nil {
			return nil, fmt.Errorf("argument %d %q: %w", i+1, w, err)
		}
		a.Name = "arg" + strconv.Itoa(i+1)
		out = append(out, a)
	}
	if len(out) > MaxArgs {
		return nil, fmt.Errorf("%d arguments, at most %d", len(out), MaxArgs)
	}
	return out, nil
}

// usdtArg reads one [-]SIZE@OPERAND: %REG, $IMM, or DISP(%REG).
func usdtArg(w string) (Arg, error) {
	var a Arg
	size, op, ok := strings.Cut(w, "@")
	if !ok {
		// Old notes have no size: a word.
		size, op = "8", w
	}
	n, err := strconv.Atoi(size)
	if err != nil || n == 0 {
		return a, fmt.Errorf("size %q", size)
	}
	signed := n < 0
	if signed {
		n = -n
	}
	if n != 1 && n != 2 && n != 4 && n != 8 {
		return a, fmt.Errorf("size %d", n)
	}
	a.Type = Type{Name: fmt.Sprintf("u%d", 8*n), Size: n, Signed: signed}
	if signed {
		a.Type.Name = fmt.Sprintf("s%d", 8*n)
	}
	switch {
	case strings.HasPrefix(op, "%"):
		r, ok := subReg(op[1:])
		if !ok {
			return a, fmt.Errorf("register %s", op)
		}
		a.Fetch = Fetch{Base: Reg, N: int64(r)}
	case strings.HasPrefix(op, "$"):
		v, err := parseInt(op[1:])
		if err != nil {
			return a, fmt.Errorf("constant %s", op)
		}
		a.Fetch = Fetch{Base: Imm, N: v}
	default:
		open := strings.IndexByte(op, '(')
		if open < 0 || !strings.HasSuffix(op, ")") || strings.Contains(op, ",") || strings.Contains(op, ":") {
			return a, errors.New("an operand kconsume cannot fetch yet (an index, a segment or a symbol)")
		}
		disp := int64(0)
		if open > 0 {
			if disp, err = parseInt(op[:open]); err != nil {
				return a, fmt.Errorf("displacement %q", op[:open])
			}
		}
		r, ok := subReg(strings.TrimPrefix(op[open+1:len(op)-1], "%"))
		if !ok || r == regIP {
			return a, fmt.Errorf("base register of %s", op)
		}
		a.Fetch = Fetch{Base: Reg, N: int64(r), Derefs: []Deref{{Off: disp, User: true}}}
	}
	return a, nil
}

// ListUSDT returns the USDT probes of the ELF file at file whose
// provider:name matches pattern, each once and sorted, as
// usdt:FILE:PROVIDER:NAME.
func ListUSDT(file, pattern string) ([]string, error) {
	notes, err := Notes(file, pattern)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, n := range notes {
		s := "usdt:" + file + ":" + n.Provider + ":" + n.Name
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out, nil
}

// resolveUSDT reads p's sites from its file and fills in its arguments
// and sites. It fails when the file has no such probe, or its sites
// differ in their arguments (each site would need steps of its own).
func (p *Probe) resolveUSDT() error {
	notes, err := Notes(p.Path, p.Provider+":"+p.Symbol)
	if err != nil {
		return err
	}
	if len(notes) == 0 {
		return fmt.Errorf("%s has no USDT probe %s:%s (kconsume list usdt:%s)", p.Path, p.Provider, p.Symbol, p.Path)
	}
	for _, n := range notes[1:] {
		if n.Args != notes[0].Args {
			return fmt.Errorf("usdt %s:%s: its %d sites fetch their arguments differently (%q, %q): not supported yet", p.Provider, p.Symbol, len(notes), notes[0].Args, n.Args)
		}
	}
	if p.Args, err = usdtArgs(notes[0].Args); err != nil {
		return fmt.Errorf("usdt %s:%s: %w", p.Provider, p.Symbol, err)
	}
	p.Sites = notes
	return nil
}
