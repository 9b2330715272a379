/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/syscall.h: what the syscall families share (x86_64, BPF ring buffers
 * only): the ring record of a syscall event, built in place from struct
 * pt_regs or from the raw tracepoint's arguments (kc_sys_emit), the
 * current thread and its 32-bit test (kc_sys_task), and KC_SYS_MAX, the
 * syscall numbers covered.
 */
#ifndef KC_SYSCALL_H
#define KC_SYSCALL_H

#include "filter.h"
#include "kc/event.h"
#include "kc/reserve.h"
#include <bpf/bpf_core_read.h>

#ifndef KC_PERF
/* Syscall numbers the dispatch covers; x86_64 has about 470. */
#define KC_SYS_MAX 1024

/* Read the current task with bpf_get_current_task_btf (5.11+). */
const volatile __u32 kc_task_btf = 0;

/*
 * arch/x86/include/asm/thread_info.h: TS_COMPAT marks a 32-bit syscall
 * (int $0x80, sysenter, a compat syscall), whose numbers are not the
 * x86_64 ones; the syscall events ignore those
 * (ARCH_TRACE_IGNORE_COMPAT_SYSCALLS, in_32bit_syscall) and so does this.
 */
#define KC_TS_COMPAT 0x0002

/*
 * kc_sys_task returns the current thread's id, or -1 during a 32-bit
 * syscall. With bpf_get_current_task_btf one read of the task gives both,
 * a helper call fewer per event than bpf_get_current_pid_tgid.
 */
static __always_inline __s32 kc_sys_task(void)
{
	struct task_struct *t;

	if (kc_task_btf) {
		t = bpf_get_current_task_btf();
		if (t->thread_info.status & KC_TS_COMPAT)
			return -1;
		return t->pid;
	}
	t = (struct task_struct *)bpf_get_current_task();
	if (BPF_CORE_READ(t, thread_info.status) & KC_TS_COMPAT)
		return -1;
	return (__u32)bpf_get_current_pid_tgid();
}

/*
 * The ring record of a syscall event, at most six arguments: struct
 * syscall_trace_enter or syscall_trace_exit as a ring record (KC_CUT),
 * and without the 4 bytes of padding after nr (the consumer's
 * sysRingOff): the entry, nr at 6, the arguments or ret from 10. Every
 * field follows the one before, so the consumer writes the record into
 * the trace as it is.
 */
struct kc_sys_rec {
	struct kc_rec hdr;
	__u8 data[KC_ENTRY_SIZE + 4 + 8 * 6];
};
_Static_assert(sizeof(struct kc_sys_rec) <= KC_SAMPLED_MAX, "syscall records are sampled");

#define KC_SYS_NR KC_ENTRY_SIZE
#define KC_SYS_ARG(i) (KC_ENTRY_SIZE + 4 + 8 * (i))

/* A syscall's six arguments, as the raw_syscalls:sys_enter record holds them. */
struct kc_sys_args {
	__u64 v[6];
};

/*
 * kc_sys_fill writes at data, a syscall record's payload, the part that
 * words (the ring record's size in 8-byte words, a constant at each call)
 * covers: the number, and the arguments on entry or ret on exit. Only stores inside
 * the reservation are made, which the verifier checks.
 */
static __always_inline void kc_sys_fill(void *data, __u32 words, struct pt_regs *regs, const struct kc_sys_args *a, long nr, __u32 exit, long ret)
{
	kc_put(__s32, data, KC_SYS_NR, nr);
	if (exit) {
		if (words > 2)
			kc_put(__u64, data, KC_SYS_ARG(0), ret);
		return;
	}
	if (a) {
		/* The perf tracepoint's record: its arguments already read. */
		if (words > 2)
			kc_put(__u64, data, KC_SYS_ARG(0), a->v[0]);
		if (words > 3)
			kc_put(__u64, data, KC_SYS_ARG(1), a->v[1]);
		if (words > 4)
			kc_put(__u64, data, KC_SYS_ARG(2), a->v[2]);
		if (words > 5)
			kc_put(__u64, data, KC_SYS_ARG(3), a->v[3]);
		if (words > 6)
			kc_put(__u64, data, KC_SYS_ARG(4), a->v[4]);
		if (words > 7)
			kc_put(__u64, data, KC_SYS_ARG(5), a->v[5]);
		return;
	}
	if (words > 2)
		kc_put(__u64, data, KC_SYS_ARG(0), regs->di);
	if (words > 3)
		kc_put(__u64, data, KC_SYS_ARG(1), regs->si);
	if (words > 4)
		kc_put(__u64, data, KC_SYS_ARG(2), regs->dx);
	if (words > 5)
		kc_put(__u64, data, KC_SYS_ARG(3), regs->r10);
	if (words > 6)
		kc_put(__u64, data, KC_SYS_ARG(4), regs->r8);
	if (words > 7)
		kc_put(__u64, data, KC_SYS_ARG(5), regs->r9);
}

/*
 * bpf_ringbuf_reserve takes only a constant size, so each record size a
 * syscall event can have (2 to 8 words) gets a reservation of its own.
 */
#define KC_SYS_RESERVE(w)                                                         \
	case w:                                                                   \
		r = (void *)kc_reserve(ring, st, cpu, sizeof(struct kc_rec) + 8 * (w), &res); \
		if (r)                                                            \
			kc_sys_fill(r->data, w, regs, a, nr, exit, ret);          \
		break;

/*
 * kc_sys_emit writes the syscall event key, number nr, of the thread pid:
 * on entry (exit 0) with the arguments in regs, on exit with ret, if the
 * filters pass; id and tsize are the event's kc_tp_info.id and .size.
 * The record is built in place in the ring, with no copy through the
 * stack. Its callers can nest with kc_tracepoint on one CPU
 * (a raw tracepoint or trampoline guards only against its own program,
 * kernel/trace/bpf_trace.c:__bpf_trace_run) and run preemptibly on
 * kernels with faultable syscall tracepoints, so it counts with atomic
 * adds.
 */
static __always_inline void kc_sys_emit(struct pt_regs *regs, const struct kc_sys_args *a, __u32 key, __u16 id, __u32 tsize, long nr, __u32 exit, long ret, __s32 pid)
{
	struct kc_sys_rec *r = NULL;
	struct kc_cpu_state *st;
	__u32 cpu, size;
	struct kc_resv res = {};
	void *ring;

	if (!kc_pass())
		return;
	st = kc_cpu_ring(&cpu, &ring);
	if (!st)
		return;
	/* 12 bytes without arguments (no padding then), else 16 + 8 per argument. */
	size = tsize - KC_CUT;
	if (size > KC_SYS_ARG(0))
		size -= 4;
	if (kc_pkt_on) {
		r = (void *)kc_reserve_pkt(st, cpu, key, size, KC_EVH_EXT + sizeof(r->data), &res);
		if (r)
			kc_sys_fill(r, (size + 7) / 8, regs, a, nr, exit, ret);
		goto reserved;
	}
	switch ((size + 7) / 8) {
	KC_SYS_RESERVE(2)
	KC_SYS_RESERVE(3)
	KC_SYS_RESERVE(4)
	KC_SYS_RESERVE(5)
	KC_SYS_RESERVE(6)
	KC_SYS_RESERVE(7)
	KC_SYS_RESERVE(8)
	default:
		return; /* not a syscall record: the loader never maps one here */
	}
reserved:
	if (!r) {
		__sync_fetch_and_add(&st->lost, 1);
		return;
	}
	kc_put_entry(kc_pkt_on ? (void *)r : (void *)r->data, id, pid);
	kc_submit(ring, &r->hdr, st, key, size, cpu, &res, 1, 0);
}
#endif

#endif /* KC_SYSCALL_H */
