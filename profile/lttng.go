package profile

import (
	"sort"
	"strings"

	"github.com/kconsume/kconsume/consumer"
)

// LTTngTracer is the tracer_name of LTTng's kernel traces.
const LTTngTracer = "lttng-modules"

// The lttng-modules version the names follow (its 2.8 namespacing:
// irq_softirq_*, timer_hrtimer_*, kmem_*, power_*, net_if_*). Readers pick
// their event layout by it (Trace Compass's LttngEventLayout family;
// lttnganalyses' sched_wakeup priority fix from 2.7.1).
const (
	LTTngMajor      = 2
	LTTngMinor      = 13
	LTTngPatchlevel = 0
)

// Prefixes of the names that follow a pattern rather than the table.
const (
	ftraceEnter = "syscalls:sys_enter_"
	ftraceExit  = "syscalls:sys_exit_"
	lttngEnter  = "syscall_entry_"
	lttngExit   = "syscall_exit_"
	// StatedumpPrefix names the statedump's events under both profiles:
	// synthetic:lttng_statedump_* in ftrace, lttng_statedump_* in lttng.
	StatedumpPrefix = "lttng_statedump_"
)

// Mapping is one ftrace event lttng-modules records under another name or
// with other field names.
type Mapping struct {
	Ftrace string
	LTTng  string
	// Fields renames fields, ftrace name to lttng-modules name.
	Fields map[string]string
}

// tid is the renaming of lttng-modules' sched events: what ftrace calls a
// pid is the task's pid, which is a thread id (lttng-modules sched.h).
var tid = map[string]string{"pid": "tid"}

// lttngTable follows lttng-modules include/instrumentation/events/*.h:
// events it records under their tracepoint name with the fields ftrace
// has, and those it renames (LTTNG_TRACEPOINT_EVENT_MAP, _INSTANCE_MAP).
// An event is here only when the fields LTTng's readers key on exist with
// the type lttng-modules gives them; the rest keep their ftrace names
// (block_rq_*: lttng-modules' rwbs is an integer and it adds tid).
// Events whose values differ are built by the profile's own program
// (Built).
var lttngTable = []Mapping{
	{"sched:sched_switch", "sched_switch", map[string]string{"prev_pid": "prev_tid", "next_pid": "next_tid"}},
	{"sched:sched_wakeup", "sched_wakeup", tid},
	{"sched:sched_wakeup_new", "sched_wakeup_new", tid},
	{"sched:sched_waking", "sched_waking", tid},
	{"sched:sched_migrate_task", "sched_migrate_task", tid},
	{"sched:sched_process_exec", "sched_process_exec", map[string]string{"pid": "tid", "old_pid": "old_tid"}},
	{"sched:sched_process_exit", "sched_process_exit", tid},
	{"sched:sched_process_free", "sched_process_free", tid},
	{"sched:sched_process_wait", "sched_process_wait", tid},
	{"sched:sched_wait_task", "sched_wait_task", tid},
	{"sched:sched_kthread_stop", "sched_kthread_stop", tid},
	{"sched:sched_kthread_stop_ret", "sched_kthread_stop_ret", nil},
	{"sched:sched_pi_setprio", "sched_pi_setprio", tid},
	{"sched:sched_stat_runtime", "sched_stat_runtime", tid},
	{"sched:sched_stat_wait", "sched_stat_wait", tid},
	{"sched:sched_stat_sleep", "sched_stat_sleep", tid},
	{"sched:sched_stat_iowait", "sched_stat_iowait", tid},
	{"sched:sched_stat_blocked", "sched_stat_blocked", tid},
	{"irq:irq_handler_entry", "irq_handler_entry", nil},
	{"irq:irq_handler_exit", "irq_handler_exit", nil},
	{"irq:softirq_entry", "irq_softirq_entry", nil},
	{"irq:softirq_exit", "irq_softirq_exit", nil},
	{"irq:softirq_raise", "irq_softirq_raise", nil},
	{"timer:timer_init", "timer_init", nil},
	{"timer:timer_start", "timer_start", nil},
	{"timer:timer_expire_entry", "timer_expire_entry", nil},
	{"timer:timer_expire_exit", "timer_expire_exit", nil},
	{"timer:timer_cancel", "timer_cancel", nil},
	{"timer:hrtimer_init", "timer_hrtimer_init", nil},
	{"timer:hrtimer_start", "timer_hrtimer_start", nil},
	{"timer:hrtimer_expire_entry", "timer_hrtimer_expire_entry", nil},
	{"timer:hrtimer_expire_exit", "timer_hrtimer_expire_exit", nil},
	{"timer:hrtimer_cancel", "timer_hrtimer_cancel", nil},
	{"timer:itimer_state", "timer_itimer_state", nil},
	{"timer:itimer_expire", "timer_itimer_expire", nil},
	{"kmem:kmalloc", "kmem_kmalloc", nil},
	{"kmem:kmalloc_node", "kmem_kmalloc_node", nil},
	{"kmem:kfree", "kmem_kfree", nil},
	{"kmem:kmem_cache_alloc", "kmem_cache_alloc", nil},
	{"kmem:kmem_cache_alloc_node", "kmem_cache_alloc_node", nil},
	{"kmem:kmem_cache_free", "kmem_cache_free", nil},
	{"kmem:mm_page_alloc", "kmem_mm_page_alloc", nil},
	{"kmem:mm_page_free", "kmem_mm_page_free", nil},
	{"kmem:mm_page_free_batched", "kmem_mm_page_free_batched", nil},
	{"kmem:mm_page_alloc_zone_locked", "kmem_mm_page_alloc_zone_locked", nil},
	{"kmem:mm_page_pcpu_drain", "kmem_mm_page_pcpu_drain", nil},
	{"kmem:mm_page_alloc_extfrag", "kmem_mm_page_alloc_extfrag", nil},
	{"power:cpu_idle", "power_cpu_idle", nil},
	{"power:cpu_frequency", "power_cpu_frequency", nil},
	{"power:machine_suspend", "power_machine_suspend", nil},
	{"power:wakeup_source_activate", "power_wakeup_source_activate", nil},
	{"power:wakeup_source_deactivate", "power_wakeup_source_deactivate", nil},
	{"power:clock_enable", "power_clock_enable", nil},
	{"power:clock_disable", "power_clock_disable", nil},
	{"power:clock_set_rate", "power_clock_set_rate", nil},
	{"net:net_dev_xmit", "net_dev_xmit", nil},
	{"net:net_dev_queue", "net_dev_queue", nil},
	{"net:netif_receive_skb", "net_if_receive_skb", nil},
	{"net:netif_rx", "net_if_rx", nil},
	{"net:netif_receive_skb_entry", "net_if_receive_skb_entry", nil},
	{"net:netif_receive_skb_list_entry", "net_if_receive_skb_list_entry", nil},
	{"net:netif_rx_entry", "net_if_rx_entry", nil},
	{"net:napi_gro_receive_entry", "net_napi_gro_receive_entry", nil},
	{"net:napi_gro_frags_entry", "net_napi_gro_frags_entry", nil},
	{"net:netif_receive_skb_exit", "net_if_receive_skb_exit", nil},
	{"net:netif_receive_skb_list_exit", "net_if_receive_skb_list_exit", nil},
	{"net:netif_rx_exit", "net_if_rx_exit", nil},
	{"net:napi_gro_receive_exit", "net_napi_gro_receive_exit", nil},
	{"net:napi_gro_frags_exit", "net_napi_gro_frags_exit", nil},
	{"skb:kfree_skb", "skb_kfree", nil},
	{"skb:consume_skb", "skb_consume", nil},
	{"signal:signal_generate", "signal_generate", nil},
	{"signal:signal_deliver", "signal_deliver", nil},
	{"workqueue:workqueue_queue_work", "workqueue_queue_work", nil},
	{"workqueue:workqueue_activate_work", "workqueue_activate_work", nil},
	{"workqueue:workqueue_execute_start", "workqueue_execute_start", nil},
	{"workqueue:workqueue_execute_end", "workqueue_execute_end", nil},
}

// maxRTPrio is the kernel's MAX_RT_PRIO. lttng-modules writes every
// scheduler priority as task->prio - MAX_RT_PRIO (its sched.h), so a
// nice-0 task is 20; ftrace writes task->prio, 120.
const maxRTPrio = 100

// prio is the adjustment of an event whose one priority field is prio.
var prio = map[string]consumer.Adjust{"prio": {Delta: -maxRTPrio}}

// lttngAdjust are the values the lttng profile writes otherwise than
// ftrace, by ftrace event and field: the priorities of the sched events
// that carry one (lttng-modules sched.h).
var lttngAdjust = map[string]map[string]consumer.Adjust{
	"sched:sched_switch":       {"prev_prio": {Delta: -maxRTPrio}, "next_prio": {Delta: -maxRTPrio}},
	"sched:sched_wakeup":       prio,
	"sched:sched_wakeup_new":   prio,
	"sched:sched_waking":       prio,
	"sched:sched_migrate_task": prio,
	"sched:sched_process_exit": prio,
	"sched:sched_process_free": prio,
	"sched:sched_process_wait": prio,
	"sched:sched_wait_task":    prio,
	"sched:sched_pi_setprio":   {"oldprio": {Delta: -maxRTPrio}, "newprio": {Delta: -maxRTPrio}},
}

var (
	byFtrace = map[string]*Mapping{}
	byLTTng  = map[string]*Mapping{}
)

func init() {
	for i := range lttngTable {
		m := &lttngTable[i]
		byFtrace[m.Ftrace] = m
		byLTTng[m.LTTng] = m
	}
}

// Mappings returns the table of renamed events in ftrace-name order,
// without the pattern rules (syscalls, statedump), which Patterns gives.
func Mappings() []Mapping {
	out := append([]Mapping(nil), lttngTable...)
	sort.Slice(out, func(i, j int) bool { return out[i].Ftrace < out[j].Ftrace })
	return out
}

// Patterns returns the renaming rules that cover families of events, as
// "ftrace -> lttng" lines.
func Patterns() []string {
	return []string{
		ftraceEnter + "NAME -> " + lttngEnter + "NAME (arguments keep their names)",
		ftraceExit + "NAME -> " + lttngExit + "NAME (ret)",
		"synthetic:" + StatedumpPrefix + "NAME -> " + StatedumpPrefix + "NAME",
	}
}

func lttngName(name string) (string, map[string]string, bool) {
	if m := byFtrace[name]; m != nil {
		return m.LTTng, m.Fields, true
	}
	if b := builtBySynth[name]; b != nil {
		return b.LTTng, nil, true
	}
	if rest, ok := strings.CutPrefix(name, ftraceEnter); ok && rest != "" {
		return lttngEnter + rest, nil, true
	}
	if rest, ok := strings.CutPrefix(name, ftraceExit); ok && rest != "" {
		return lttngExit + rest, nil, true
	}
	if rest, ok := strings.CutPrefix(name, "synthetic:"+StatedumpPrefix); ok && rest != "" {
		return StatedumpPrefix + rest, nil, true
	}
	return name, nil, false
}

func lttngOriginal(name string) (string, bool) {
	if m := byLTTng[name]; m != nil {
		return m.Ftrace, true
	}
	if b := builtByLTTng[name]; b != nil {
		return b.Ftrace, true
	}
	if rest, ok := strings.CutPrefix(name, lttngEnter); ok && rest != "" {
		return ftraceEnter + rest, true
	}
	if rest, ok := strings.CutPrefix(name, lttngExit); ok && rest != "" {
		return ftraceExit + rest, true
	}
	if strings.HasPrefix(name, StatedumpPrefix) {
		return "synthetic:" + name, true
	}
	return name, false
}
