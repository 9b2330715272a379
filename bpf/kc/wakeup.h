/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/wakeup.h: synthetic:wakeup_latency, which the classic tracepoints'
 * program computes from sched_waking and sched_switch when it is recorded
 * (kc_hooks, the KC_TP_WAKING and KC_TP_SWITCH classes).
 */
#ifndef KC_WAKEUP_H
#define KC_WAKEUP_H

#include "filter.h"
#include "kc/emit.h"
#include "kc/event.h"

/* When each woken task was woken, until it runs. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __s32);
	__type(value, __u64);
} kc_wake_ts SEC(".maps");

/*
 * struct kc_wakeup_latency is the payload of synthetic:wakeup_latency,
 * "pid_t pid; char comm[16]; int prio; u64 latency_ns; unsigned int cpu"
 * (consumer/wakeup.go), packed as relayfmt lays fields out.
 */
struct kc_wakeup_latency {
	__s32 pid;
	char comm[16];
	__s32 prio;
	__u64 latency_ns;
	__u32 cpu;
} __attribute__((packed));

/*
 * kc_wakeup computes synthetic:wakeup_latency as the kernel's histogram
 * triggers do (Documentation/trace/histogram.rst, "wakeup_latency"):
 * sched_waking stores the time per pid, sched_switch to that pid emits the
 * difference. ts is the time of the record written for this tracepoint,
 * when there is one, so the latency equals the difference of the two
 * records' timestamps in the trace. The pid filter applies to the woken
 * task (the current task is the waker or the one switched out).
 */
static __always_inline void kc_wakeup(void *ctx, struct kc_tp_info *info, __u64 ts)
{
	struct kc_wakeup_latency *w;
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	__u64 *then, woken;
	__s32 pid = 0;

	bpf_probe_read_kernel(&pid, sizeof(pid), ctx + (info->pid_off & 0xfff));
	if (pid <= 0)
		return;
	if (info->flags & KC_TP_WAKING) {
		bpf_map_update_elem(&kc_wake_ts, &pid, &ts, BPF_ANY);
		return;
	}
	then = bpf_map_lookup_elem(&kc_wake_ts, &pid);
	if (!then)
		return;
	woken = *then;
	bpf_map_delete_elem(&kc_wake_ts, &pid);
	if (woken > ts || !kc_pass_pid(pid))
		return;
	s = kc_emit_begin(info->aux_key, &st);
	if (!s)
		return;
	w = (void *)s->data;
	w->pid = pid;
	bpf_probe_read_kernel(w->comm, sizeof(w->comm), ctx + (info->comm_off & 0xfff));
	w->prio = 0;
	bpf_probe_read_kernel(&w->prio, sizeof(w->prio), ctx + (info->prio_off & 0xfff));
	w->latency_ns = ts - woken;
	w->cpu = s->hdr.cpu;
	kc_emit_at(ctx, s, st, sizeof(*w), ts);
}

#endif /* KC_WAKEUP_H */
