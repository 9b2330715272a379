/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/reserve.h: writing a record in place in this CPU's ring, without a
 * scratch copy (kc_cpu_ring, kc_reserve or kc_reserve_pkt, kc_submit), for
 * the programs that know their record's size: the small tracepoint path,
 * the syscall families, the BTF sched events. BPF ring buffers only.
 */
#ifndef KC_RESERVE_H
#define KC_RESERVE_H

#include "kc/emit.h"

#ifndef KC_PERF
/*
 * kc_cpu_ring returns this CPU's state, with its number in *cpu and, for
 * the BPF ring buffer transport, the ring it writes into in *ring; or NULL
 * when this CPU's buffer is stopped. A kc_area ring needs no ring buffer
 * to write (*ring is NULL then): kc_area_wake looks up its doorbell when
 * it rings it.
 */
static __always_inline struct kc_cpu_state *kc_cpu_ring(__u32 *cpu, void **ring)
{
	struct kc_cpu_state *st;
	__u32 idx;

	*ring = NULL;
	*cpu = bpf_get_smp_processor_id();
	st = bpf_map_lookup_elem(&kc_state, cpu);
	if (!st || st->disabled)
		return NULL;
	if (kc_area_on)
		return st;
	idx = kc_global ? 0 : *cpu;
	*ring = bpf_map_lookup_elem(&kc_rings, &idx);
	return *ring ? st : NULL;
}

/*
 * struct kc_resv is a reservation of kc_reserve: its size, and with
 * kc_area its position and its timestamp, taken in the reservation.
 */
struct kc_resv {
	__u64 pos;
	__u64 ts;
	__u32 size;
	struct kc_pkt pkt; /* packet mode's */
};

/*
 * kc_reserve reserves a ring record of size bytes (a constant of the
 * caller), struct kc_rec included, in this CPU's ring: the BPF ring
 * buffer ring, or its kc_area ring, whose positions are in st (and which
 * stamps the record as it reserves it, kc_area_reserve). It returns NULL
 * when the ring is full, and the reservation in *res.
 */
static __always_inline struct kc_rec *kc_reserve(void *ring, struct kc_cpu_state *st, __u32 cpu, __u32 size, struct kc_resv *res)
{
	__u64 *h;

	res->size = size;
	if (!kc_area_on)
		return bpf_ringbuf_reserve(ring, size, 0);
	if (kc_pkt_on)
		return NULL; /* kc_reserve_pkt's */
	h = kc_area_reserve(cpu, st, size, KC_AREA_HDR + ((size + 7) & ~7), &res->pos, &res->ts);
	return h ? (void *)(h + 1) : NULL;
}

/*
 * kc_reserve_pkt is kc_reserve in packet mode (kc_pkt_on): it reserves the
 * event of key with len payload bytes, at most max - KC_EVH_EXT (a
 * constant), and returns the event's payload as the struct kc_rec pointer
 * the callers pass around, or NULL when the ring is full. There is no
 * struct kc_rec in a packet: kc_submit writes none in packet mode, the
 * callers find the payload with kc_rec_data, and no byte past len may
 * be written. (A pointer before the payload, for r + 1 to reach it, may
 * point before the element, which Linux 7.x's verifier refuses.)
 */
static __always_inline struct kc_rec *kc_reserve_pkt(struct kc_cpu_state *st, __u32 cpu, __u32 key, __u32 len, __u32 max, struct kc_resv *res)
{
	return kc_pkt_reserve(cpu, st, key, len, max, &res->pkt);
}

/* kc_rec_data returns the payload of r, a reservation of kc_reserve or kc_reserve_pkt. */
#define kc_rec_data(r) (kc_pkt_on ? (void *)(r) : (void *)((r) + 1))

/*
 * kc_submit stamps r, reserved by kc_reserve as res (with the time taken
 * in a kc_area reservation, else now), as a record of len
 * payload bytes of event key from cpu, submits it and counts it in st,
 * with atomic adds for programs that can run preemptibly or nest with
 * another of ours on the CPU (raw and BTF tracepoints, trampolines). own
 * marks a record of the consumer's own that another task writes
 * (kc_wakeup_flags). It returns the timestamp.
 */
static __always_inline __u64 kc_submit(void *ring, struct kc_rec *r, struct kc_cpu_state *st, __u32 key, __u32 len, __u32 cpu, struct kc_resv *res, int atomic, int own)
{
	__u64 ts;

	if (kc_pkt_on) {
		kc_pkt_commit(&res->pkt);
		kc_area_wake(kc_global ? 0 : cpu, st, st, res->pkt.end, atomic, own);
		return res->pkt.ts;
	}
	r->key = key;
	r->len = len;
	r->cpu = cpu;
	ts = kc_area_on ? res->ts : kc_now();
	r->ts = ts;
	if (kc_area_on) {
		/* The consumer counts the records it reads: no atomic here. */
		kc_area_commit((__u64 *)r - 1, res->pos, res->size);
		kc_area_wake(kc_global ? 0 : cpu, st, st, res->pos + KC_AREA_HDR + ((res->size + 7) & ~7), atomic, own);
		return ts;
	}
	bpf_ringbuf_submit(r, kc_wakeup_flags(ring, 0, st, atomic, 1, own));
	if (atomic)
		__sync_fetch_and_add(&st->emitted, 1);
	else
		st->emitted++;
	return ts;
}
#endif

#endif /* KC_RESERVE_H */
