/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/pkt.h: packet mode (kc_pkt_on), where the writers fill kc_area's
 * elements as the trace's CTF packets.
 */
#ifndef KC_PKT_H
#define KC_PKT_H

#include "kc/area.h"

#ifndef KC_PERF
/*
 * Packet mode (kc_pkt_on, with kc_area_on): each element of a kc_area
 * ring is a CTF packet of the trace (relayfmt/FORMAT.md) that the writers
 * fill in place, as LTTng's ring buffer has its producers write the
 * sub-buffers (lib/ringbuffer/frontend_api.h), so that the consumer
 * writes whole elements to the file and reads no record.
 *
 * - A record is the trace's event: its compact header (id and the low 27
 *   bits of the time) or extended one (13 bytes), then the payload, with
 *   no padding. The compact header is taken when the time is within 2^27
 *   ns of kc_cpu_state.last, the time of a record reserved before this
 *   one, so within 2^27 of the one just before it in the packet, which is
 *   how a CTF reader rebuilds it.
 * - The writer that reserves an element's first bytes also reserves its
 *   packet header (KC_PKT_HDR bytes) and writes timestamp_begin; the
 *   rest of the header is the consumer's (relayfmt.Channel.PutPacket).
 * - A record that would start past the element's size less its bound
 *   (the max of kc_pkt_reserve) closes the element: its writer reserves
 *   the rest as padding, writes the packet's
 *   timestamp_end and content_size, and opens the next element. So does
 *   one that ends exactly at the element's end, without padding.
 * - Each writer adds (1 << 32) + the bytes it reserved in an element to
 *   its commit word (KC_PKT_COMMIT, packet_seq_num's place until the
 *   consumer writes the number), with an atomic add after its stores:
 *   programs preempted on faultable tracepoints nest in any order, so no
 *   one store can say the element is written. The element is complete
 *   when the low half equals its size, and the high half counts its
 *   records.
 * - Only an element's opener checks the consumer position: the element
 *   is then free up to its end.
 * - The consumer closes the open element at a flush and at the end with
 *   kc_pkt_flush, run on the ring's CPU.
 */
const volatile __u32 kc_pkt_on = 0;

#define KC_PKT_HDR 84     /* relayfmt.PacketHeaderSize */
#define KC_PKT_BEGIN 32   /* timestamp_begin */
#define KC_PKT_END 40     /* timestamp_end */
#define KC_PKT_CONTENT 48 /* content_size, in bits */
#define KC_PKT_COMMIT 64  /* the commit word, where packet_seq_num goes */
#define KC_EVH_COMPACT 4
#define KC_EVH_EXT 13
#define KC_EVH_MAX_ID 30 /* ids 31 and above take the extended header */
#define KC_EVH_TS_BITS 27
#define KC_PKT_SMALL 256 /* kc_output's records below this size take a bound of their own */

/* struct kc_pkt is a reservation of kc_pkt_reserve. */
struct kc_pkt {
	void *elem;  /* the element the record is in */
	__u64 end;   /* the producer position after the record */
	__u64 ts;    /* its time */
	__u32 bytes; /* bytes it reserved in elem: the record, and the packet header for an opener */
};

/* kc_pkt_elem returns ring idx's element at position pos, or NULL. */
static __always_inline void *kc_pkt_elem(__u32 idx, __u64 pos)
{
	__u32 elem = idx * (kc_area_kmask + 1) + ((pos >> kc_area_eshift) & kc_area_kmask);

	return bpf_map_lookup_elem(&kc_area, &elem);
}

/*
 * kc_pkt_close ends the packet elem at offset off (its content_size) and
 * time ts, and commits the padding after it; off is the packet's end when
 * nothing pads it.
 */
static __always_inline void kc_pkt_close(void *elem, __u64 off, __u64 ts)
{
	*(volatile __u64 *)(elem + KC_PKT_END) = ts;
	*(volatile __u64 *)(elem + KC_PKT_CONTENT) = off * 8;
	if (off < kc_area_esize)
		__sync_fetch_and_add((__u64 *)(elem + KC_PKT_COMMIT), kc_area_esize - off);
}

/*
 * kc_pkt_reserve reserves the event of key with size payload bytes in
 * ring idx, whose positions are in ps; max is a constant bound on
 * KC_EVH_EXT + size, which the verifier needs. It writes the event
 * header, and the packet's opening or closing fields where the event
 * opens or closes one, and returns where the payload goes, with the
 * reservation in *p; or NULL when the element it needs is not free or
 * the reservation lost its races: the caller counts that as lost. The
 * clock is read inside the compare-and-swap loop, as kc_area_reserve
 * does.
 */
static __always_inline void *kc_pkt_reserve(__u32 idx, struct kc_cpu_state *ps, __u32 key, __u32 size, __u32 max, struct kc_pkt *p)
{
	__u64 old, at, off, pad, need, end, ts, last, lim;
	__u32 hlen, open;
	void *e;
	int i;

	for (i = 0; i < KC_AREA_TRIES; i++) {
		old = *(volatile __u64 *)&ps->prod;
		asm volatile("" ::: "memory");
		ts = kc_now();
		last = *(volatile __u64 *)&ps->last;
		off = old & (kc_area_esize - 1);
		open = off == 0;
		pad = 0;
		hlen = !open && key <= KC_EVH_MAX_ID && ts - last < (1ULL << KC_EVH_TS_BITS) ? KC_EVH_COMPACT : KC_EVH_EXT;
		/*
		 * As kc_area_reserve pads: an event never starts past
		 * esize - max, which bounds its stores for the verifier.
		 */
		if (!open && off > kc_area_esize - max) {
			pad = kc_area_esize - off;
			open = 1;
			hlen = KC_EVH_EXT;
		}
		at = old + pad;
		need = hlen + size;
		if (open) {
			need += KC_PKT_HDR;
			if (at + kc_area_esize - *(volatile __u64 *)&ps->cons > kc_area_rsize)
				return NULL;
		}
		end = at + need;
		if (__sync_val_compare_and_swap(&ps->prod, old, end) == old)
			goto won;
	}
	return NULL;
won:
	*(volatile __u64 *)&ps->last = ts;
	if (pad) {
		e = kc_pkt_elem(idx, old);
		if (e)
			kc_pkt_close(e, off, ts);
	}
	e = kc_pkt_elem(idx, at);
	off = at & (kc_area_esize - 1);
	if (e && open) {
		*(volatile __u64 *)(e + KC_PKT_BEGIN) = ts;
		off += KC_PKT_HDR;
	}
	lim = kc_area_esize - max;
	/* Never taken, as in kc_area_reserve: the verifier's bound. */
	barrier_var(lim);
	barrier_var(off);
	if (!e || off > lim)
		return NULL;
	e += off;
	if (hlen == KC_EVH_COMPACT) {
		*(__u32 *)e = key | (__u32)ts << (32 - KC_EVH_TS_BITS);
	} else {
		*(__u8 *)e = 31;
		*(__u32 *)(e + 1) = key;
		*(__u64 *)(e + 5) = ts;
	}
	p->elem = e - off;
	p->end = end;
	p->ts = ts;
	p->bytes = need;
	if (!(end & (kc_area_esize - 1)))
		kc_pkt_close(p->elem, kc_area_esize, ts);
	return e + hlen;
}

/* kc_pkt_commit publishes the event of reservation p. */
static __always_inline void kc_pkt_commit(struct kc_pkt *p)
{
	__sync_fetch_and_add((__u64 *)(p->elem + KC_PKT_COMMIT), (1ULL << 32) | p->bytes);
}
#endif

#endif /* KC_PKT_H */
