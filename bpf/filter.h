/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * filter.h: in-kernel filters, each enabled at load time through rodata so
 * an unused filter costs nothing: a pid/tgid set, a cgroup v2 subtree, and a
 * set of command names.
 */
#ifndef KCONSUME_FILTER_H
#define KCONSUME_FILTER_H

#include "kconsume.h"

#define KC_COMM_LEN 16

const volatile __u32 kc_filter_pid = 0;
const volatile __u32 kc_filter_cgroup = 0;
const volatile __u32 kc_filter_comm = 0;

/*
 * kc_pid_bits has bit (id % KC_PID_BITS) set for each id in kc_pids, set
 * before load: an event of a task that is not recorded, the common case
 * of a pid filter, is rejected with two loads instead of two hash
 * lookups (helper calls). A set bit is confirmed in kc_pids.
 */
#define KC_PID_WORDS 1024
#define KC_PID_BITS (64 * KC_PID_WORDS)
const volatile __u64 kc_pid_bits[KC_PID_WORDS] = {};

static __always_inline int kc_pid_maybe(__u32 id)
{
	return (kc_pid_bits[(id / 64) % KC_PID_WORDS] >> (id % 64)) & 1;
}

/* Thread ids and process ids (tgid) to record; either one matching passes. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} kc_pids SEC(".maps");

/* Slot 0 holds the cgroup v2 directory whose subtree is recorded. */
struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} kc_cgroup SEC(".maps");

struct kc_comm {
	char comm[KC_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct kc_comm);
	__type(value, __u8);
} kc_comms SEC(".maps");

/* kc_pass_comm returns whether the current task passes the command-name filter. */
static __always_inline int kc_pass_comm(void)
{
	if (kc_filter_comm) {
		struct kc_comm c = {};

		bpf_get_current_comm(c.comm, sizeof(c.comm));
		if (!bpf_map_lookup_elem(&kc_comms, &c))
			return 0;
	}
	return 1;
}

/* kc_pass returns whether the current task passes every enabled filter. */
static __always_inline int kc_pass(void)
{
	if (kc_filter_pid) {
		__u64 id = bpf_get_current_pid_tgid();
		__u32 tid = (__u32)id, tgid = id >> 32;

		if (!kc_pid_maybe(tgid) && !kc_pid_maybe(tid))
			return 0;
		if (!bpf_map_lookup_elem(&kc_pids, &tgid) && !bpf_map_lookup_elem(&kc_pids, &tid))
			return 0;
	}
	if (kc_filter_cgroup && bpf_current_task_under_cgroup(&kc_cgroup, 0) != 1)
		return 0;
	return kc_pass_comm();
}

/*
 * kc_pass_pid returns whether the thread pid passes the pid filter: for
 * events about a task other than the current one.
 */
static __always_inline int kc_pass_pid(__u32 pid)
{
	return !kc_filter_pid || (kc_pid_maybe(pid) && bpf_map_lookup_elem(&kc_pids, &pid));
}

#endif /* KCONSUME_FILTER_H */
