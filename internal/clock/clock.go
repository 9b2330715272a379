// Package clock reads the kernel clocks the recorder stamps records with.
package clock

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Now reads clock id, in nanoseconds; ok is false when the kernel
// refuses the clock. It is a raw system call, as clock_gettime never
// blocks: x/sys/unix's ClockGettime is an ordinary one, which wakes the
// runtime's sysmon when it sleeps, and sysmon then polls every 20 µs for
// a while, each poll a switch of the recorder's own in the trace. A
// drain that writes no packet then wakes no thread of the runtime's.
func Now(id int32) (now uint64, ok bool) {
	var ts unix.Timespec
	_, _, errno := unix.RawSyscall(unix.SYS_CLOCK_GETTIME, uintptr(id), uintptr(unsafe.Pointer(&ts)), 0)
	return uint64(ts.Nano()), errno == 0
}
