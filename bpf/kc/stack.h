/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/stack.h: an event's call chains (kc_stack_tail), written behind its
 * record as the trace holds them: for the kernel's, then the user's, a
 * u32 count and that many u64 return addresses, as LTTng's
 * callstack_kernel and callstack_user contexts (consumer/layout's
 * OpTail reads them back).
 */
#ifndef KC_STACK_H
#define KC_STACK_H

#include "kc/core.h"
#include "kc/event.h"
#include "kc/context.h"

/*
 * The most frames a stack holds: PERF_MAX_STACK_DEPTH
 * (include/uapi/linux/perf_event.h), the default of
 * kernel.perf_event_max_stack, which bpf_get_stack also obeys
 * (kernel/bpf/stackmap.c). One more is asked for, to tell a stack cut at
 * the depth from one that ends there.
 */
#define KC_STACK_MAX 127
#define KC_STACK_BYTES (4 + 8 * (KC_STACK_MAX + 1))

/* Room behind a record for its tail: its contexts and both stacks. */
#define KC_TAIL_ROOM (KC_CTX_ROOM + 2 * KC_STACK_BYTES)
_Static_assert(KC_TAIL_ROOM <= KC_SCRATCH_TAIL, "struct kc_scratch holds the tail");

#define KC_STACK_KERNEL 1 /* kc_tp_info.stack: record the kernel's call chain */
#define KC_STACK_USER 2   /* ... and the user's */
#define KC_STACK_AT_LIMIT 4 /* the depth is the kernel's limit (kernel.perf_event_max_stack) */

/*
 * struct kc_stack_count counts, per CPU, the stacks cut at their depth
 * (truncated) and those the kernel could not give (failed: the event
 * keeps an empty one).
 */
struct kc_stack_count {
	__u64 truncated;
	__u64 failed;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kc_stack_count);
} kc_stack_stats SEC(".maps");

/*
 * kc_ustack_procs holds the processes whose user call chains were
 * recorded, so that the consumer saves the symbols of their files
 * (consumer/usermaps.go, usersave.go). Least recently used first out: a
 * recording of days sees more processes than it holds, and the consumer
 * keeps every one it has read, every few seconds.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} kc_ustack_procs SEC(".maps");

/*
 * kc_note_ustack adds the current process to kc_ustack_procs. A global
 * function, which the verifier checks once, not on every path of its
 * caller's.
 */
__noinline int kc_note_ustack(void)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u8 one = 1;

	if (!bpf_map_lookup_elem(&kc_ustack_procs, &tgid))
		bpf_map_update_elem(&kc_ustack_procs, &tgid, &one, BPF_ANY);
	return 0;
}

/*
 * kc_stack_one writes at d a u32 count and the call chain of ctx's task
 * (flags: 0 for the kernel's, BPF_F_USER_STACK for the user's), at most
 * depth frames, and returns the bytes written. A chain deeper than depth
 * is cut to it and counted in c->truncated (at_limit: one that reaches
 * depth, the kernel's limit, counts too); one the kernel refuses is
 * written empty and counted in c->failed. d has KC_STACK_BYTES of room.
 */
static __always_inline __u32 kc_stack_one(void *ctx, __u8 *d, __u32 depth, int at_limit, __u64 flags, struct kc_stack_count *c)
{
	__u32 ask = depth + 1;
	long n;

	if (ask > KC_STACK_MAX + 1)
		ask = KC_STACK_MAX + 1;
	barrier_var(ask);
	ask &= 0xff;
	n = bpf_get_stack(ctx, d + 4, ask * 8, flags);
	/*
	 * A program always runs in the kernel, so its kernel chain is never
	 * empty where the kernel gives it: an empty one is a failure (the
	 * syscall tracepoints of older kernels hand BPF the user's registers,
	 * kernel/trace/trace_syscalls.c:perf_call_bpf_enter).
	 */
	if (n < 0 || (n == 0 && !(flags & BPF_F_USER_STACK) && depth)) {
		if (c)
			c->failed++;
		n = 0;
	}
	n /= 8;
	if (n > depth) {
		n = depth;
		if (c)
			c->truncated++;
	} else if (n == depth && at_limit) {
		/* At the kernel's own limit a deeper chain is cut unseen. */
		if (c)
			c->truncated++;
	}
	*(__u32 *)d = n;
	return 4 + 8 * (n & 0xff);
}

/*
 * kc_tail writes behind the record at data, len payload bytes in a buffer
 * with KC_TAIL_ROOM bytes of room past KC_MAX_PAYLOAD, the contexts
 * (kc_context) and the call chains info asks for, and returns their
 * bytes, 0 for none. A record too long to carry the chains within
 * KC_MAX_PAYLOAD keeps empty ones, each counted as failed.
 */
static __always_inline __u32 kc_tail(void *ctx, __u8 *data, __u32 len, struct kc_tp_info *info, const int probe)
{
	__u32 zero = 0, depth = info->stack_depth, ct = 0, ks = 0, us = 0, need = 0;
	int at_limit = info->stack & KC_STACK_AT_LIMIT;
	struct kc_stack_count *c;

	if (!info->stack && !info->ctx)
		return 0;
	if (len > KC_MAX_PAYLOAD - 1 - KC_CTX_ROOM)
		return 0; /* no room for a tail: the consumer counts the record undecodable */
	barrier_var(len);
	len &= KC_PAYLOAD_MASK;
	if (info->ctx) {
		/* data is the scratch record's, where kc_context writes. */
		ct = probe ? kc_context_probe(len, info->ctx) : kc_context(len, info->ctx);
		if (ct > KC_CTX_ROOM)
			return 0;
		barrier_var(ct);
		len += ct;
	}
	if (!info->stack)
		return ct;
	c = bpf_map_lookup_elem(&kc_stack_stats, &zero);
	if (info->stack & KC_STACK_KERNEL)
		need += 4 + 8 * depth;
	if (info->stack & KC_STACK_USER)
		need += 4 + 8 * depth;
	if (len + need > KC_MAX_PAYLOAD - 1) {
		depth = 0;
		if (c)
			c->failed += (info->stack & KC_STACK_KERNEL ? 1 : 0) + (info->stack & KC_STACK_USER ? 1 : 0);
		c = NULL; /* counted once */
	}
	if (len > KC_MAX_PAYLOAD - 1)
		return 0;
	barrier_var(len);
	len &= KC_PAYLOAD_MASK;
	if (info->stack & KC_STACK_KERNEL) {
		ks = kc_stack_one(ctx, data + len, depth, at_limit, 0, c);
		if (ks > KC_STACK_BYTES)
			return 0;
		barrier_var(ks);
	}
	if (info->stack & KC_STACK_USER) {
		us = kc_stack_one(ctx, data + len + ks, depth, at_limit, BPF_F_USER_STACK, c);
		kc_note_ustack();
	}
	return ct + ks + us;
}

#endif /* KC_STACK_H */
