package consumer

//go:generate go run ./internal/mksysnum

import (
	"fmt"
	"strings"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// syscallAliases maps the names syscall trace events use to the names of
// the syscall table where they differ (SYSCALL_DEFINE names vs __NR_ names).
var syscallAliases = map[string]string{
	"newfstat":   "fstat",
	"newlstat":   "lstat",
	"newstat":    "stat",
	"newuname":   "uname",
	"sendfile64": "sendfile",
	"umount":     "umount2",
}

// Keys of syscall events in kc_tp_info_map (KC_KEY_SYSCALL, KC_KEY_EXIT in
// bpf/kconsume.bpf.c).
const (
	keySyscall = 1 << 31
	keyExit    = 1 << 30
)

// syscallEvent reports whether f is a syscall entry or exit event, and
// its kc_tp_info_map key. It fails for a syscall event whose number this
// build does not know.
func syscallEvent(f *tracefs.Format) (key uint32, exit, ok bool, err error) {
	if f.System != "syscalls" {
		return 0, false, false, nil
	}
	var name string
	switch {
	case strings.HasPrefix(f.Name, "sys_enter_"):
		name = strings.TrimPrefix(f.Name, "sys_enter_")
	case strings.HasPrefix(f.Name, "sys_exit_"):
		name, exit = strings.TrimPrefix(f.Name, "sys_exit_"), true
	default:
		return 0, false, false, nil
	}
	if a, ok := syscallAliases[name]; ok {
		name = a
	}
	nr, found := syscallNumbers[name]
	if !found {
		return 0, false, true, fmt.Errorf("event %s: syscall number of %q unknown to this build", f.FullName(), name)
	}
	key = keySyscall | nr
	if exit {
		key |= keyExit
	}
	return key, exit, true, nil
}
