//go:build !amd64

package probe

// No register table yet: every %REG is refused.
var regs, argRegs []string

var subRegs map[string]string

const (
	regRetval = 0
	regIP     = 0
	regSP     = 0
)
