package main

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/internal/kallsyms"
	"github.com/kconsume/kconsume/internal/testenv"
)

// TestRecordBPFStack builds bpf/example/stack.bpf.c, whose event has the
// kernel's stack field type filled by bpf_get_stack in a raw tracepoint
// at getpid, records it, and
// holds babeltrace2's reading: bool and char as the kernel prints them
// (numbers), the stack a sequence of kernel addresses that
// /proc/kallsyms places on the syscall path.
func TestRecordBPFStack(t *testing.T) {
	testenv.RequireRoot(t)
	bt2 := testenv.BT2(t)
	old := controlRoot
	controlRoot = t.TempDir()
	t.Cleanup(func() { controlRoot = old })
	out, end := recordExample(t, "stack", "stack")
	for i := 0; i < 50; i++ {
		unix.Getpid()
	}
	if c, o := end(); c != 0 {
		t.Fatalf("record exit %d\n%s", c, o)
	}
	b, err := exec.Command(bt2, out).CombinedOutput()
	if err != nil {
		t.Fatalf("babeltrace2: %v\n%s", err, b)
	}
	line := regexp.MustCompile(`synthetic:getpid_stack: .*\{ pid = -?\d+, traced = 0, c = 75, _stack_length = (\d+), stack = \[ (.*) \] \}`)
	elem := regexp.MustCompile(`\[\d+\] = (\d+)`)
	syms, err := kallsyms.Read()
	if err != nil {
		t.Fatal(err)
	}
	var events, onPath int
	for _, l := range strings.Split(string(b), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		events++
		addrs := elem.FindAllStringSubmatch(m[2], -1)
		if n, _ := strconv.Atoi(m[1]); n != len(addrs) || n == 0 {
			t.Fatalf("stack of %s addresses shows %d: %s", m[1], len(addrs), l)
		}
		var names []string
		for _, a := range addrs {
			u, _ := strconv.ParseUint(a[1], 10, 64)
			if u < 0xffff800000000000 {
				t.Fatalf("%#x is not a kernel address: %s", u, l)
			}
			n, _, ok := syms.Name(u)
			if !ok {
				n = "?"
			}
			names = append(names, n)
		}
		if strings.Contains(strings.Join(names, " "), "do_syscall_64") {
			if onPath++; onPath == 1 {
				t.Logf("a stack: %s", strings.Join(names, " <- "))
			}
		}
	}
	if events < 50 || onPath < events {
		t.Fatalf("%d getpid_stack events of ours, %d with do_syscall_64 on the stack; babeltrace2 said:\n%.3000s", events, onPath, b)
	}
}
