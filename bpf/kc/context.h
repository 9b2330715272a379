/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/context.h: an event's context fields (kc_context), LTTng's kernel
 * contexts written behind its record in a fixed order, before its call
 * chains (kc/stack.h): procname, pid, tid, ppid, prio, nice, vpid, vtid,
 * vppid, cpu_id, cgroup and up to KC_CTX_PERF_MAX perf counters
 * (consumer/layout's contexts mirror the order, sizes and bits).
 */
#ifndef KC_CONTEXT_H
#define KC_CONTEXT_H

#include "kc/core.h"
#include "kc/event.h"
#include <bpf/bpf_core_read.h>

#define KC_CTX_PROCNAME (1 << 0) /* char[16], the task's comm */
#define KC_CTX_PID (1 << 1)      /* s32, the process id (tgid) */
#define KC_CTX_TID (1 << 2)      /* s32, the thread id */
#define KC_CTX_PPID (1 << 3)     /* s32, the parent's process id */
#define KC_CTX_PRIO (1 << 4)     /* s32, prio - 100, as lttng-modules writes it */
#define KC_CTX_NICE (1 << 5)     /* s32, static_prio - 120 */
#define KC_CTX_VPID (1 << 6)     /* s32, the process id in the task's pid namespace */
#define KC_CTX_VTID (1 << 7)     /* s32, the thread id there */
#define KC_CTX_VPPID (1 << 8)    /* s32, the parent's process id there, 0 outside it */
#define KC_CTX_CPU_ID (1 << 9)   /* s32 */
#define KC_CTX_CGROUP (1 << 10)  /* u64, the cgroup v2 id */
#define KC_CTX_PERF0 (1 << 11)   /* u64 each, perf counter slots 0 to 3 (kc_ctx_perf) */
#define KC_CTX_PERF_MAX 4

/* The most bytes the contexts take. */
#define KC_CTX_ROOM (16 + 9 * 4 + 8 + 8 * KC_CTX_PERF_MAX)

/*
 * kc_ctx_perf holds the counters of the perf contexts: slot k of CPU c at
 * k * number of CPUs + c, opened by the consumer on that CPU
 * (bpf_perf_event_read_value reads only the current CPU's).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 1); /* set to KC_CTX_PERF_MAX times the number of CPUs at load */
} kc_ctx_perf SEC(".maps");

/*
 * kc_ctx_stats counts, per CPU, the perf counter contexts the kernel
 * would not read (bpf_perf_event_read_value failed: no counter open on
 * this CPU, or one in error), each written as 0.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} kc_ctx_stats SEC(".maps");

/* The number of possible CPUs, kc_ctx_perf's stride. */
const volatile __u32 kc_ctx_ncpu = 1;

/*
 * kc_vnr returns the number of pid in the namespace of level, the level
 * of the task whose view it is, or 0 when pid is not seen there
 * (include/linux/pid.h: pid_nr_ns).
 */
static __always_inline __s32 kc_vnr(struct pid *pid, __u32 level)
{
	__s32 nr = 0;

	if (!pid || BPF_CORE_READ(pid, level) < level || level > 31)
		return 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), (void *)pid + bpf_core_field_offset(struct pid, numbers) +
							    level * bpf_core_type_size(struct upid) + bpf_core_field_offset(struct upid, nr));
	return nr;
}

/*
 * kc_context_into writes at d the contexts of bits (KC_CTX_*) of the
 * current task, in their order, and returns the bytes written (at most
 * KC_CTX_ROOM). A counter that cannot be read is written 0.
 */
static __always_inline __u32 kc_context_into(__u8 *d, __u32 bits)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	__u64 id = bpf_get_current_pid_tgid();
	__u32 n = 0, level = 0;
	struct pid *tp = NULL;
	int k;

	if (bits & KC_CTX_PROCNAME) {
		bpf_get_current_comm(d, 16);
		n += 16;
	}
	if (bits & KC_CTX_PID) {
		kc_put(__s32, d, n, id >> 32);
		n += 4;
	}
	if (bits & KC_CTX_TID) {
		kc_put(__s32, d, n, (__u32)id);
		n += 4;
	}
	if (bits & KC_CTX_PPID) {
		kc_put(__s32, d, n, BPF_CORE_READ(t, real_parent, tgid));
		n += 4;
	}
	if (bits & KC_CTX_PRIO) {
		kc_put(__s32, d, n, BPF_CORE_READ(t, prio) - 100);
		n += 4;
	}
	if (bits & KC_CTX_NICE) {
		kc_put(__s32, d, n, BPF_CORE_READ(t, static_prio) - 120);
		n += 4;
	}
	if (bits & (KC_CTX_VPID | KC_CTX_VTID | KC_CTX_VPPID)) {
		tp = BPF_CORE_READ(t, thread_pid);
		level = tp ? BPF_CORE_READ(tp, level) : 0;
	}
	if (bits & KC_CTX_VPID) {
		kc_put(__s32, d, n, kc_vnr(BPF_CORE_READ(t, group_leader, thread_pid), level));
		n += 4;
	}
	if (bits & KC_CTX_VTID) {
		kc_put(__s32, d, n, kc_vnr(tp, level));
		n += 4;
	}
	if (bits & KC_CTX_VPPID) {
		kc_put(__s32, d, n, kc_vnr(BPF_CORE_READ(t, real_parent, group_leader, thread_pid), level));
		n += 4;
	}
	if (bits & KC_CTX_CPU_ID) {
		kc_put(__s32, d, n, bpf_get_smp_processor_id());
		n += 4;
	}
	if (bits & KC_CTX_CGROUP) {
		kc_put(__u64, d, n, bpf_get_current_cgroup_id());
		n += 8;
	}
#pragma unroll
	for (k = 0; k < KC_CTX_PERF_MAX; k++) {
		struct bpf_perf_event_value v = {};

		if (!(bits & (KC_CTX_PERF0 << k)))
			continue;
		if (bpf_perf_event_read_value(&kc_ctx_perf, k * kc_ctx_ncpu + bpf_get_smp_processor_id(), &v, sizeof(v))) {
			__u32 zero = 0;
			__u64 *failed = bpf_map_lookup_elem(&kc_ctx_stats, &zero);

			if (failed)
				(*failed)++;
			v.counter = 0;
		}
		kc_put(__u64, d, n, v.counter);
		n += 8;
	}
	return n;
}

/*
 * kc_context_at writes at off in the data of this CPU's record in map, a
 * per-CPU array whose value begins with a struct kc_scratch, the
 * contexts of bits (kc_context_into), and returns the bytes written, 0
 * for an off that leaves no room.
 */
static __always_inline __u32 kc_context_at(void *map, __u32 off, __u32 bits)
{
	__u32 zero = 0;
	struct kc_scratch *s = bpf_map_lookup_elem(map, &zero);

	if (!s || off > KC_MAX_PAYLOAD - 1 - KC_CTX_ROOM)
		return 0;
	barrier_var(off);
	off &= KC_PAYLOAD_MASK;
	return kc_context_into(s->data + off, bits);
}

/*
 * kc_context is kc_context_at on this CPU's scratch record (where
 * kc_record builds the record). A global function: the verifier checks
 * its branches once, not once for every path of each caller. It takes no
 * pointer, which global functions take only from Linux 5.12 on.
 */
__noinline __u32 kc_context(__u32 off, __u32 bits)
{
	return kc_context_at(&kc_scratch_map, off, bits);
}

/*
 * kc_context_probe is kc_context for kc_probe's own scratch record
 * (kc/probe.bpf.h, which defines it): a probe's program, which may run
 * preemptibly or nested in another of ours, never writes the shared one.
 */
__u32 kc_context_probe(__u32 off, __u32 bits);

#endif /* KC_CONTEXT_H */
