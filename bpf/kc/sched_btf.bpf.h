/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/sched_btf.bpf.h: BTF sched events: sched_switch, sched_waking,
 * sched_wakeup, sched_wakeup_new and task_rename from their BTF
 * tracepoints (kc_btf_*).
 */
#ifndef KC_SCHED_BTF_BPF_H
#define KC_SCHED_BTF_BPF_H

#include "filter.h"
#include "kc/event.h"
#include "kc/fields.h"
#include "kc/reserve.h"
#include <bpf/bpf_core_read.h>

#ifndef KC_PERF
/*
 * sched:sched_switch from its BTF tracepoint (tp_btf): the program reads
 * the arguments the kernel passes the tracepoint and builds the record
 * TP_fast_assign builds (include/trace/events/sched.h), 64 bytes on every
 * kernel since 4.x (the consumer checks the format before it attaches
 * this). It skips the perf trace record the classic tracepoint builds
 * for BPF, and perf's bpf_prog_active guard (kernel/trace/bpf_trace.c:
 * trace_call_bpf), which drops the event whenever any other BPF program
 * of that kind holds the CPU: a tp_btf program guards only against
 * itself (__bpf_trace_run).
 */

/* sched_switch's event key and trace event id (common_type); set before load. */
const volatile __u32 kc_switch_key = 0;
const volatile __u32 kc_switch_id = 0;

/*
 * Set when the tracepoint passes prev_state as its 4th argument (5.18+,
 * commit fa2c3254d7cf, moved last by 9c2136be0878); before, the state is
 * read from the task.
 */
const volatile __u32 kc_switch_state_arg = 0;

/* task_struct before 5.14 (2f064a59a11f renamed state to __state). */
struct task_struct___kc_old {
	long state;
} __attribute__((preserve_access_index));

/*
 * kc_switch_state returns the prev_state field as __trace_sched_switch_state
 * computes it: TASK_REPORT_MAX (0x100) when preempted, else the highest bit
 * of the reported state (TASK_REPORT, 0x7f), TASK_REPORT_IDLE (0x80) for
 * TASK_IDLE, and TASK_UNINTERRUPTIBLE for TASK_RTLOCK_WAIT or TASK_FROZEN
 * (5.18+, include/linux/sched.h:__task_state_index; the masked idle test
 * and TASK_FROZEN since 6.6 and 6.13, backported to 6.1.123 and 6.12.8).
 */
static __always_inline long kc_switch_state(__u64 *ctx, struct task_struct *prev)
{
	__u32 st, r;

	if (ctx[0])
		return 0x100;
	if (kc_switch_state_arg) {
		st = ctx[3];
		r = (st | prev->exit_state) & 0x7f;
		if ((st & 0x402) == 0x402)
			r = 0x80;
		if (st & (0x1000 | 0x8000))
			r = 2;
	} else {
		st = BPF_CORE_READ((struct task_struct___kc_old *)prev, state);
		r = (st | prev->exit_state) & 0x7f;
		if (st == 0x402)
			r = 0x80;
	}
	/* The highest set bit of r, or 0 (fls, then 1 << (idx - 1)). */
	r |= r >> 1;
	r |= r >> 2;
	r |= r >> 4;
	return r - (r >> 1);
}

/*
 * kc_put_comm copies a task's 16-byte comm as the kernel's memcpy does,
 * bytes after the NUL included.
 */
#define kc_put_comm(d, off, t)                                                    \
	({                                                                        \
		kc_put(__u64, d, off, *(__u64 *)&(t)->comm[0]);                   \
		kc_put(__u64, d, (off) + 8, *(__u64 *)&(t)->comm[8]);             \
	})

/*
 * A BTF program's record: kc_btf_gate passes the gate and the task
 * filters, kc_btf_begin reserves the record. With a field filter
 * (kc_filter_on), the program first builds the record on the stack at
 * its trace-record offsets, shifted by 4 bytes where that aligns its
 * 8-byte stores (task_rename with pid, kc_btf_shift: the verifier takes
 * only aligned stack accesses), runs the filter on it, and copies it into
 * the reservation only if it passes (kc_btf_copy): a rejected event
 * reserves nothing. Without one it builds the record in place, at the
 * ring record's offsets (KC_CUT less), with the same fill function.
 */

/* Bytes of the stack record: sched_switch's 64 and a shift's 4, rounded up. */
#define KC_BTF_REC 72

/*
 * kc_btf_gate returns whether event key is to be recorded now: recording
 * on, the task filters passed, and this program copy the generation that
 * records key (kc_gen_ok: a change of filter loads a new copy).
 */
static __always_inline int kc_btf_gate(__u32 key)
{
	struct kc_tp_info *info;

	if (!kc_running)
		return 0;
	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	return info && kc_gen_ok(info) && kc_pass();
}

/*
 * kc_btf_begin reserves a record of size payload bytes (a constant) in
 * this CPU's ring for a BTF program's event key, which kc_btf_gate
 * passed. It returns the record, with the ring (as kc_cpu_ring gives it),
 * this CPU and its state in *ring, *cpu and *st, or NULL when there is
 * none to write (a full ring's record counted as lost).
 */
static __always_inline struct kc_rec *kc_btf_begin(__u32 size, __u32 key, __u32 len, void **ring, __u32 *cpu, struct kc_cpu_state **st, struct kc_resv *res)
{
	struct kc_rec *r;

	*st = kc_cpu_ring(cpu, ring);
	if (!*st)
		return NULL;
	if (kc_pkt_on)
		r = kc_reserve_pkt(*st, *cpu, key, len, KC_EVH_EXT + size, res);
	else
		r = kc_reserve(*ring, *st, *cpu, sizeof(*r) + size, res);
	if (!r)
		__sync_fetch_and_add(&(*st)->lost, 1);
	return r;
}

/*
 * kc_btf_copy copies the record a BTF program built at rec (trace-record
 * offsets plus shift, a constant 0 or 4; size bytes, a multiple of 4 and
 * a constant) past its common fields to d, a ring record's payload.
 */
static __always_inline void kc_btf_copy(void *d, const __u64 *rec, __u32 size, __u32 shift)
{
	const __u32 *w = (const __u32 *)rec;
	int i;

#pragma unroll
	for (i = 2; i < KC_BTF_REC / 4 - 1; i++)
		if (i < size / 4)
			kc_put(__u32, d, 4 * i - KC_CUT, w[i + shift / 4]);
}

/*
 * kc_fill_switch writes sched_switch's fields at d, each cut bytes before
 * its trace-record offset.
 */
static __always_inline void kc_fill_switch(void *d, int cut, __u64 *ctx, struct task_struct *prev, struct task_struct *next)
{
	kc_put_comm(d, 8 - cut, prev);
	kc_put(__s32, d, 24 - cut, prev->pid);
	kc_put(__s32, d, 28 - cut, prev->prio);
	kc_put(__s64, d, 32 - cut, kc_switch_state(ctx, prev));
	kc_put_comm(d, 40 - cut, next);
	kc_put(__s32, d, 56 - cut, next->pid);
	kc_put(__s32, d, 60 - cut, next->prio);
}

SEC("tp_btf/sched_switch")
int kc_btf_switch(__u64 *ctx)
{
	struct task_struct *prev = (void *)ctx[1], *next = (void *)ctx[2];
	__u64 rec[KC_BTF_REC / 8] = {};
	int filtered = kc_filter_on();
	struct kc_cpu_state *st;
	struct kc_rec *r;
	struct kc_resv res = {};
	void *ring, *d;
	__u32 cpu;

	if (!kc_btf_gate(kc_switch_key))
		return 0;
	if (filtered) {
		kc_fill_switch(rec, 0, ctx, prev, next);
		if (!kc_field_filter((__u8 *)rec, 64))
			return 0;
		kc_fields_count(kc_switch_key);
	}
	r = kc_btf_begin(64, kc_switch_key, 64 - KC_CUT, &ring, &cpu, &st, &res);
	if (!r)
		return 0;
	d = kc_rec_data(r);
	if (filtered)
		kc_btf_copy(d, rec, 64, 0);
	else
		kc_fill_switch(d, KC_CUT, ctx, prev, next);
	/* common_pid is current's: the task switched out. */
	kc_put_entry(d, kc_switch_id, prev->pid);
	/*
	 * Atomic adds: a classic tracepoint's program preempted on this CPU
	 * (7.x runs them preemptible) may be between its load and store.
	 */
	/* A switch into one of the consumer's threads is the consumer's own. */
	kc_submit(ring, r, st, kc_switch_key, 64 - KC_CUT, cpu, &res, 1, next->tgid == kc_self_tgid);
	return 0;
}

/*
 * sched:sched_waking, sched_wakeup and sched_wakeup_new from their BTF
 * tracepoints, as kc_btf_switch: the record of sched_wakeup_template
 * (include/trace/events/sched.h): comm, pid, prio, target_cpu, and on
 * older kernels (5.10 among them) a success field, always 1, before
 * target_cpu.
 */

/* Event keys and trace event ids of the three events; set before load. */
const volatile __u32 kc_waking_key = 0, kc_waking_id = 0;
const volatile __u32 kc_wakeup_key = 0, kc_wakeup_id = 0;
const volatile __u32 kc_wakeup_new_key = 0, kc_wakeup_new_id = 0;

/* The record has the success field (40 bytes instead of 36). */
const volatile __u32 kc_wake_success = 0;

/* task_struct before 5.16 (bcf9033e5449 moved cpu into thread_info). */
struct task_struct___kc_cpu {
	unsigned int cpu;
} __attribute__((preserve_access_index));

/* kc_task_cpu returns task_cpu(p). */
static __always_inline __s32 kc_task_cpu(struct task_struct *p)
{
	if (bpf_core_field_exists(p->thread_info.cpu))
		return p->thread_info.cpu;
	return BPF_CORE_READ((struct task_struct___kc_cpu *)p, cpu);
}

/*
 * kc_wake records the wakeup of p as event key with trace event id. It
 * can run with interrupts on (try_to_wake_up of the current task), so
 * it counts with atomic adds.
 */
static __always_inline void kc_fill_wake(void *d, int cut, struct task_struct *p)
{
	kc_put_comm(d, 8 - cut, p);
	kc_put(__s32, d, 24 - cut, p->pid);
	kc_put(__s32, d, 28 - cut, p->prio);
	if (kc_wake_success) {
		kc_put(__s32, d, 32 - cut, 1);
		kc_put(__s32, d, 36 - cut, kc_task_cpu(p));
	} else {
		kc_put(__s32, d, 32 - cut, kc_task_cpu(p));
	}
}

static __always_inline void kc_wake(struct task_struct *p, __u32 key, __u32 id)
{
	__u32 cpu, len = kc_wake_success ? 40 - KC_CUT : 36 - KC_CUT;
	__u64 rec[KC_BTF_REC / 8] = {};
	int filtered = kc_filter_on();
	struct kc_cpu_state *st;
	struct kc_rec *r;
	struct kc_resv res = {};
	void *ring, *d;

	if (!kc_btf_gate(key))
		return;
	if (filtered) {
		kc_fill_wake(rec, 0, p);
		if (!kc_field_filter((__u8 *)rec, 40))
			return;
		kc_fields_count(key);
	}
	r = kc_btf_begin(40, key, len, &ring, &cpu, &st, &res);
	if (!r)
		return;
	d = kc_rec_data(r);
	if (filtered)
		kc_btf_copy(d, rec, 40, 0);
	else
		kc_fill_wake(d, KC_CUT, p);
	/* common_pid is current's: the waker. */
	kc_put_entry(d, id, bpf_get_current_pid_tgid());
	/* The wakeup of one of the consumer's threads is the consumer's own. */
	kc_submit(ring, r, st, key, len, cpu, &res, 1, p->tgid == kc_self_tgid);
}

SEC("tp_btf/sched_waking")
int kc_btf_waking(__u64 *ctx)
{
	kc_wake((void *)ctx[0], kc_waking_key, kc_waking_id);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int kc_btf_wakeup(__u64 *ctx)
{
	kc_wake((void *)ctx[0], kc_wakeup_key, kc_wakeup_id);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int kc_btf_wakeup_new(__u64 *ctx)
{
	kc_wake((void *)ctx[0], kc_wakeup_new_key, kc_wakeup_new_id);
	return 0;
}

/*
 * task:task_rename from its BTF tracepoint, as kc_btf_switch: the record
 * TP_fast_assign builds (include/trace/events/task.h): pid, the old comm
 * (a memcpy of task->comm, still the old name when the tracepoint runs in
 * __set_task_comm), the new one (strlcpy, strscpy from 6.6: the string
 * and its NUL) and task->signal->oom_score_adj. pid is the task renamed,
 * which need not be current (a write to /proc/PID/comm); common_pid is
 * current's. Linux 6.14 to 6.17 had no pid field (e3f6a42272e0, reverted
 * in 7.0 and 6.18.y): kc_rename_pid is 0 there and the fields start at 8.
 */
const volatile __u32 kc_rename_key = 0, kc_rename_id = 0;
const volatile __u32 kc_rename_pid = 1;

/* KC_ONES and KC_HIGHS are 0x01 and 0x80 in every byte of a word. */
#define KC_ONES 0x0101010101010101ULL
#define KC_HIGHS 0x8080808080808080ULL

/*
 * kc_nul_flags returns 0 when the word w holds no NUL byte, else a word
 * whose lowest set bit is bit 7 of w's first NUL byte (Hacker's Delight
 * 6-1: the lowest flag is exact, those above it need not be).
 */
static __always_inline __u64 kc_nul_flags(__u64 w)
{
	return (w - KC_ONES) & ~w & KC_HIGHS;
}

extern void *bpf_rdonly_cast(const void *obj__ign, __u32 btf_id__k) __ksym __weak;

/* Bytes of a page that lie at or above any address's 4 KiB-aligned offset. */
#define KC_PAGE_MIN 4096

/*
 * kc_put_str16 writes at d + off the string at the kernel address src as
 * strscpy into 16 bytes writes it (at most 15 bytes and a NUL), with
 * zeroes after the NUL where the kernel leaves what the buffer held. It
 * reads 16 bytes at once, which costs less than the byte loop of
 * bpf_probe_read_kernel_str, which it falls back to where those 16 bytes
 * are not all readable (a short string before an unmapped page).
 *
 * Where the kernel lets a program load from memory it cannot vouch for
 * (bpf_rdonly_cast to void, Linux 6.17: the JIT turns each load into one
 * that reads 0 where it would fault, kernel/bpf/verifier.c,
 * BPF_FEAT_RDONLY_CAST_TO_VOID), two loads replace the helper call and
 * its page-fault bracket. They do so only where both words lie in the
 * 4 KiB page of the string's first byte, which is mapped: a load cannot
 * fault there, and a 0 read is a 0 held.
 */
static __always_inline void kc_put_str16(void *d, __u32 off, const char *src)
{
	__u64 w[2], z;
	const __u64 *p;

	if (bpf_core_enum_value_exists(enum bpf_features, BPF_FEAT_RDONLY_CAST_TO_VOID) &&
	    ((unsigned long)src & (KC_PAGE_MIN - 1)) <= KC_PAGE_MIN - sizeof(w)) {
		p = bpf_rdonly_cast(src, 0);
		w[0] = p[0];
		w[1] = p[1];
	} else if (bpf_probe_read_kernel(w, sizeof(w), src)) {
		kc_put(__u64, d, off, 0);
		kc_put(__u64, d, off + 8, 0);
		bpf_probe_read_kernel_str(d + off, 16, src);
		return;
	}
	/* Byte 15 is the NUL of a name of 15 bytes or more. */
	w[1] &= ~0ULL >> 8;
	z = kc_nul_flags(w[0]);
	if (z) {
		/* Keep the bytes below the first NUL: (lowest flag >> 7) - 1. */
		w[0] &= ((z & -z) >> 7) - 1;
		w[1] = 0;
	} else {
		z = kc_nul_flags(w[1]);
		w[1] &= ((z & -z) >> 7) - 1;
	}
	kc_put(__u64, d, off, w[0]);
	kc_put(__u64, d, off + 8, w[1]);
}

/*
 * kc_fill_rename writes task_rename's fields at d, each cut bytes before
 * its trace-record offset (a negative cut: after).
 */
static __always_inline void kc_fill_rename(void *d, int cut, struct task_struct *task, const char *comm)
{
	__u32 at = (kc_rename_pid ? 12 : 8) - cut;

	if (kc_rename_pid)
		kc_put(__s32, d, 8 - cut, task->pid);
	kc_put_comm(d, at, task);
	kc_put_str16(d, at + 16, comm);
	kc_put(__s16, d, at + 32, task->signal->oom_score_adj);
}

SEC("tp_btf/task_rename")
int kc_btf_rename(__u64 *ctx)
{
	struct task_struct *task = (void *)ctx[0];
	const char *comm = (void *)ctx[1];
	__u32 cpu, at = kc_rename_pid ? 12 - KC_CUT : 8 - KC_CUT;
	__u64 rec[KC_BTF_REC / 8] = {};
	int filtered = kc_filter_on();
	struct kc_cpu_state *st;
	struct kc_rec *r;
	struct kc_resv res = {};
	void *ring, *d;

	if (!kc_btf_gate(kc_rename_key))
		return 0;
	if (filtered) {
		/* Shifted with pid: the comms at 16 and 32 (kc_btf_shift). */
		kc_fill_rename(rec, kc_rename_pid ? -4 : 0, task, comm);
		if (!kc_field_filter((__u8 *)rec, 48))
			return 0;
		kc_fields_count(kc_rename_key);
	}
	r = kc_btf_begin(48, kc_rename_key, at + 34, &ring, &cpu, &st, &res);
	if (!r)
		return 0;
	d = kc_rec_data(r);
	if (filtered)
		kc_btf_copy(d, rec, 48, kc_rename_pid ? 4 : 0);
	else
		kc_fill_rename(d, KC_CUT, task, comm);
	kc_put_entry(d, kc_rename_id, bpf_get_current_pid_tgid());
	kc_submit(ring, r, st, kc_rename_key, at + 34, cpu, &res, 1, 0);
	return 0;
}
#endif

#endif /* KC_SCHED_BTF_BPF_H */
