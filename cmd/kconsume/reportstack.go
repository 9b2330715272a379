package main

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/internal/kallsyms"
	"github.com/kconsume/kconsume/relayfmt"
)

// stackNames prints call chains by name: the kernel's with the symbols
// the trace saved when it was recorded (consumer.KernelSymbols).
type stackNames struct {
	raw    bool // --raw-addresses: no names
	loaded bool
	kernel *kallsyms.Table           // nil: addresses
	user   *consumer.UserSymbolTable // nil: addresses
}

// load reads the symbols of the trace in dir, once. A trace without
// them keeps its addresses; it fails only for a symbol file that is
// there and unreadable.
func (s *stackNames) load(dir string) error {
	if s.loaded || s.raw {
		return nil
	}
	s.loaded = true
	t, err := consumer.ReadKernelSymbols(dir)
	if err != nil && !errors.Is(err, consumer.ErrNoSymbols) {
		return fmt.Errorf("%w (--raw-addresses prints the call chains without it)", err)
	}
	s.kernel = t
	u, err := consumer.ReadUserSymbols(dir)
	if err != nil && !errors.Is(err, consumer.ErrNoSymbols) {
		return fmt.Errorf("%w (--raw-addresses prints the call chains without it)", err)
	}
	s.user = u
	return nil
}

// appendValue appends v, a field of the event of fields vals at time t,
// to line as report prints it, and reports false when v is not a call
// chain it names.
func (s *stackNames) appendValue(line []byte, v relayfmt.Value, vals []relayfmt.Value, t uint64) ([]byte, bool) {
	if v.Field.Kind != relayfmt.Sequence {
		return line, false
	}
	switch {
	case v.Field.Name == layout.KernelStackField && s.kernel != nil:
		line = append(line, '[')
		for i := range v.Len() {
			if i > 0 {
				line = append(line, ", "...)
			}
			line = appendKernelFrame(line, s.kernel, v.Uint(i))
		}
		return append(line, ']'), true
	case v.Field.Name == layout.UserStackField && s.user != nil:
		tid, ok := eventTid(vals)
		if !ok {
			return line, false
		}
		line = append(line, '[')
		for i := range v.Len() {
			if i > 0 {
				line = append(line, ", "...)
			}
			line = appendUserFrame(line, s.user, tid, t, v.Uint(i))
		}
		return append(line, ']'), true
	}
	return line, false
}

// eventTid returns the thread of an event: its common_pid, or its tid
// context.
func eventTid(vals []relayfmt.Value) (int32, bool) {
	for _, name := range []string{"common_pid", "tid"} {
		for _, v := range vals {
			if v.Field.Name == name && v.Field.Kind == relayfmt.Scalar {
				return int32(v.Int(0)), true
			}
		}
	}
	return 0, false
}

// appendUserFrame appends addr, of thread tid at time t, as
// func+0xoff (/path), 0xaddr (/path+0xfileoff) where the function is
// unknown, or 0xaddr outside every mapping.
func appendUserFrame(b []byte, u *consumer.UserSymbolTable, tid int32, t, addr uint64) []byte {
	fn, off, path, ok := u.Resolve(tid, t, addr)
	switch {
	case !ok:
		return strconv.AppendUint(append(b, "0x"...), addr, 16)
	case fn == "":
		b = strconv.AppendUint(append(b, "0x"...), addr, 16)
		b = append(append(b, " ("...), path...)
		return append(strconv.AppendUint(append(b, "+0x"...), off, 16), ')')
	}
	b = strconv.AppendUint(append(append(b, fn...), "+0x"...), off, 16)
	return append(append(append(b, " ("...), path...), ')')
}

// appendKernelFrame appends addr as func+0xoff, with " [module]" for a
// module's function, or as 0xaddr outside every symbol.
func appendKernelFrame(b []byte, t *kallsyms.Table, addr uint64) []byte {
	name, mod, off, ok := t.Symbol(addr)
	if !ok {
		return strconv.AppendUint(append(b, "0x"...), addr, 16)
	}
	b = strconv.AppendUint(append(append(b, name...), "+0x"...), off, 16)
	if mod != "" {
		b = append(append(append(b, " ["...), mod...), ']')
	}
	return b
}
