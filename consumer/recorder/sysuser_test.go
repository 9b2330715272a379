package recorder

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/relayfmt"
)

// sysFormat reads a syscall event's format file of Linux 7.3 from
// testdata.
func sysFormat(t *testing.T, name string) *tracefs.Format {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "syscalls-7.3", name))
	if err != nil {
		t.Fatal(err)
	}
	f, err := tracefs.ParseFormat("syscalls", data)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestSysUserOf: the user-space fields of Linux 7.3's syscall events,
// which formats lack them, and the layouts the recorder refuses.
func TestSysUserOf(t *testing.T) {
	cases := []struct {
		name   string
		loc    int
		args   []int
		lenArg int
		bytes  bool // the field is kept as bytes
	}{
		{"sys_enter_write", 40, []int{1}, 2, true},
		{"sys_enter_mq_timedsend", 56, []int{1}, 2, true},
		{"sys_enter_openat", 48, []int{1}, -1, false},
		{"sys_enter_rename", 32, []int{0, 1}, -1, false},
		{"sys_enter_symlinkat", 40, []int{0, 2}, -1, false},
		{"sys_enter_mount", 56, []int{0, 1, 2}, -1, false},
		// Copied as bytes, shown as text.
		{"sys_enter_sethostname", 32, []int{0}, 1, false},
		// The kernel copies flags, as long as cmdline_ptr says
		// (check_faultable_syscall): mirrored as it is.
		{"sys_enter_kexec_file_load", 56, []int{4}, 3, false},
		{"sys_enter_getpid", 0, nil, 0, false},
		{"sys_enter_read", 0, nil, 0, false},
		{"sys_exit_write", 0, nil, 0, false},
	}
	for _, c := range cases {
		f := sysFormat(t, c.name)
		u, err := SysUserOf(f)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if c.args == nil {
			if u != nil {
				t.Errorf("%s: user-space fields %+v, want none", c.name, u)
			}
			continue
		}
		if u == nil || u.loc != c.loc || !slices.Equal(u.args, c.args) || u.lenArg != c.lenArg {
			t.Errorf("%s: %+v, want loc %d, args %v, length argument %d", c.name, u, c.loc, c.args, c.lenArg)
			continue
		}
		l, err := layout.New(f, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		val := l.Fields[len(l.Fields)-1]
		if got := val.Kind == relayfmt.Sequence; got != c.bytes {
			t.Errorf("%s: field %s of kind %v, want bytes %v", c.name, val.Name, val.Kind, c.bytes)
		}
	}

	bad := map[string]func(f *tracefs.Format){
		"holds bytes whose length argument": func(f *tracefs.Format) { f.Name = "sys_enter_kcwrite" },
		"names no argument":                 func(f *tracefs.Format) { f.Fields[len(f.Fields)-1].Name = "__kc_val" },
		"is not a user-space field":         func(f *tracefs.Format) { f.Fields[len(f.Fields)-1].Offset += 4 },
		"more than the kernel's 3": func(f *tracefs.Format) {
			f.Fields = append(f.Fields, tracefs.Field{Name: "__flags_val", Type: "char[]", Loc: tracefs.DataLoc, Offset: 60, Size: 4})
		},
		"not one field bounded by argument": func(f *tracefs.Format) { f.Name = "sys_enter_write" },
	}
	for want, change := range bad {
		name := "sys_enter_write"
		if strings.HasPrefix(want, "more") || strings.HasPrefix(want, "not one") {
			name = "sys_enter_mount"
		}
		f := sysFormat(t, name)
		f.Fields = slices.Clone(f.Fields)
		change(f)
		if _, err := SysUserOf(f); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s changed to fail with %q: %v", name, want, err)
		}
	}
}
