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
// the type lttng-modules gives them, or the consumer writes them so
// (lttngAdjust: block's rwbs as an integer); the rest keep their ftrace
// names. Events whose values ftrace lacks are built by the profile's own
// program (Built).
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
	{"block:block_rq_issue", "block_rq_issue", current},
	{"block:block_rq_insert", "block_rq_insert", current},
	{"block:block_rq_merge", "block_rq_merge", current},
	{"block:block_rq_complete", "block_rq_complete", nil},
	{"block:block_rq_requeue", "block_rq_requeue", nil},
	{"block:block_rq_remap", "block_rq_remap", nil},
	{"block:block_bio_queue", "block_bio_queue", current},
	{"block:block_bio_backmerge", "block_bio_backmerge", current},
	{"block:block_bio_frontmerge", "block_bio_frontmerge", current},
	{"block:block_bio_bounce", "block_bio_bounce", current},
	{"block:block_bio_complete", "block_bio_complete", nil},
	{"block:block_bio_remap", "block_bio_remap", nil},
	{"block:block_getrq", "block_getrq", current},
	{"block:block_sleeprq", "block_sleeprq", current},
	{"block:block_split", "block_split", current},
	{"block:block_plug", "block_plug", current},
	{"block:block_unplug", "block_unplug", current},
	{"block:block_touch_buffer", "block_touch_buffer", nil},
	{"block:block_dirty_buffer", "block_dirty_buffer", nil},
}

// current is the renaming of the block events to which lttng-modules adds
// tid, the current task's thread id (current->pid, its block.h): ftrace's
// common_pid is that id.
var current = map[string]string{"common_pid": "tid"}

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

// rwbs is the adjustment of the block events' rwbs.
var rwbs = map[string]consumer.Adjust{"rwbs": {Flags: RWBS}}

func init() {
	for _, e := range []string{"rq_issue", "rq_insert", "rq_merge", "rq_complete", "rq_requeue", "rq_remap",
		"bio_queue", "bio_backmerge", "bio_frontmerge", "bio_bounce", "bio_complete", "bio_remap", "getrq", "sleeprq", "split"} {
		lttngAdjust["block:block_"+e] = rwbs
	}
}

// lttng-modules' rwbs bits (RWBS_FLAG_*, its block.h).
const (
	rwbsWrite    = 1 << 0
	rwbsDiscard  = 1 << 1
	rwbsRead     = 1 << 2
	rwbsRahead   = 1 << 3
	rwbsSync     = 1 << 5
	rwbsMeta     = 1 << 6
	rwbsSecure   = 1 << 7
	rwbsFlush    = 1 << 8
	rwbsFUA      = 1 << 9
	rwbsPreflush = 1 << 10
)

// RWBS returns lttng-modules' integer rwbs for ftrace's rwbs text, which
// the kernel's blk_fill_rwbs (kernel/trace/blktrace.c) writes as: F when
// REQ_PREFLUSH; the operation, W(rite), D(iscard), DE (secure erase),
// F(lush), R(ead) or N (another); then F (REQ_FUA), A (REQ_RAHEAD), S
// (REQ_SYNC), M (REQ_META), each when set. lttng-modules gives the
// operation and the same flags a bit each, and 0 to another operation;
// letters it has no bit for (U, REQ_ATOMIC) are left out. Readers test
// the write bit: LTTng's analyses count an odd rwbs as a write.
func RWBS(text []byte) uint32 {
	var v uint32
	// A leading F is REQ_PREFLUSH when an operation follows it; alone,
	// or before a flag letter, it is the flush operation.
	if len(text) > 1 && text[0] == 'F' && strings.IndexByte("WDFRN", text[1]) >= 0 {
		v |= rwbsPreflush
		text = text[1:]
	}
	if len(text) == 0 {
		return v
	}
	switch text[0] {
	case 'W':
		v |= rwbsWrite
	case 'D':
		v |= rwbsDiscard
		if len(text) > 1 && text[1] == 'E' {
			v |= rwbsSecure
			text = text[1:]
		}
	case 'F':
		v |= rwbsFlush
	case 'R':
		v |= rwbsRead
	}
	for _, c := range text[1:] {
		switch c {
		case 'F':
			v |= rwbsFUA
		case 'A':
			v |= rwbsRahead
		case 'S':
			v |= rwbsSync
		case 'M':
			v |= rwbsMeta
		}
	}
	return v
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
