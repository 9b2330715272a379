package main

import (
	"fmt"
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	var in strings.Builder
	for nr := 0; nr < 310; nr++ {
		name := fmt.Sprintf("sys_call%d", nr)
		switch nr {
		case 4:
			name = "sys_newstat"
		case 7:
			name = "sys_ni_syscall"
		}
		macro := "__SYSCALL"
		if nr == 60 {
			macro = "__SYSCALL_NORETURN" // Linux 6.11 on: exit, exit_group
		}
		fmt.Fprintf(&in, "%s(%d, %s)\n", macro, nr, name)
	}
	out, err := table("test", strings.NewReader(in.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"newstat": 4,`, `"call309": 309,`, `"call60":  60,`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %s in\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "ni_syscall") || strings.Contains(string(out), ": 7,") {
		t.Errorf("sys_ni_syscall (an unused number) in the table")
	}
	if _, err := table("test", strings.NewReader("__SYSCALL(0, sys_read)\n")); err == nil {
		t.Error("a one-line table: no error")
	}
}
