package probe

// x86-64's registers as fetch arguments name them, in the order of the
// kernel's struct pt_regs (arch/x86/include/asm/ptrace.h), whose words
// a probe's program reads them from.
var regs = []string{"r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8",
	"ax", "cx", "dx", "si", "di", "orig_ax", "ip", "cs", "flags", "sp", "ss"}

// Indexes in regs of the registers the programs read themselves.
const (
	regRetval = 10 // ax
	regIP     = 16 // ip
	regSP     = 19 // sp
)

// The registers of a kernel function's first arguments, in order
// (regs_get_kernel_argument).
var argRegs = []string{"di", "si", "dx", "cx", "r8", "r9"}

// subRegs names each register's narrower parts, as the assembler spells
// the operands of USDT notes.
var subRegs = map[string]string{
	"rax": "ax", "eax": "ax", "al": "ax", "rbx": "bx", "ebx": "bx", "bl": "bx",
	"rcx": "cx", "ecx": "cx", "cl": "cx", "rdx": "dx", "edx": "dx", "dl": "dx",
	"rsi": "si", "esi": "si", "sil": "si", "rdi": "di", "edi": "di", "dil": "di",
	"rbp": "bp", "ebp": "bp", "bpl": "bp", "rsp": "sp", "esp": "sp", "spl": "sp",
	"rip": "ip", "eip": "ip",
}
