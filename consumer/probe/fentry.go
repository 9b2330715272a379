package probe

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// KernelBTF returns the running kernel's BTF; a variable so that tests
// may give another.
var KernelBTF = btf.LoadKernelSpec

// parseFentry reads the arguments of an fentry or fexit probe of
// function p.Symbol: each NAME[:TYPE] (a parameter of the function by
// its BTF name), $argN[:TYPE], $arg* (every parameter), $retval[:TYPE]
// (fexit) or $comm; none means $arg*, and for fexit $retval too. A
// parameter's type comes from BTF: integers, enums and booleans at their
// size and sign, pointers as x64; TYPE string or ustring reads the
// string a pointer points to, in the kernel's or the process's memory.
func parseFentry(p *Probe, point string, words []string) (*Probe, error) {
	spec, err := KernelBTF()
	if err != nil {
		return nil, fmt.Errorf("%w %q: the kernel's BTF: %w", ErrSyntax, point, err)
	}
	var fn *btf.Func
	if err := spec.TypeByName(p.Symbol, &fn); err != nil {
		return nil, fmt.Errorf("%w %q: no function %s in the kernel's BTF", ErrSyntax, point, p.Symbol)
	}
	proto, ok := fn.Type.(*btf.FuncProto)
	if !ok {
		return nil, fmt.Errorf("%w %q: %s has no prototype in BTF", ErrSyntax, point, p.Symbol)
	}
	if len(words) == 0 {
		words = []string{"$arg*"}
		if p.Kind == Fexit {
			words = append(words, "$retval")
		}
	}
	p.Name = p.Symbol
	if p.Kind == Fexit {
		p.Name += "__return"
	}
	seen := map[string]bool{}
	add := func(a Arg) error {
		if seen[a.Name] || reserved(a.Name) {
			return fmt.Errorf("argument name %q is taken", a.Name)
		}
		seen[a.Name] = true
		p.Args = append(p.Args, a)
		return nil
	}
	for _, w := range words {
		name, typ, _ := strings.Cut(w, ":")
		if name == "$arg*" {
			if typ != "" {
				return nil, fmt.Errorf("%w %q: $arg* takes no type", ErrSyntax, point)
			}
			for i := range proto.Params {
				a, err := paramArg(proto, i, "")
				if err == nil {
					err = add(a)
				}
				if err != nil {
					return nil, fmt.Errorf("%w %q: %w", ErrSyntax, point, err)
				}
			}
			continue
		}
		a, err := fentryArg(p, proto, name, typ)
		if err == nil {
			err = add(a)
		}
		if err != nil {
			return nil, fmt.Errorf("%w %q: argument %q: %w", ErrSyntax, point, w, err)
		}
	}
	if len(p.Args) > MaxArgs {
		return nil, fmt.Errorf("%w %q: %d arguments, at most %d", ErrSyntax, point, len(p.Args), MaxArgs)
	}
	return p, nil
}

// fentryArg returns the argument name (a parameter, $argN, $retval or
// $comm) of function proto stored as typ ("" for its BTF type).
func fentryArg(p *Probe, proto *btf.FuncProto, name, typ string) (Arg, error) {
	switch {
	case name == "$comm":
		return Arg{Name: "comm", Fetch: Fetch{Base: Comm}, Type: Type{Name: "string", String: true}}, nil
	case name == "$retval":
		if p.Kind != Fexit {
			return Arg{}, errors.New("$retval is only for fexit")
		}
		if _, void := proto.Return.(*btf.Void); proto.Return == nil || void {
			return Arg{}, fmt.Errorf("$retval: %s returns nothing (void)", p.Symbol)
		}
		t, err := btfType(proto.Return, typ)
		return Arg{Name: "retval", Fetch: Fetch{Base: Retval}, Type: t}, err
	case strings.HasPrefix(name, "$arg"):
		n, err := strconv.Atoi(name[len("$arg"):])
		if err != nil || n < 1 || n > len(proto.Params) {
			return Arg{}, fmt.Errorf("want $arg1 to $arg%d", len(proto.Params))
		}
		return paramArg(proto, n-1, typ)
	}
	for i, prm := range proto.Params {
		if prm.Name == name {
			return paramArg(proto, i, typ)
		}
	}
	var names []string
	for _, prm := range proto.Params {
		names = append(names, prm.Name)
	}
	return Arg{}, fmt.Errorf("no parameter %s (the function has %s)", name, strings.Join(names, ", "))
}

// paramArg returns parameter i of proto, stored as typ ("" for its BTF
// type), named as BTF names it (argN without a name).
func paramArg(proto *btf.FuncProto, i int, typ string) (Arg, error) {
	prm := proto.Params[i]
	name := prm.Name
	if name == "" {
		name = "arg" + strconv.Itoa(i+1)
	}
	t, err := btfType(prm.Type, typ)
	if err != nil {
		return Arg{}, fmt.Errorf("%s: %w", name, err)
	}
	return Arg{Name: name, Fetch: Fetch{Base: FuncArg, N: int64(i)}, Type: t}, nil
}

// btfType returns how a value of BTF type bt is stored: as typ when
// given (a fetch type; string and ustring need a pointer), else from bt.
func btfType(bt btf.Type, typ string) (Type, error) {
	u := btf.UnderlyingType(bt)
	if typ != "" {
		t, err := parseType(typ)
		if err != nil {
			return t, err
		}
		if _, ptr := u.(*btf.Pointer); t.String && !ptr {
			return t, fmt.Errorf("%s needs a pointer, not %s", typ, bt.TypeName())
		}
		return t, nil
	}
	switch v := u.(type) {
	case *btf.Int:
		return intType(int(v.Size), v.Encoding == btf.Signed)
	case *btf.Enum:
		return intType(int(v.Size), v.Signed)
	case *btf.Pointer:
		return defaultType, nil
	}
	return Type{}, fmt.Errorf("a %T is not recorded yet: name a pointer or an integer", u)
}

// intType returns the fetch type of an integer of size bytes.
func intType(size int, signed bool) (Type, error) {
	if size != 1 && size != 2 && size != 4 && size != 8 {
		return Type{}, fmt.Errorf("an integer of %d bytes", size)
	}
	t := Type{Name: "u" + strconv.Itoa(8*size), Size: size, Signed: signed}
	if signed {
		t.Name = "s" + strconv.Itoa(8*size)
	}
	return t, nil
}

// btfParamArg returns the argument w, NAME[:TYPE], of a kprobe at the
// start of kernel function fn: parameter NAME, typed from fn's BTF,
// fetched from the register or stack slot the calling convention puts
// it in (regs_get_kernel_argument). It fails when BTF does not know fn
// or its parameter, or the parameter is past the registers.
func btfParamArg(fn, w string) (Arg, error) {
	spec, err := KernelBTF()
	if err != nil {
		return Arg{}, fmt.Errorf("the kernel's BTF: %w", err)
	}
	var f *btf.Func
	if err := spec.TypeByName(fn, &f); err != nil {
		return Arg{}, fmt.Errorf("%s is not in the kernel's BTF: name its register", fn)
	}
	proto, ok := f.Type.(*btf.FuncProto)
	if !ok {
		return Arg{}, fmt.Errorf("%s has no prototype in BTF", fn)
	}
	name, typ, _ := strings.Cut(w, ":")
	a, err := fentryArg(&Probe{Kind: Fentry}, proto, name, typ)
	if err != nil {
		return a, err
	}
	if int(a.Fetch.N) >= len(argRegs) {
		return a, fmt.Errorf("%s is past the argument registers", name)
	}
	r, _ := regIndex(argRegs[a.Fetch.N])
	a.Fetch.Base, a.Fetch.N = Reg, int64(r)
	return a, nil
}
