//go:build !amd64

package testenv

import "syscall"

// Int80 returns -ENOSYS: only x86_64 has int $0x80 syscalls.
func Int80(nr uint32) int32 { return -int32(syscall.ENOSYS) }
