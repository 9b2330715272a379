package probe

import (
	"errors"
	"runtime"
	"strings"
)

var errNoRegs = errors.New("probes: no register table for " + runtime.GOARCH + " yet")

// regIndex returns the index of register name in the kernel's struct
// pt_regs of this architecture, and whether it is one.
func regIndex(name string) (int, bool) {
	for i, r := range regs {
		if r == name {
			return i, true
		}
	}
	return 0, false
}

// regNames returns the register names fetch arguments take here.
func regNames() []string { return regs }

// RegWords is the number of words of this architecture's struct
// pt_regs.
func RegWords() int { return len(regs) }

// RetvalReg, IPReg and SPReg are the indexes of the registers that hold
// a return value, the instruction pointer and the stack pointer.
const (
	RetvalReg = regRetval
	IPReg     = regIP
	SPReg     = regSP
)

// Supported returns nil where probes are recorded on this architecture,
// else why not.
func Supported() error {
	if len(regs) == 0 {
		return errNoRegs
	}
	return nil
}

// subReg returns the index of the register whose part name is (eax,
// r8d, dil, rax, ax …), and whether it is one.
func subReg(name string) (int, bool) {
	if r, ok := subRegs[name]; ok {
		name = r
	} else if strings.HasPrefix(name, "r") && len(name) > 2 {
		// r8 to r15 and their d, w and b parts.
		name = strings.TrimRight(name, "dwb")
	}
	return regIndex(name)
}
