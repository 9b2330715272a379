package synth

import "slices"

// The built-in synthetic events: kconsume produces them itself and needs
// no definition from the user; their names cannot be defined again.
const (
	// Klog is a text message: from a BPF program (kc_klog, kc_klog_write
	// in bpf/kc_synth.h) or from user space (kconsume synth emit klog).
	Klog = "klog"
	// WakeupLatency is the time from a task's sched_waking to the
	// sched_switch that runs it, computed by the recorder.
	WakeupLatency = "wakeup_latency"
)

var builtins = map[string]string{
	Klog:          "klog char[] msg",
	WakeupLatency: "wakeup_latency pid_t pid; char comm[16]; int prio; u64 latency_ns; unsigned int cpu",
}

// Builtin returns a new copy of the built-in event called name, or nil.
func Builtin(name string) *Event {
	def, ok := builtins[name]
	if !ok {
		return nil
	}
	e, err := Parse(def)
	if err != nil {
		panic("synth: built-in " + name + ": " + err.Error())
	}
	return e
}

// Builtins returns the names of the built-in events, sorted.
func Builtins() []string {
	var names []string
	for n := range builtins {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
