//go:build !amd64

package consumer

// sysNrs is empty: the raw syscall path is for x86_64 only.
var sysNrs = map[string]int32{}
