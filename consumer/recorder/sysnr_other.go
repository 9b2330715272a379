//go:build !amd64

package recorder

// sysNrs is empty: the raw syscall path is for x86_64 only.
var sysNrs = map[string]int32{}
