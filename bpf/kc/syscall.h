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
#include "kc/fields.h"
#include "kc/reserve.h"
#include "kc/trigger.h"
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
 * kc_sys_arg returns argument i (0 to 5) of the syscall: from a, the
 * perf tracepoint's record, when set, else from regs as
 * syscall_get_arguments takes them.
 */
static __always_inline __u64 kc_sys_arg(struct pt_regs *regs, const struct kc_sys_args *a, __u32 i)
{
	if (a)
		return a->v[i];
	switch (i) {
	case 0:
		return regs->di;
	case 1:
		return regs->si;
	case 2:
		return regs->dx;
	case 3:
		return regs->r10;
	case 4:
		return regs->r8;
	}
	return regs->r9;
}

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
	if (words > 2)
		kc_put(__u64, data, KC_SYS_ARG(0), kc_sys_arg(regs, a, 0));
	if (words > 3)
		kc_put(__u64, data, KC_SYS_ARG(1), kc_sys_arg(regs, a, 1));
	if (words > 4)
		kc_put(__u64, data, KC_SYS_ARG(2), kc_sys_arg(regs, a, 2));
	if (words > 5)
		kc_put(__u64, data, KC_SYS_ARG(3), kc_sys_arg(regs, a, 3));
	if (words > 6)
		kc_put(__u64, data, KC_SYS_ARG(4), kc_sys_arg(regs, a, 4));
	if (words > 7)
		kc_put(__u64, data, KC_SYS_ARG(5), kc_sys_arg(regs, a, 5));
}

/*
 * kc_sys_field_filter returns nonzero to keep syscall event key, whose
 * record is the KC_SYS_REC bytes at data as the kernel lays it out (struct
 * syscall_trace_enter or syscall_trace_exit of kernel/trace/
 * trace_syscalls.c, trace-record offsets; the common fields are left 0).
 * As built it keeps every event; where a syscall event the syscall
 * programs record has a field filter, the loader puts in its body those
 * filters, dispatched on key (consumer/recorder/filtercode.go). The
 * assembly keeps clang from knowing the result.
 */
#define KC_SYS_REC 64

static __noinline int kc_sys_field_filter(__u32 key, __u8 *data)
{
	int keep;

	asm volatile("%0 = 1" : "=r"(keep) : "r"(key), "r"(data));
	return keep;
}

/*
 * kc_sys_trig_filter returns nonzero when the trigger's condition of
 * syscall event key holds on its record at data (kc_sys_field_filter's
 * layout). As built it always holds; where syscall events the raw path
 * records have triggers with conditions, the loader puts those
 * conditions in its body, dispatched on key (consumer/recorder/
 * trigger.go).
 */
static __noinline int kc_sys_trig_filter(__u32 key, __u8 *data)
{
	int hit;

	asm volatile("%0 = 1" : "=r"(hit) : "r"(key), "r"(data));
	return hit;
}

/*
 * kc_sys_build writes at rec the record of syscall event nr (its
 * arguments in regs or a on entry, ret on exit) as the kernel lays it
 * out, KC_SYS_REC bytes, 8-byte aligned as the kernel's is.
 */
static __always_inline void kc_sys_build(__u64 *rec, struct pt_regs *regs, const struct kc_sys_args *a, long nr, __u32 exit, long ret)
{
	int i;

	/* Every word written once: no zeroing first on the hot path. */
	rec[0] = 0;
	rec[1] = (__u32)nr;
	if (exit) {
		rec[2] = ret;
#pragma unroll
		for (i = 3; i < KC_SYS_REC / 8; i++)
			rec[i] = 0;
	} else {
		rec[2] = kc_sys_arg(regs, a, 0);
		rec[3] = kc_sys_arg(regs, a, 1);
		rec[4] = kc_sys_arg(regs, a, 2);
		rec[5] = kc_sys_arg(regs, a, 3);
		rec[6] = kc_sys_arg(regs, a, 4);
		rec[7] = kc_sys_arg(regs, a, 5);
	}
}

/*
 * kc_sys_fields_pass returns whether syscall event key (number nr, its
 * arguments in regs or a on entry, ret on exit) passes its field filter,
 * and counts it in kc_filter_kept if it does. It builds the record on the
 * stack before any ring space is reserved: a rejected event costs no
 * reservation.
 */
static __always_inline int kc_sys_fields_pass(struct pt_regs *regs, const struct kc_sys_args *a, __u32 key, long nr, __u32 exit, long ret)
{
	__u64 rec[KC_SYS_REC / 8];

	kc_sys_build(rec, regs, a, nr, exit, ret);
	if (!kc_sys_field_filter(key, (__u8 *)rec))
		return 0;
	kc_fields_count(key);
	return 1;
}

/*
 * kc_sys_trig_pass is kc_sys_fields_pass for a syscall event with a
 * trigger (its slot plus one, kc/trigger.h), which the raw path
 * evaluates with the gate open or, for a start trigger, closed: it
 * returns whether the event is to be recorded (it passes its field
 * filter, when filtered, and the gate is open after the trigger's
 * action), and in *tp the trigger when it acted.
 */
static __always_inline int kc_sys_trig_pass(struct pt_regs *regs, const struct kc_sys_args *a, __u32 key, long nr, __u32 exit, long ret, __u32 filtered, __u32 trig, struct kc_trig **tp)
{
	__u64 rec[KC_SYS_REC / 8];
	struct kc_trig *t;

	*tp = NULL;
	kc_sys_build(rec, regs, a, nr, exit, ret);
	if (filtered) {
		if (!kc_sys_field_filter(key, (__u8 *)rec))
			return 0;
		kc_fields_count(key);
	}
	t = kc_trig_find(trig);
	if (t && kc_sys_trig_filter(key, (__u8 *)rec))
		*tp = kc_trig_act(t);
	/* Closed, unless a start trigger opened it or this stop trigger's event closed it. */
	return *tp || kc_running;
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
 * filters pass (its field filter too when filtered is set); id and tsize
 * are the event's kc_tp_info.id and .size. With trig (a trigger's slot
 * plus one) it decides the trigger on the event first (kc_sys_trig_pass).
 * The record is built in place in the ring, with no copy through the
 * stack. Its callers can nest with kc_tracepoint on one CPU
 * (a raw tracepoint or trampoline guards only against its own program,
 * kernel/trace/bpf_trace.c:__bpf_trace_run) and run preemptibly on
 * kernels with faultable syscall tracepoints, so it counts with atomic
 * adds.
 */
static __always_inline void kc_sys_emit(struct pt_regs *regs, const struct kc_sys_args *a, __u32 key, __u16 id, __u32 tsize, long nr, __u32 exit, long ret, __s32 pid, __u32 filtered, __u32 trig)
{
	struct kc_sys_rec *r = NULL;
	struct kc_trig *t = NULL;
	struct kc_cpu_state *st;
	__u32 cpu, size;
	struct kc_resv res = {};
	void *ring;
	__u64 ts;

	if (!kc_pass())
		return;
	if (trig) {
		if (!kc_sys_trig_pass(regs, a, key, nr, exit, ret, filtered, trig, &t))
			return;
	} else if (filtered && !kc_sys_fields_pass(regs, a, key, nr, exit, ret)) {
		return;
	}
	st = kc_cpu_ring(&cpu, &ring);
	if (!st) {
		if (t)
			kc_trig_done(t, trig, 0);
		return;
	}
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
		if (t)
			kc_trig_done(t, trig, 0);
		return;
	}
	kc_put_entry(kc_pkt_on ? (void *)r : (void *)r->data, id, pid);
	ts = kc_submit(ring, &r->hdr, st, key, size, cpu, &res, 1, 0);
	if (t)
		kc_trig_done(t, trig, ts);
}
#endif

#endif /* KC_SYSCALL_H */
