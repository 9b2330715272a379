/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/sys_user.bpf.h: syscalls' user-space values (kc/sys_user.h):
 * kc_sys_user_fault pages in what kc_sys_user will read and, with
 * kc_sys_user_rec, records the event itself.
 */
#ifndef KC_SYS_USER_BPF_H
#define KC_SYS_USER_BPF_H

#include "filter.h"
#include "kc/event.h"
#include "kc/record.h"
#include "kc/sys_user.h"
#include "kc/syscall.h"

#ifndef KC_PERF
/*
 * kc_sys_user_keys maps a syscall number to the event key + 1 of its
 * sys_enter event where that event has user-space fields (kc_sys_user)
 * and is recorded, else to 0.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, KC_SYS_MAX);
	__type(key, __u32);
	__type(value, __u32);
} kc_sys_user_keys SEC(".maps");

extern int bpf_copy_from_user_str(void *dst, __u32 dst__sz, const void *unsafe_ptr__ign, __u64 flags) __ksym;

extern void bpf_preempt_disable(void) __ksym;
extern void bpf_preempt_enable(void) __ksym;

/*
 * Set by the loader where kc_sys_user_fault records the events it pages
 * memory in for (kc_sys_user_emit), so that they need no tracepoint of
 * their own: not under a cgroup filter, which a sleepable program cannot
 * test, nor with --syscalls tracepoint.
 */
const volatile __u32 kc_sys_user_rec = 0;

/*
 * kc_sys_user_fault's scratch: slot 0 the record (a struct kc_scratch
 * heads a struct kc_ctf), slot 1 packet mode's build of it, and before
 * that the bytes the paging-in copies read and drop. Not kc_scratch_map
 * or kc_ctf_map: a perf program of an interrupt may use those while this
 * one builds a record.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct kc_ctf);
} kc_sys_user_scratch SEC(".maps");

/*
 * kc_user_field_filter returns nonzero to keep syscall event key, with
 * user-space fields, whose ring record is the len bytes at data (in the
 * scratch record, kc_field_filter's layout). As built it keeps every
 * event; where such an event has a field filter, the loader puts in its
 * body the filters of the syscall events, dispatched on key
 * (consumer/recorder/filtercode.go).
 */
static __noinline int kc_user_field_filter(__u32 key, __u8 *data, __u32 len)
{
	int keep;

	asm volatile("%0 = 1" : "=r"(keep) : "r"(key), "r"(data), "r"(len));
	return keep;
}

/*
 * kc_sys_user_emit records the entry event key of syscall nr, with
 * info, from the registers: as kc_record builds it from perf's
 * context (the number, 4 bytes of padding, the arguments before the
 * user-space fields), then kc_sys_user fills the fields. Run with
 * preemption disabled: then no other run of kc_sys_user_fault shares
 * this CPU's scratch, and interrupts, which never enter a syscall, do
 * not run it.
 */
static __always_inline void kc_sys_user_emit(struct pt_regs *regs, long nr, __u32 key, struct kc_tp_info *info)
{
	__u32 zero = 0, cpu, size;
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	int j;

	cpu = bpf_get_smp_processor_id();
	st = bpf_map_lookup_elem(&kc_state, &cpu);
	if (!st || st->disabled)
		return;
	s = bpf_map_lookup_elem(&kc_sys_user_scratch, &zero);
	if (!s)
		return;
	s->hdr.key = key;
	s->hdr.cpu = cpu;
	kc_put(__s32, s->data, KC_ENTRY_SIZE, nr);
	kc_put(__u32, s->data, KC_ENTRY_SIZE + 4, 0);
	/*
	 * All six, whatever the event's count: kc_sys_user writes the
	 * fields over those past it. A store per argument it has would
	 * have the verifier check the rest once for each count.
	 */
#pragma unroll
	for (j = 0; j < 6; j++)
		kc_put(__u64, s->data, 16 - KC_CUT + 8 * j, kc_sys_arg(regs, NULL, j));
	size = kc_sys_user(s->data, info);
	if (size < 16)
		return;
	if (info->flags & KC_TP_FILTERED) {
		if (!kc_user_field_filter(key, s->data, KC_ENTRY_SIZE + size - 8))
			return;
		kc_fields_count(key);
	}
	kc_record_end(NULL, s, &kc_sys_user_scratch, 1, st, key, info, size - 8, 0, 1);
}

/*
 * kc_sys_user_fault pages in the user memory that kc_sys_user will read
 * for a recorded syscall event with user-space fields, by copying it as
 * the kernel copies it for its own events (sys_fault_user): the program
 * is sleepable (Linux 7.x takes such programs on the faultable syscall
 * tracepoints), so its copy may fault, where kc_sys_user's cannot. The
 * loader makes it sleepable (BPF_F_SLEEPABLE: cilium/ebpf reads no
 * tp_btf.s section).
 *
 * With kc_sys_user_rec it then records the event itself, as the raw
 * path records the others: no perf tracepoint per event, whose
 * perf_syscall_enter costs more than the record, and each of whose
 * links costs record's stop a grace period. Otherwise the loader
 * attaches it before the events' tracepoints, and a tracepoint calls its
 * probes in the order they came (kernel/tracepoint.c, func_add), so it
 * runs before perf_syscall_enter runs kc_tracepoint.
 */
SEC("tp_btf/sys_enter")
int kc_sys_user_fault(__u64 *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	__u32 slot, key, *k, a, one = 1;
	struct kc_tp_info *info;
	long nr = ctx[1];
	__u64 cnt, id;
	__u8 *buf;
	int j;

	if (!kc_running || (__u64)nr >= KC_SYS_MAX)
		return 0;
	slot = nr;
	k = bpf_map_lookup_elem(&kc_sys_user_keys, &slot);
	/*
	 * No cgroup filter: a sleepable program may not use kc_pass's
	 * cgroup array (the loader keeps the tracepoints under one, and
	 * paging in what the syscall is about to read itself changes
	 * nothing for a task the filter leaves out).
	 */
	id = bpf_get_current_pid_tgid();
	if (!k || !*k || kc_sys_task() < 0 || (!kc_pass_pid(id) && !kc_pass_pid(id >> 32)))
		return 0;
	if (kc_sys_user_rec && !kc_pass_comm())
		return 0;
	key = *k - 1;
	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	/* Slot 1 holds nothing yet: the copies only page memory in. */
	buf = bpf_map_lookup_elem(&kc_sys_user_scratch, &one);
	if (!info || !(info->flags & KC_TP_SYSUSER) || !buf)
		return 0;
#pragma unroll
	for (j = 0; j < KC_SYS_USER_CNT; j++) {
		if (j >= info->user_n || !info->user_max)
			break;
		a = info->user_arg[j];
		if (info->user_len >= 0) {
			cnt = kc_sys_arg(regs, NULL, info->user_len);
			if (cnt > KC_SYS_USER_READ)
				cnt = KC_SYS_USER_READ;
			bpf_copy_from_user(buf, cnt, (const void *)kc_sys_arg(regs, NULL, a));
		} else {
			bpf_copy_from_user_str(buf, KC_SYS_USER_READ + 1, (const void *)kc_sys_arg(regs, NULL, a), 0);
		}
	}
	if (kc_sys_user_rec) {
		bpf_preempt_disable();
		kc_sys_user_emit(regs, nr, key, info);
		bpf_preempt_enable();
	}
	return 0;
}

#endif

#endif /* KC_SYS_USER_BPF_H */
