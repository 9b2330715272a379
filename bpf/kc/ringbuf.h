/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/ringbuf.h: the BPF ring buffer transport (5.8+, the default): one
 * ring per CPU in kc_rings (or one shared ring, kc_global), and the
 * wakeups of the sleeping consumer, by a watermark rather than at every
 * record.
 */
#ifndef KC_RINGBUF_H
#define KC_RINGBUF_H

#include "kc/core.h"

#ifndef KC_PERF
struct kc_ringbuf {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096); /* replaced by the consumer's ring size */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1); /* set to the number of possible CPUs at load */
	__type(key, __u32);
	__array(values, struct kc_ringbuf);
} kc_rings SEC(".maps");

/*
 * kc_wakeup_flags returns the submit flags for the caller's record:
 * wake the consumer once it has drained and gone to sleep (armed) and the
 * unread data reaches the watermark (KC_ARM_FILL), or, when it asked for
 * it (KC_ARM_DATA), at the first record of a process other than its own;
 * one wakeup per sleep and never one per record (by default the kernel
 * wakes on every record written into a ring the consumer had caught up
 * with, kernel/bpf/ringbuf.c: bpf_ringbuf_commit). A consumer awake
 * costs one load and branch per record.
 *
 * Asking the ring for its fill is a helper call, which costs as much as
 * a tenth of a small record's recording; sampled callers, whose records
 * are at most KC_SAMPLED_MAX bytes, ask only when the low bits
 * kc_wakeup_mask of the slot's record count are clear. The loader sizes
 * the mask so that the records passed over fit well within the ring's
 * room above the watermark.
 *
 * pending is what the caller's record will add to the unread data: 0
 * once it is reserved (the producer position covers it), its size and
 * the ring's 8-byte header for bpf_ringbuf_output. Forcing a wakeup
 * disarms the slot; a caller whose record then fails to go out must
 * hand the wakeup back with kc_wakeup_unused, or the sleeping drainer
 * would sleep on.
 *
 * own marks a record that is the consumer's although another task writes
 * it: the switch into one of its threads (written by the task switched
 * out, often the idle task), the wakeup of one (written by the waker, an
 * interrupt among them). Such a record never wakes the consumer for its
 * data: counted as another process's, the switch that brings the drainer
 * back from a sleep armed for data would wake it again, each drain
 * feeding the next (with --latency, a drain each latency period on an
 * idle machine, 7,000 of the recorder's own switches in 5 s).
 */
/* kc_wake_taken disarms st for a wakeup the caller is about to force, and counts it. */
static __always_inline void kc_wake_taken(struct kc_cpu_state *st, int atomic)
{
	/* Racing writers may both wake it: one spare wakeup, no harm. */
	st->armed = 0;
	st->woke_at = bpf_ktime_get_ns();
	if (atomic)
		__sync_fetch_and_add(&st->wakeups, 1);
	else
		st->wakeups++;
}

static __always_inline __u64 kc_wakeup_flags(void *ring, __u64 pending, struct kc_cpu_state *st, int atomic, int sampled, int own)
{
	__u32 armed = st->armed;

	if (!armed)
		return BPF_RB_NO_WAKEUP;
	if ((armed & KC_ARM_DATA) && !own && (__u32)(bpf_get_current_pid_tgid() >> 32) != kc_self_tgid)
		goto wake;
	if (!(armed & KC_ARM_FILL))
		return BPF_RB_NO_WAKEUP;
	if (sampled && (st->emitted & kc_wakeup_mask))
		return BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA) + pending < kc_wakeup_bytes)
		return BPF_RB_NO_WAKEUP;
wake:
	kc_wake_taken(st, atomic);
	return BPF_RB_FORCE_WAKEUP;
}

/* kc_wakeup_unused re-arms st after a record given flags failed to go out. */
static __always_inline void kc_wakeup_unused(struct kc_cpu_state *st, __u64 flags, int atomic)
{
	if (flags != BPF_RB_FORCE_WAKEUP)
		return;
	st->armed = KC_ARM_FILL;
	if (atomic)
		__sync_fetch_and_add(&st->wakeups, -1);
	else
		st->wakeups--;
}
#endif

#endif /* KC_RINGBUF_H */
