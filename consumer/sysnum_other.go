//go:build linux && !amd64 && !arm64

package consumer

// syscallNumbers is empty where this build has no table: syscall events
// are refused with a clear error, other tracepoints work.
var syscallNumbers = map[string]uint32{}
