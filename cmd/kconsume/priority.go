package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"

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
	return (&niceness{threads: nice}).apply()
}

// niceness is what record asks of the scheduler: every thread of the
// process at threads, except the Go runtime's system monitor (sysmon, the
// thread monitor names; 0 when not found) at monitorNice.
//
// sysmon runs no goroutine: it wakes at the first system call of a drain
// pass that finds it asleep (entersyscall in runtime/proc.go) and polls
// every 20 µs until every P idles again. At -20 each of those polls
// preempted the workload; at the command's value it runs when the
// workload's tasks let it, by which time the pass is over, and the drainer
// it does not run loses nothing by it.
type niceness struct {
	threads, monitorNice int
	monitor              int
	set                  map[int]bool // threads given their value by apply
}

// apply gives every thread of the process not yet set its nice value. A
// thread takes its creator's value, so one the monitor starts (an M for a
// P it took back from a system call, startm in runtime/proc.go) comes at
// the monitor's; record calls apply again when the recording starts and
// at each refresh (at most once a second, while data arrives). On a nil
// niceness (raisePriority changed nothing) it does nothing. It fails with
// the kernel's error (EACCES without CAP_SYS_NICE for a value below the
// current one).
func (p *niceness) apply() error {
	if p == nil {
		return nil
	}
	if p.set == nil {
		p.set = map[int]bool{}
	}
	for range 2 {
		tids, err := threads()
		if err != nil {
			return fmt.Errorf("setting nice %d: %w", p.threads, err)
		}
		// A thread being created while the list is read may be missed
		// by one pass; it is created by a thread already set, or found
		// by the next pass.
		for _, tid := range tids {
			if p.set[tid] {
				continue
			}
			nice := p.threads
			if tid == p.monitor {
				nice = p.monitorNice
			}
			if err := setThreadNice(tid, nice); err != nil {
				return err
			}
			p.set[tid] = true
		}
	}
	return nil
}

// threads returns the thread IDs of the process.
func threads() ([]int, error) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(tasks))
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// setThreadNice sets thread tid's nice value; a thread that ended is not
// an error. It fails with the kernel's error (EACCES without CAP_SYS_NICE
// for a value below the current one).
func setThreadNice(tid, nice int) error {
	err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice)
	switch {
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		return fmt.Errorf("setting nice %d: %w (a value below the current one needs CAP_SYS_NICE)", nice, err)
	case err != nil && !errors.Is(err, unix.ESRCH): // ESRCH: the thread ended
		return fmt.Errorf("setting nice %d: %w", nice, err)
	}
	return nil
}

// monitorThread returns the thread ID of the Go runtime's system monitor,
// or 0 when the process has no thread but its first. runtime.main starts
// the monitor before anything else can start a thread (newm(sysmon) in
// runtime/proc.go), and the kernel hands out thread IDs in a cycle up to
// pid_max (alloc_pid, idr_alloc_cyclic in kernel/pid.c), so the monitor
// is the thread that comes first after the process's own ID in that cycle.
// A later thread can only come between once the IDs wrapped all the way
// round since, which takes millions of new tasks.
func monitorThread() (int, error) {
	tids, err := threads()
	if err != nil {
		return 0, fmt.Errorf("finding the runtime's monitor thread: %w", err)
	}
	pidMax := 1 << 22 // PID_MAX_LIMIT on 64-bit (include/linux/threads.h)
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			pidMax = n
		}
	}
	pid := os.Getpid()
	best, bestDist := 0, pidMax
	for _, tid := range tids {
		if d := ((tid-pid)%pidMax + pidMax) % pidMax; d != 0 && d < bestDist {
			best, bestDist = tid, d
		}
	}
	return best, nil
}

// spareThreads is how many idle threads raisePriority has the runtime
// keep before it gives the monitor its lower priority. The monitor starts
// a thread only when it hands a P it took back from a system call to
// another thread and none idles (startm, mget in runtime/proc.go), and
// a thread it starts would run at the monitor's nice value, the drainer
// on it too, until the next refresh; runs of hackbench under record saw
// that in 2 of 16. The runtime never ends an idle thread, and kconsume has
// far fewer goroutines in system calls at once than this.
const spareThreads = 8

// startSpareThreads has the runtime hold at least n threads more than it
// runs goroutines on, idle afterwards: each of n goroutines locks itself
// to a thread of its own and waits, so the runtime needs as many threads
// besides; then all unlock and end, which leaves their threads idle, not
// ended (runtime.UnlockOSThread).
func startSpareThreads(n int) {
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			ready.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	ready.Wait()
	close(release)
	done.Wait()
}

// raisePriority sets the process's threads to nice, unless they already
// run at that or lower and explicit is false (the default value never
// makes kconsume nicer than it was started); the runtime's monitor thread
// keeps the value the process had. It returns that value, for the
// commands it starts (startAtNice), and the niceness it applied (nil when
// it changed nothing). It fails when nice cannot be set.
func raisePriority(nice int, explicit bool) (prev int, p *niceness, err error) {
	if prev, err = currentNice(); err != nil {
		return 0, nil, err
	}
	if nice == prev || !explicit && prev < nice {
		return prev, nil, nil
	}
	mon, err := monitorThread()
	if err != nil {
		return prev, nil, err
	}
	// Every thread at nice first, the monitor too, so that the spare
	// threads, whoever starts them, take nice from their creator.
	if err := setNice(nice); err != nil {
		return prev, nil, err
	}
	startSpareThreads(spareThreads)
	p = &niceness{threads: nice, monitorNice: prev, monitor: mon}
	return prev, p, p.apply()
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
