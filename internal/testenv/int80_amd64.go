package testenv

// Int80 makes the 32-bit syscall nr (arch/x86/entry/syscalls/syscall_32.tbl)
// with no arguments through int $0x80 and returns what it returns: a
// negative errno on failure, -ENOSYS where the kernel runs no 32-bit
// syscalls (ia32_emulation=0). Syscall events ignore such calls.
func Int80(nr uint32) int32
