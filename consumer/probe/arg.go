package probe

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Base is where a fetch argument's value starts.
type Base uint8

const (
	// Reg is a register of the probed task (%REG).
	Reg Base = iota
	// Stack is the Nth word of its stack ($stackN), or the stack
	// pointer ($stack).
	Stack
	// Retval is the value returned ($retval, return probes only).
	Retval
	// Comm is the task's name ($comm), a string.
	Comm
	// Imm is a constant (\IMM).
	Imm
	// Mem is the word at an address of the process (@ADDR).
	Mem
	// FuncArg is argument N of an fentry or fexit probe's function.
	FuncArg
)

// Fetch is where an argument's value comes from: its base, then each
// dereference in turn (+OFFS(...)), innermost first: the value is
// replaced by the word at value + offset.
type Fetch struct {
	Base Base
	// N is the register's index in the kernel's struct pt_regs (Reg),
	// the stack word, -1 for the stack pointer (Stack), the constant
	// (Imm) or the address (Mem).
	N      int64
	Derefs []Deref
}

// Deref is one dereference: the offset added to the value, and whether
// the memory is the process's (+uOFFS(...) of a kprobe, and every
// access of a uprobe) rather than the kernel's.
type Deref struct {
	Off  int64
	User bool
}

// Type is how a fetched value is stored: an integer of Size bytes,
// signed or not, shown in hex (the x types), or a string.
type Type struct {
	Name   string // as the kernel's format file names it
	Size   int
	Signed bool
	Hex    bool
	String bool
}

// Arg is one fetch argument: the field's name, where its value comes
// from and how it is stored.
type Arg struct {
	Name  string
	Fetch Fetch
	Type  Type
}

// defaultType is what an argument without :TYPE is stored as: a word in
// hex (trace_probe.c: DEFAULT_FETCH_TYPE).
var defaultType = Type{Name: "x64", Size: 8, Hex: true}

// parseArg reads argument number n (from 1), [NAME=]FETCHARG[:TYPE], of
// a probe of kind k.
func parseArg(s string, n int, k Kind) (Arg, error) {
	a := Arg{Name: "arg" + strconv.Itoa(n), Type: defaultType}
	if name, rest, ok := strings.Cut(s, "="); ok {
		if !validName(name) {
			return a, fmt.Errorf("name %q: want a C identifier", name)
		}
		a.Name, s = name, rest
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		t, err := parseType(s[i+1:])
		if err != nil {
			return a, err
		}
		a.Type, s = t, s[:i]
	}
	f, err := parseFetch(s, k)
	if err != nil {
		return a, err
	}
	switch {
	case f.Base == Comm:
		a.Type = Type{Name: "string", String: true}
	case a.Type.String && len(f.Derefs) == 0 && f.Base != Mem:
		// The string is read where the last memory access would be.
		return a, errors.New("a string needs a memory address: +OFFS(FETCHARG) or @ADDR")
	}
	a.Fetch = f
	return a, nil
}

// parseType reads a fetch type: u8 to u64, s8 to s64, x8 to x64,
// string, or ustring (a string in the process's memory).
func parseType(t string) (Type, error) {
	switch t {
	case "string", "ustring":
		return Type{Name: t, String: true}, nil
	case "symbol", "symstr", "char":
		return Type{}, fmt.Errorf("type %q is not supported yet", t)
	}
	if strings.HasPrefix(t, "b") || strings.Contains(t, "[") {
		return Type{}, fmt.Errorf("type %q: bitfields and arrays are not supported yet", t)
	}
	if len(t) >= 2 {
		bits, err := strconv.Atoi(t[1:])
		if err == nil && (bits == 8 || bits == 16 || bits == 32 || bits == 64) {
			switch t[0] {
			case 'u':
				return Type{Name: t, Size: bits / 8}, nil
			case 's':
				return Type{Name: t, Size: bits / 8, Signed: true}, nil
			case 'x':
				return Type{Name: t, Size: bits / 8, Hex: true}, nil
			}
		}
	}
	return Type{}, fmt.Errorf("type %q: want u8, u16, u32, u64, s8 … s64, x8 … x64 or string", t)
}

// parseFetch reads a FETCHARG: %REG, $stackN, $stack, $retval, $comm,
// \IMM, @ADDR, or +|-OFFS(FETCHARG).
func parseFetch(s string, k Kind) (Fetch, error) {
	switch {
	case s == "":
		return Fetch{}, errors.New("no fetch argument")
	case s[0] == '+' || s[0] == '-':
		open := strings.IndexByte(s, '(')
		if open < 0 || s[len(s)-1] != ')' {
			return Fetch{}, fmt.Errorf("%q: want +OFFS(FETCHARG)", s)
		}
		num, user := s[:open], k.User()
		if len(num) > 1 && num[1] == 'u' {
			num, user = num[:1]+num[2:], true
		}
		off, err := strconv.ParseInt(num, 0, 64)
		if err != nil {
			return Fetch{}, fmt.Errorf("offset %q: want a number", s[:open])
		}
		f, err := parseFetch(s[open+1:len(s)-1], k)
		if err != nil {
			return f, err
		}
		if f.Base == Comm {
			return f, errors.New("$comm cannot be dereferenced")
		}
		if len(f.Derefs) >= MaxDerefs {
			return f, fmt.Errorf("more than %d dereferences", MaxDerefs)
		}
		f.Derefs = append(f.Derefs, Deref{Off: off, User: user})
		return f, nil
	case s[0] == '%':
		i, ok := regIndex(s[1:])
		if !ok {
			return Fetch{}, fmt.Errorf("register %q: unknown (%s)", s, strings.Join(regNames(), ", "))
		}
		return Fetch{Base: Reg, N: int64(i)}, nil
	case s == "$stack":
		return Fetch{Base: Stack, N: -1}, nil
	case strings.HasPrefix(s, "$stack"):
		n, err := strconv.ParseUint(s[len("$stack"):], 10, 16)
		if err != nil {
			return Fetch{}, fmt.Errorf("%q: want $stackN", s)
		}
		return Fetch{Base: Stack, N: int64(n)}, nil
	case s == "$retval":
		if !k.Return() {
			return Fetch{}, errors.New("$retval is only for return probes")
		}
		return Fetch{Base: Retval}, nil
	case s == "$comm":
		return Fetch{Base: Comm}, nil
	case strings.HasPrefix(s, "$arg"):
		n, err := strconv.ParseUint(s[len("$arg"):], 10, 8)
		if err != nil || n == 0 {
			return Fetch{}, fmt.Errorf("%q: want $argN, N from 1", s)
		}
		if k.User() {
			return Fetch{}, errors.New("$argN is only for kprobes")
		}
		if int(n) <= len(argRegs) {
			i, _ := regIndex(argRegs[n-1])
			return Fetch{Base: Reg, N: int64(i)}, nil
		}
		// Past the registers, on the stack above the return address
		// (regs_get_kernel_argument).
		return Fetch{Base: Stack, N: int64(int(n) - len(argRegs))}, nil
	case s[0] == '\\':
		n, err := parseInt(s[1:])
		if err != nil {
			return Fetch{}, fmt.Errorf("constant %q: want a number", s)
		}
		return Fetch{Base: Imm, N: n}, nil
	case s[0] == '@':
		if strings.HasPrefix(s, "@+") {
			return Fetch{}, errors.New("@+OFFSET (an offset in the file) is not supported: give the address")
		}
		n, err := strconv.ParseUint(s[1:], 0, 64)
		if err != nil {
			return Fetch{}, fmt.Errorf("address %q: want @ADDR, a number (@SYMBOL is not supported yet)", s)
		}
		return Fetch{Base: Mem, N: int64(n)}, nil
	}
	return Fetch{}, fmt.Errorf("%q: want %%REG, $argN, $stackN, $stack, $retval, $comm, \\IMM, @ADDR or +|-[u]OFFS(FETCHARG)", s)
}

// MaxDerefs is the most dereferences of one argument the recorder
// walks (the kernel's is FETCH_INSN_MAX's room, about 16).
const MaxDerefs = 4

// parseInt reads a signed or unsigned number in Go's bases.
func parseInt(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 0, 64); err == nil {
		return n, nil
	}
	u, err := strconv.ParseUint(s, 0, 64)
	return int64(u), err
}
