package tracefs

import "strings"

// userLenArg holds the syscalls whose user-space data the kernel copies
// into their sys_enter records as bytes, as many as an argument says,
// rather than as a string up to its NUL: the argument that says how many
// (kernel/trace/trace_syscalls.c, check_faultable_syscall's
// user_arg_size). write's buf is such data; sethostname's name too,
// though its print fmt shows it as a string.
var userLenArg = map[string]int{
	"write": 2, "pwrite64": 2, "mq_timedsend": 2,
	"sethostname": 1, "setdomainname": 1, "kexec_file_load": 3,
}

// Syscall returns the syscall a syscall event is about: "getpid" for
// syscalls:sys_enter_getpid and sys_exit_getpid.
func (f *Format) Syscall() string {
	if n, ok := strings.CutPrefix(f.Name, "sys_enter_"); ok {
		return n
	}
	return strings.TrimPrefix(f.Name, "sys_exit_")
}

// UserLenArg returns the argument that bounds the user-space bytes the
// kernel copies into the sys_enter record of syscall (Linux 6.19+), and
// false for a syscall whose user-space data are strings.
func UserLenArg(syscall string) (int, bool) {
	i, ok := userLenArg[syscall]
	return i, ok
}

// UserBytes reports whether fl is a user-space field of the syscall
// event f that holds bytes (write's __buf_val), which a trace keeps as a
// sequence of bytes: they may hold NULs, where a string would end.
// Fields copied as bytes but shown as text (sethostname's) are strings,
// as the kernel prints them.
func (f *Format) UserBytes(fl Field) bool {
	if f.System != "syscalls" || fl.Loc != DataLoc {
		return false
	}
	_, ok := userLenArg[f.Syscall()]
	return ok && strings.Contains(f.Print, "__print_dynamic_array("+fl.Name+",")
}
