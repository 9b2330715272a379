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
	kernel *kallsyms.Table // nil: addresses
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
	if errors.Is(err, consumer.ErrNoSymbols) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w (--raw-addresses prints the call chains without it)", err)
	}
	s.kernel = t
	return nil
}

// appendValue appends v to line as report prints it, and reports false
// when v is not a call chain it names.
func (s *stackNames) appendValue(line []byte, v relayfmt.Value) ([]byte, bool) {
	if s.kernel == nil || v.Field.Name != layout.KernelStackField || v.Field.Kind != relayfmt.Sequence {
		return line, false
	}
	line = append(line, '[')
	for i := range v.Len() {
		if i > 0 {
			line = append(line, ", "...)
		}
		line = appendKernelFrame(line, s.kernel, v.Uint(i))
	}
	return append(line, ']'), true
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
