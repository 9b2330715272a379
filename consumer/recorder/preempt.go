package recorder

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// kernelRelease returns the running kernel's major and minor version. It
// fails when uname fails or its release does not start with them.
func kernelRelease() (major, minor int, err error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return 0, 0, fmt.Errorf("uname: %w", err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	if _, err := fmt.Sscanf(rel, "%d.%d", &major, &minor); err != nil {
		return 0, 0, fmt.Errorf("kernel release %q: %w", rel, err)
	}
	return major, minor, nil
}

// Preemptible tells whether this kernel runs raw tracepoint, tp_btf and
// trampoline (fentry, fexit) programs with preemption on, and why. There
// a task preempted inside such a program holds the program's per-CPU
// recursion guard, and the kernel skips every other run of the program
// on that CPU until the task runs again, losing the events of the tasks
// that share the CPU: a quarter of them with two busy tasks a CPU. The
// recorder then takes the attach points that keep preemption off (the
// perf tracepoints, include/trace/perf.h) wherever it can.
//
// That is Linux 6.14 and later with preemptible RCU (CONFIG_PREEMPT_RCU,
// which every preemption model of a PREEMPT_DYNAMIC kernel has) and
// tracepoints read under SRCU-fast rather than with preemption off
// (include/linux/tracepoint.h: the tracepoint_srcu of 7.x; 6.14 to 6.18
// had none, and before 6.14 it served only the rcuidle tracepoints).
// __bpf_trace_run and the trampolines' __bpf_prog_enter_recur then keep
// only migration off (kernel/trace/bpf_trace.c, kernel/bpf/trampoline.c).
type Preemptible struct {
	On  bool
	Why string
}

var Preemptibility = sync.OnceValue(func() Preemptible {
	p, err := probePreemptible("/proc/kallsyms")
	if err != nil {
		return Preemptible{Why: err.Error()}
	}
	return p
})

// probePreemptible reads the kernel's release and its symbols (the
// kallsyms file) and returns whether BPF tracing programs run
// preemptibly. It fails when neither can be read.
func probePreemptible(kallsyms string) (Preemptible, error) {
	major, minor, err := kernelRelease()
	if err != nil {
		return Preemptible{}, err
	}
	if major < 6 || major == 6 && minor < 14 {
		return Preemptible{Why: fmt.Sprintf("Linux %d.%d: tracepoints keep preemption off", major, minor)}, nil
	}
	f, err := os.Open(kallsyms)
	if err != nil {
		return Preemptible{}, fmt.Errorf("kernel symbols: %w", err)
	}
	defer f.Close()
	var srcu, prcu bool
	sc := bufio.NewScanner(f)
	for sc.Scan() && !(srcu && prcu) {
		// "ffffffff814006f0 T __rcu_read_lock": the name is the third field.
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		switch name := line[i+1:]; name {
		case "tracepoint_srcu":
			srcu = true
		case "__rcu_read_lock":
			prcu = true
		}
	}
	if err := sc.Err(); err != nil {
		return Preemptible{}, fmt.Errorf("kernel symbols: %w", err)
	}
	switch {
	case !srcu:
		return Preemptible{Why: fmt.Sprintf("Linux %d.%d calls tracepoints with preemption off", major, minor)}, nil
	case !prcu:
		return Preemptible{Why: "no preemptible RCU: BPF programs run with preemption off"}, nil
	}
	return Preemptible{On: true, Why: fmt.Sprintf("Linux %d.%d calls tracepoint and trampoline programs preemptibly (SRCU-fast tracepoints, preemptible RCU)", major, minor)}, nil
}

// errPreemptible is why a path that loses events where programs run
// preemptibly is not taken by default.
var errPreemptible = errors.New("its programs run preemptibly on this kernel, where a task preempted inside one makes the kernel skip the other tasks' events on its CPU")
