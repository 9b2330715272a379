// Package kallsyms reads the running kernel's symbol table,
// /proc/kallsyms, to find a function by name or by an address inside it.
package kallsyms

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Table is a kernel symbol table: each symbol's start, in address order.
// A symbol ends where the next one starts, as kallsyms_lookup_size_offset
// (kernel/kallsyms.c) sizes it.
type Table struct {
	addrs   []uint64
	names   []string
	modules []string // "" for the kernel's own
	by      map[string]int
}

// ErrHidden is returned when the kernel shows every address as 0
// (kptr_restrict, or a reader without CAP_SYSLOG).
var ErrHidden = errors.New("kallsyms: the kernel hides its symbols' addresses")

// Read returns the running kernel's symbol table. It fails when
// /proc/kallsyms cannot be read or shows no address.
func Read() (*Table, error) {
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return nil, fmt.Errorf("kallsyms: %w", err)
	}
	defer f.Close()
	return Parse(f)
}

// Parse returns the symbol table in r, in /proc/kallsyms's format
// ("ADDRESS TYPE NAME [MODULE]" a line). Module symbols count as the
// others. It fails when r cannot be read or shows no address.
func Parse(r io.Reader) (*Table, error) {
	type sym struct {
		addr         uint64
		name, module string
	}
	var syms []sym
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		parts := strings.Fields(sc.Text())
		if len(parts) < 3 {
			continue
		}
		a, err := strconv.ParseUint(parts[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		var mod string
		if len(parts) > 3 {
			mod = strings.Trim(parts[3], "[]")
		}
		syms = append(syms, sym{a, parts[2], mod})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kallsyms: %w", err)
	}
	if len(syms) == 0 {
		return nil, ErrHidden
	}
	sort.SliceStable(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	t := &Table{by: map[string]int{}}
	for i, s := range syms {
		t.addrs = append(t.addrs, s.addr)
		t.names = append(t.names, s.name)
		t.modules = append(t.modules, s.module)
		if _, dup := t.by[s.name]; !dup {
			t.by[s.name] = i
		}
	}
	return t, nil
}

// end returns where symbol i ends: the next higher address.
func (t *Table) end(i int) uint64 {
	j := sort.Search(len(t.addrs), func(j int) bool { return t.addrs[j] > t.addrs[i] })
	if j == len(t.addrs) {
		return t.addrs[i] + 1
	}
	return t.addrs[j]
}

// Lookup returns the start and end of the first symbol named name, and
// false when the table has none.
func (t *Table) Lookup(name string) (start, end uint64, ok bool) {
	i, ok := t.by[name]
	if !ok {
		return 0, 0, false
	}
	return t.addrs[i], t.end(i), true
}

// Containing returns the start and end of the symbol that holds addr,
// and false for an address below the first symbol.
func (t *Table) Containing(addr uint64) (start, end uint64, ok bool) {
	i := sort.Search(len(t.addrs), func(i int) bool { return t.addrs[i] > addr }) - 1
	if i < 0 {
		return 0, 0, false
	}
	return t.addrs[i], t.end(i), true
}

// Name returns the name of the symbol that holds addr and addr's offset
// in it, and false for an address below the first symbol.
func (t *Table) Name(addr uint64) (name string, off uint64, ok bool) {
	name, _, off, ok = t.Symbol(addr)
	return name, off, ok
}

// Symbol returns the name of the symbol that holds addr, the module it
// belongs to ("" for the kernel's own) and addr's offset in it, and
// false for an address below the first symbol.
func (t *Table) Symbol(addr uint64) (name, module string, off uint64, ok bool) {
	i := sort.Search(len(t.addrs), func(i int) bool { return t.addrs[i] > addr }) - 1
	if i < 0 {
		return "", "", 0, false
	}
	return t.names[i], t.modules[i], addr - t.addrs[i], true
}

// Len returns the number of symbols in t.
func (t *Table) Len() int { return len(t.addrs) }

// CopyText copies to w the lines of r, in /proc/kallsyms's format, that
// name code (types t, T, w and W) or end it (the symbols a call chain's
// addresses fall in), and returns how many it copied. It fails when r
// cannot be read, w cannot be written, or r shows no address.
func CopyText(w io.Writer, r io.Reader) (int, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	sc := bufio.NewScanner(r)
	n, hidden := 0, true
	for sc.Scan() {
		line := sc.Text()
		parts := strings.Fields(line)
		if len(parts) < 3 || len(parts[1]) != 1 || !strings.Contains("tTwW", parts[1]) {
			continue
		}
		if strings.Trim(parts[0], "0") != "" {
			hidden = false
		}
		bw.WriteString(line)
		bw.WriteByte('\n')
		n++
	}
	if err := sc.Err(); err != nil {
		return n, fmt.Errorf("kallsyms: %w", err)
	}
	if n > 0 && hidden {
		return 0, ErrHidden
	}
	if err := bw.Flush(); err != nil {
		return n, fmt.Errorf("kallsyms: %w", err)
	}
	return n, nil
}
