/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/tracepoint.bpf.h: classic tracepoints, the generic recorder
 * (kc_tracepoint). It copies the whole trace record, the dynamic area
 * behind __data_loc/__rel_loc fields included, into the ring, and runs
 * the hooks of synthetic:wakeup_latency.
 *
 * The record cannot tell which event it is: before BPF runs, the kernel
 * overwrites its first 8 bytes, the common fields, with a pt_regs pointer
 * (kernel/trace/trace_event_perf.c:perf_trace_run_bpf_submit, and
 * kernel/trace/trace_syscalls.c:perf_call_bpf_enter for syscalls). So each
 * attachment carries its event's key: the attach cookie on Linux 5.15+, or
 * on older kernels a copy of the program per event whose key constant the
 * loader patches (KC_KEY_PLACEHOLDER).
 */
#ifndef KC_TRACEPOINT_BPF_H
#define KC_TRACEPOINT_BPF_H

#include "filter.h"
#include "kc/event.h"
#include "kc/wakeup.h"
#include "kc/record.h"
#include "kc/sys_user.h"
#include "kc/reserve.h"
#include "kc/fields.h"
#ifndef KC_PERF
#include "kc/trigger.h"
#endif

/*
 * kc_record writes the trace record at ctx as event key and returns its
 * timestamp, or 0 when the gate is closed for this CPU or the record was
 * lost. In packet mode a record that is not its payload as it is (one
 * with steps, kc_tp_info.nops) is built into a kc_ctf first. With trig
 * (a trigger's slot plus one, kc/trigger.h) it evaluates the trigger on
 * the record its field filter kept, with the gate open or, for a start
 * trigger, closed.
 */
static __always_inline __u64 kc_record(void *ctx, __u32 key, struct kc_tp_info *info, __u32 trig)
{
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	__u32 size, tail;
	int i;
#ifndef KC_PERF
	struct kc_trig *t = NULL;
	__u64 ts;
#endif

	if (info->size < 8)
		return 0; /* not a trace record: the loader never sets one */
#ifndef KC_PERF
	s = trig ? kc_emit_scratch(key, &st) : kc_emit_begin(key, &st);
#else
	s = kc_emit_begin(key, &st);
#endif
	if (!s)
		return 0;
#ifndef KC_PERF
	if (kc_sys_user_on && (info->flags & KC_TP_SYSUSER)) {
		/* The context holds the number and the arguments, nothing after them. */
		size = info->user_loc;
		if (size < 16 || size > 16 + 8 * 6)
			return 0;
		bpf_probe_read_kernel(s->data + KC_ENTRY_SIZE, size - 8, ctx + 8);
		size = kc_sys_user(s->data, info);
		if (size < 16)
			return 0;
		size -= 8;
		goto copied;
	}
#endif
	size = info->size;
#pragma unroll
	for (i = 0; i < KC_MAX_DYN; i++) {
		__u32 loc = 0, off, end;

		if (i >= info->ndyn)
			break;
		off = info->dyn[i] & ~KC_DYN_REL;
		bpf_probe_read_kernel(&loc, sizeof(loc), ctx + off);
		end = (loc & 0xffff) + (loc >> 16);
		if (info->dyn[i] & KC_DYN_REL)
			end += off + sizeof(loc);
		if (end > size)
			size = end;
	}
	/*
	 * The record past its common fields goes behind the ring record's
	 * entry. Trace records never exceed PERF_MAX_TRACE_SIZE. The barrier
	 * keeps clang from dropping the mask the verifier needs as a bound.
	 */
	size -= 8;
	if (size > KC_MAX_PAYLOAD - 8)
		size = KC_MAX_PAYLOAD - 8;
	barrier_var(size);
	size &= KC_PAYLOAD_MASK;
	bpf_probe_read_kernel(s->data + KC_ENTRY_SIZE, size, ctx + 8);
#ifndef KC_PERF
copied:
	if (!kc_fields_pass(key, s->data, KC_ENTRY_SIZE + size))
		return 0;
	if (trig) {
		t = kc_trig_check(trig, s->data, KC_ENTRY_SIZE + size);
		/* Closed, unless a start trigger opened it or this stop trigger's event closed it. */
		if (!t && !kc_running)
			return 0;
	}
	tail = kc_tail(ctx, s->data, KC_ENTRY_SIZE + size, info, 0);
	ts = kc_record_end(ctx, s, &kc_ctf_map, 0, st, key, info, size, tail, 0);
	if (t)
		kc_trig_done(t, trig, ts);
	return ts;
#else
	if (!kc_fields_pass(key, s->data, KC_ENTRY_SIZE + size))
		return 0;
	tail = kc_tail(ctx, s->data, KC_ENTRY_SIZE + size, info, 0);
	return kc_record_end(ctx, s, NULL, 0, st, key, info, size, tail, 0);
#endif
}

#ifndef KC_PERF
/* Largest record kc_record_small writes: 16 words, 128 bytes. */
#define KC_SMALL_MAX 128

/*
 * The loader replaces this immediate by the record size of the events a
 * program copy records with kc_record_small, or 0 for the general path.
 */
#define KC_SIZE_PLACEHOLDER 0x6b6353495aULL

static __always_inline __u32 kc_small_size(void)
{
	__u64 size;

	asm volatile("%0 = 0x6b6353495a ll" : "=r"(size));
	return size;
}

/*
 * kc_ld copies the T at offset off (8 or more) of the trace record at ctx
 * to its place in the ring record at dst, KC_CUT bytes before. Tracepoint programs may load their context directly, at
 * constant offsets from 8 (the first word holds a pt_regs pointer by now),
 * but perf refuses to attach a program whose loads reach past the event's
 * last field (kernel/events/core.c:perf_event_set_bpf_prog,
 * max_ctx_offset), so a copy loads the record's exact size. The load is
 * written in assembly because the verifier refuses a context pointer moved
 * by arithmetic, which clang would otherwise share between loads.
 */
#define kc_ld(dst, ctx, T, off)                                                   \
	({                                                                        \
		T _v;                                                             \
		asm volatile("%0 = *(" #T " *)(%1 + %2)" : "=r"(_v) : "r"(ctx), "i"(off)); \
		kc_put(T, dst, (off) - KC_CUT, _v);                               \
	})

/*
 * kc_word copies the bytes of word k (k ≥ 1) that lie below size, a
 * multiple of 2 (the loader uses this path only for such sizes): a u64,
 * or the u32 and u16 that the record's tail covers (task_rename ends with
 * a short at 44).
 */
#define kc_word(dst, ctx, size, k)                                                \
	({                                                                        \
		if ((size) >= 8 * (k) + 8) {                                      \
			kc_ld(dst, ctx, u64, 8 * (k));                            \
		} else {                                                          \
			if ((size) >= 8 * (k) + 4)                                \
				kc_ld(dst, ctx, u32, 8 * (k));                    \
			if ((size) == 8 * (k) + 6)                                \
				kc_ld(dst, ctx, u16, 8 * (k) + 4);                \
			else if ((size) == 8 * (k) + 2)                           \
				kc_ld(dst, ctx, u16, 8 * (k));                    \
		}                                                                 \
	})

#define KC_RESERVE(n)                                                             \
	case n:                                                                   \
		r = kc_reserve(ring, st, cpu, sizeof(struct kc_rec) + 8 * (n), &res); \
		break;

/*
 * kc_record_small writes the trace record at ctx, size bytes without
 * dynamic fields (a multiple of 2, at most KC_SMALL_MAX), straight into this CPU's ring as
 * event key (as a ring record, KC_CUT bytes shorter), and returns its timestamp, or 0 when this CPU's buffer is
 * stopped or the ring is full (then counted as lost). size is a constant
 * of the program copy (kc_small_size), so the verifier keeps only the
 * loads and the one bpf_ringbuf_reserve (which takes only a constant
 * size) of that size; the ring record is padded to whole words and
 * kc_rec.len holds the true size. This saves the scratch copy,
 * bpf_probe_read_kernel and the second copy of bpf_ringbuf_output for the
 * common events: syscalls, sched_switch, irqs.
 */
static __always_inline __u64 kc_record_small(void *ctx, __u32 key, struct kc_tp_info *info, __u32 size)
{
	struct kc_cpu_state *st;
	struct kc_rec *r = NULL;
	struct kc_resv res = {};
	void *ring, *d;
	__u32 cpu;

	st = kc_cpu_ring(&cpu, &ring);
	if (!st)
		return 0;
	if (kc_pkt_on) {
		r = kc_reserve_pkt(st, cpu, key, size - KC_CUT, KC_EVH_EXT + KC_SMALL_MAX, &res);
		goto reserved;
	}
	switch ((size - KC_CUT + 7) / 8) {
	KC_RESERVE(1)
	KC_RESERVE(2)
	KC_RESERVE(3)
	KC_RESERVE(4)
	KC_RESERVE(5)
	KC_RESERVE(6)
	KC_RESERVE(7)
	KC_RESERVE(8)
	KC_RESERVE(9)
	KC_RESERVE(10)
	KC_RESERVE(11)
	KC_RESERVE(12)
	KC_RESERVE(13)
	KC_RESERVE(14)
	KC_RESERVE(15)
	KC_RESERVE(16)
	}
reserved:
	if (!r) {
		st->lost++;
		return 0;
	}
	d = kc_rec_data(r);
	kc_word(d, ctx, size, 1);
	kc_word(d, ctx, size, 2);
	kc_word(d, ctx, size, 3);
	kc_word(d, ctx, size, 4);
	kc_word(d, ctx, size, 5);
	kc_word(d, ctx, size, 6);
	kc_word(d, ctx, size, 7);
	kc_word(d, ctx, size, 8);
	kc_word(d, ctx, size, 9);
	kc_word(d, ctx, size, 10);
	kc_word(d, ctx, size, 11);
	kc_word(d, ctx, size, 12);
	kc_word(d, ctx, size, 13);
	kc_word(d, ctx, size, 14);
	kc_word(d, ctx, size, 15);
	kc_put_entry(d, info->id, bpf_get_current_pid_tgid());
	return kc_submit(ring, r, st, key, size - KC_CUT, cpu, &res, 0, 0);
}
#endif

SEC("tracepoint")
int kc_tracepoint(void *ctx)
{
	struct kc_tp_info *info;
	__u64 ts = 0;
	__u32 key, trig = 0;

#ifndef KC_PERF
	trig = kc_trig_slot();
#endif
	/* A copy with a trigger looks at its events with the gate closed too. */
	if (!kc_running && !trig)
		return 0;
	/* Without hooks a filtered-out task costs no map lookup. */
	if (!kc_hooks && !kc_pass())
		return 0;
	key = kc_event_key(ctx);
	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	if (!info)
		return 0;
	if ((info->flags & KC_TP_RECORD) && kc_gen_ok(info) && (!kc_hooks || kc_pass())) {
#ifndef KC_PERF
		__u32 small = kc_small_size();

		if (small >= 8 && small <= KC_SMALL_MAX && !(small & 1) && small == info->size && !info->stack && !info->ctx && !trig)
			ts = kc_record_small(ctx, key, info, small);
		else
#endif
			ts = kc_record(ctx, key, info, trig);
	}
	if (kc_hooks && kc_running && (info->flags & (KC_TP_WAKING | KC_TP_SWITCH)))
		kc_wakeup(ctx, info, ts ? ts : kc_now());
	return 0;
}

/*
 * kc_set_epoch sets this CPU's epoch of filter changes (kc_epoch) to its
 * argument; the consumer runs it on each CPU in turn with
 * BPF_PROG_TEST_RUN. It cannot run between two programs of one firing
 * on its CPU.
 */
SEC("raw_tp")
int kc_set_epoch(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0, *e = bpf_map_lookup_elem(&kc_epoch, &zero);

	if (!e)
		return 1;
	*e = ctx->args[0];
	return 0;
}

#endif /* KC_TRACEPOINT_BPF_H */
