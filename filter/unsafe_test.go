package filter

import "unsafe"

// unsafePtr returns the address of b's first byte for a syscall.
func unsafePtr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
