/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/area.h: the recorder's own rings (kc_area), written with a
 * compare-and-swap and read in place by the consumer, whose BPF ring
 * buffers (kc/ringbuf.h) then only ring its doorbell.
 */
#ifndef KC_AREA_H
#define KC_AREA_H

#include "kc/ringbuf.h"

#ifndef KC_PERF
/*
 * kc_area holds the recorder's own rings, when the loader sets kc_area_on
 * (x86_64, 5.12+ for BPF_CMPXCHG): one ring per CPU of kc_area_kmask + 1
 * elements of kc_area_esize bytes, adjacent in the map's memory, which the
 * consumer maps and reads in place. A BPF ring buffer takes a spinlock
 * with interrupts off for every reservation and another atomic for every
 * commit (kernel/bpf/ringbuf.c); here a record costs one compare-and-swap
 * of the ring's producer position, kept in the ring's kc_state slot with
 * the consumer position, which is also the fill to wake the consumer at.
 *
 * A record is an 8-byte header, then its payload, padded to 8 bytes: the
 * header holds the payload length (bits 0-29; KC_AREA_DISC marks padding
 * to skip) and, in the upper word, the lap of the ring the record was
 * written in plus one, (position >> kc_area_lshift) + 1, so that the
 * zeroes of memory never written are no record of the first lap. It is
 * stored last: on x86 the stores before it are seen first (TSO), so a
 * header with the ring's lap tells the consumer the whole record is
 * written. A record never crosses an element's end, which keeps every
 * store inside the element the verifier knows: a record that would is
 * preceded by padding up to the next element. The BPF ring buffer of the
 * CPU (kc_rings) then only carries the wakeups, a doorbell.
 *
 * Until a record's header is stored, its slot must not look like one: an
 * earlier lap's bytes there may be any word of a payload, a kc_rec's
 * key and length (whose upper half is the payload length on CPU 0) or a
 * syscall argument, and one whose upper half equals the lap would pass
 * for a written record. So the consumer zeroes the space it hands back
 * before it moves the consumer position (consumer/ringbuf.go: release):
 * free space is all zeroes, and a writer stores only inside the space
 * its compare-and-swap won. A writer cannot clear a slot it has not won:
 * a program nesting between its load of the position and its swap may
 * have written a record there.
 */
const volatile __u32 kc_area_on = 0;
const volatile __u64 kc_area_esize = 1 << 16; /* bytes per element: a power of two */
const volatile __u32 kc_area_eshift = 16;     /* log2(kc_area_esize) */
const volatile __u32 kc_area_kmask = 0;       /* elements per ring, less one */
const volatile __u64 kc_area_rsize = 1 << 16; /* bytes per ring */
const volatile __u32 kc_area_lshift = 16;     /* log2(kc_area_rsize) */

#define KC_AREA_HDR 8
#define KC_AREA_DISC (1U << 30) /* as BPF_RINGBUF_DISCARD_BIT */
/* The largest record: a scratch record of kc_output. */
#define KC_AREA_MAX (KC_AREA_HDR + sizeof(struct kc_rec) + KC_MAX_PAYLOAD)
/* Compare-and-swap attempts before a reservation counts as lost: only programs nesting on the CPU race. */
#define KC_AREA_TRIES 3

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 8); /* set to kc_area_esize at load */
	__uint(max_entries, 1); /* set to the CPUs times the elements per ring at load */
} kc_area SEC(".maps");

/* kc_area_lap returns the upper word of a header at position pos. */
static __always_inline __u64 kc_area_lap(__u64 pos)
{
	return ((pos >> kc_area_lshift) + 1) << 32;
}

/*
 * kc_area_reserve reserves a record of size payload bytes, padded to 8,
 * in ring idx, whose positions are in ps; max is a constant bound on
 * KC_AREA_HDR + the padded size, which the verifier needs. It returns the
 * record's header, with its position in *pos and, when ts is not NULL,
 * its timestamp in *ts, or NULL when the ring is full or the reservation
 * lost its races: the caller counts that as lost.
 *
 * The clock is read inside the compare-and-swap loop, after the producer
 * position it swaps, as LTTng's ring buffer reads it inside its
 * reservation (lib/ringbuffer/frontend_api.h): a program that nests
 * between the read and the swap (an interrupt's) moves the position, so
 * the swap fails and both are taken again. Each record stamped here is
 * thus stamped no earlier than the one before it in the ring, and the
 * consumer's reorder window has nothing to reorder.
 */
static __always_inline __u64 *kc_area_reserve(__u32 idx, struct kc_cpu_state *ps, __u32 size, __u32 max, __u64 *pos, __u64 *ts)
{
	__u64 old, at, off, pad, end, lim;
	__u32 elem;
	void *e;
	int i;

	for (i = 0; i < KC_AREA_TRIES; i++) {
		old = *(volatile __u64 *)&ps->prod;
		if (ts) {
			/* The clock after the position: no load may pass it. */
			asm volatile("" ::: "memory");
			*ts = kc_now();
		}
		off = old & (kc_area_esize - 1);
		pad = off > kc_area_esize - max ? kc_area_esize - off : 0;
		end = old + pad + KC_AREA_HDR + ((size + 7) & ~7);
		if (end - *(volatile __u64 *)&ps->cons > kc_area_rsize)
			return NULL;
		if (__sync_val_compare_and_swap(&ps->prod, old, end) == old)
			goto won;
	}
	return NULL;
won:
	if (pad) {
		elem = idx * (kc_area_kmask + 1) + ((old >> kc_area_eshift) & kc_area_kmask);
		e = bpf_map_lookup_elem(&kc_area, &elem);
		/*
		 * off is a multiple of 8 below the element's end: the mask
		 * changes nothing but tells the verifier (6.1's does not learn
		 * it from a comparison here).
		 */
		if (e)
			*(volatile __u64 *)(e + (off & (kc_area_esize - KC_AREA_HDR))) = kc_area_lap(old) | KC_AREA_DISC | (pad - KC_AREA_HDR);
	}
	at = old + pad;
	elem = idx * (kc_area_kmask + 1) + ((at >> kc_area_eshift) & kc_area_kmask);
	e = bpf_map_lookup_elem(&kc_area, &elem);
	off = at & (kc_area_esize - 1);
	lim = kc_area_esize - max;
	/*
	 * Never taken: at starts an element or fits before its end. Both
	 * sides stay in registers, so that the verifier bounds off by a
	 * comparison with a constant, which older ones need.
	 */
	barrier_var(lim);
	barrier_var(off);
	if (!e || off > lim)
		return NULL;
	*pos = at;
	return e + off;
}

/* kc_area_commit publishes the record of size payload bytes at hdr, position pos. */
static __always_inline void kc_area_commit(__u64 *hdr, __u64 pos, __u32 size)
{
	asm volatile("" ::: "memory");
	*(volatile __u64 *)hdr = kc_area_lap(pos) | size;
}

/*
 * kc_area_wake wakes the consumer of kc_area ring idx as kc_wakeup_flags
 * decides, when the writer of slot st has left the ring's producer
 * position at end (ps holds the ring's positions), by a record on the
 * ring's doorbell, its BPF ring buffer in kc_rings. Testing the fill
 * needs no helper call here, so every record tests it; the doorbell is
 * looked up only to ring it, so a record that wakes no one costs no
 * lookup of it.
 */
static __always_inline void kc_area_wake(__u32 idx, struct kc_cpu_state *st, struct kc_cpu_state *ps, __u64 end, int atomic, int own)
{
	__u32 armed = st->armed;
	void *ring;

	if (!armed)
		return;
	if ((armed & KC_ARM_DATA) && !own && (__u32)(bpf_get_current_pid_tgid() >> 32) != kc_self_tgid)
		goto wake;
	if (!(armed & KC_ARM_FILL) || end - *(volatile __u64 *)&ps->cons < kc_wakeup_bytes)
		return;
wake:
	ring = bpf_map_lookup_elem(&kc_rings, &idx);
	if (!ring)
		return;
	kc_wake_taken(st, atomic);
	if (bpf_ringbuf_output(ring, &end, sizeof(end), BPF_RB_FORCE_WAKEUP))
		kc_wakeup_unused(st, BPF_RB_FORCE_WAKEUP, atomic);
}
#endif

#endif /* KC_AREA_H */
