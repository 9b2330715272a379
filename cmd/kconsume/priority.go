package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// defaultNice is record's nice value unless --nice says otherwise. Under
// a load that keeps every CPU busy with many tasks (hackbench: 160), a
// consumer at nice 0 gets its fair share, a 160th of the machine, and
// runs hundreds of milliseconds after the producers woke it: the rings
// fill and drop what does not fit. -20 weighs its threads 87× a task at
// 0 (sched_prio_to_weight in kernel/sched/core.c), so it runs soon after
// its wakeup and drains before the rings fill; -10 (9×) still lost a
// tenth of hackbench's events on the shared 2-CPU VM where -20 lost 2 %
// (BENCHMARKS.md). It takes no more CPU for it: what it drains is what
// the producers wrote, and it sleeps whenever nothing waits, so an idle
// machine sees no more of it.
const defaultNice = -20

// currentNice returns the calling thread's nice value.
func currentNice() (int, error) {
	// The system call returns 20 - nice, 1..40 (sys_getpriority in
	// kernel/sys.c), which libc's getpriority turns back.
	v, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		return 0, fmt.Errorf("getpriority: %w", err)
	}
	return 20 - v, nil
}

// setNice sets the nice value of every thread of the process: Linux
// keeps it per thread, and a thread the Go runtime starts later takes
// its creator's. It fails with the kernel's error (EACCES without
// CAP_SYS_NICE for a value below the current one).
func setNice(nice int) error {
	// A thread being created while the list is read may be missed by
	// one pass; it is created by a thread already set, or found by the
	// next pass.
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("setting nice %d: %w", nice, err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			err = unix.Setpriority(unix.PRIO_PROCESS, tid, nice)
			switch {
			case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
				return fmt.Errorf("setting nice %d: %w (a value below the current one needs CAP_SYS_NICE)", nice, err)
			case err != nil && !errors.Is(err, unix.ESRCH): // ESRCH: the thread ended
				return fmt.Errorf("setting nice %d: %w", nice, err)
			}
		}
	}
	return nil
}

// raisePriority sets the process's threads to nice, unless they already
// run at that or lower and explicit is false (the default value never
// makes kconsume nicer than it was started). It returns the nice value
// the process had, for the commands it starts (startAtNice). It fails
// when nice cannot be set.
func raisePriority(nice int, explicit bool) (prev int, err error) {
	if prev, err = currentNice(); err != nil {
		return 0, err
	}
	if nice == prev || !explicit && prev < nice {
		return prev, nil
	}
	return prev, setNice(nice)
}

// startAtNice starts cmd with the nice value nice, from a thread of its
// own: a child takes the nice value of the thread that forks it, and the
// recorder's value is for the recorder, not for the workload it watches.
func startAtNice(cmd *exec.Cmd, nice int) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, and its
		// nice value with it.
		runtime.LockOSThread()
		own, err := currentNice()
		if err != nil {
			errc <- err
			return
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, 0, nice); err != nil {
			errc <- fmt.Errorf("nice %d for the command: %w", nice, err)
			return
		}
		err = cmd.Start()
		// Back to the recorder's value before answering: the thread may
		// outlive this call a while, and is the recorder's until it ends.
		_ = unix.Setpriority(unix.PRIO_PROCESS, 0, own)
		errc <- err
	}()
	return <-errc
}
