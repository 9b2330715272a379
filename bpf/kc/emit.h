/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/emit.h: writing a record through the transport the object was built
 * for: kc_emit_begin passes the gate and gives the scratch record,
 * kc_output hands it to the perf buffer, the BPF ring buffer, kc_area or
 * a packet, and kc_emit_end (kc_emit, kc_emit_at) outputs and counts it.
 */
#ifndef KC_EMIT_H
#define KC_EMIT_H

#include "kc/core.h"
#include "kc/perf.h"
#include "kc/ringbuf.h"
#include "kc/area.h"
#include "kc/pkt.h"

/*
 * kc_emit_scratch returns this CPU's scratch record with its key set, or
 * NULL when recording is off on this CPU: kc_emit_begin without the
 * global gate, for a start trigger that may open it (kc/trigger.h).
 */
static __always_inline struct kc_scratch *kc_emit_scratch(__u32 key, struct kc_cpu_state **st)
{
	__u32 zero = 0, cpu;
	struct kc_scratch *s;

	cpu = bpf_get_smp_processor_id();
	*st = bpf_map_lookup_elem(&kc_state, &cpu);
	if (!*st || (*st)->disabled)
		return NULL;
	s = bpf_map_lookup_elem(&kc_scratch_map, &zero);
	if (!s)
		return NULL;
	s->hdr.key = key;
	s->hdr.cpu = cpu;
	return s;
}

/*
 * kc_emit_begin passes the gate and returns this CPU's scratch record with
 * its key set, or NULL when recording is off globally or on this CPU.
 */
static __always_inline struct kc_scratch *kc_emit_begin(__u32 key, struct kc_cpu_state **st)
{
	if (!kc_running)
		return NULL;
	return kc_emit_scratch(key, st);
}

/*
 * kc_output hands size bytes of the record s to the transport and returns
 * 0 or a negative errno; it counts only wakeups (in st). With stamp set it
 * stamps the record itself, in s->hdr.ts too: inside a kc_area ring's
 * reservation, so that the record keeps its ring's time order
 * (kc_area_reserve), else right before the output. Without it the record
 * keeps the time the caller gave it, and the consumer's reorder window
 * puts it in its place.
 */
static __always_inline long kc_output(void *ctx, struct kc_scratch *s, __u32 size, struct kc_cpu_state *st, int atomic, int stamp)
{
#ifdef KC_PERF
	if (stamp)
		s->hdr.ts = kc_now();
	return bpf_perf_event_output(ctx, &kc_perf, BPF_F_CURRENT_CPU, s, size);
#else
	__u32 idx = kc_global ? 0 : s->hdr.cpu;
	__u64 flags;
	void *ring;
	long err;

	if (kc_area_on) {
		struct kc_cpu_state *ps = bpf_map_lookup_elem(&kc_state, &idx);
		__u64 *h, pos, ts;

		if (!ps)
			return -2;
		barrier_var(size);
		if (size > sizeof(struct kc_rec) + KC_PAYLOAD_MASK)
			return -7; /* -E2BIG: kc_emit's callers mask the payload */
		if (kc_pkt_on) {
			struct kc_pkt p;
			__u32 len = size - sizeof(struct kc_rec);
			void *d;

			/* A packet is in time order: no time given by the caller. */
			if (!stamp || size < sizeof(struct kc_rec))
				return -22; /* -EINVAL; the loader keeps such events off packets */
			/*
			 * The bound decides where a packet ends (kc_pkt_reserve
			 * pads past esize - max): the usual small record must
			 * not end packets a largest record early.
			 */
			if (len < KC_PKT_SMALL) {
				d = kc_pkt_reserve(idx, ps, s->hdr.key, len, KC_EVH_EXT + KC_PKT_SMALL, &p);
				if (!d)
					return -11;
				bpf_probe_read_kernel(d, len & (KC_PKT_SMALL - 1), s->data);
			} else {
				d = kc_pkt_reserve(idx, ps, s->hdr.key, len, KC_EVH_EXT + KC_MAX_PAYLOAD, &p);
				if (!d)
					return -11;
				bpf_probe_read_kernel(d, len & KC_PAYLOAD_MASK, s->data);
			}
			s->hdr.ts = p.ts;
			kc_pkt_commit(&p);
			kc_area_wake(idx, st, ps, p.end, atomic, 0);
			return 0;
		}
		h = kc_area_reserve(idx, ps, size, KC_AREA_MAX, &pos, stamp ? &ts : NULL);
		if (!h)
			return -11; /* -EAGAIN: ring full, as bpf_ringbuf_output */
		bpf_probe_read_kernel(h + 1, size, s);
		if (stamp) {
			/* struct kc_rec's first field, behind the ring's header. */
			*(volatile __u64 *)(h + 1) = ts;
			s->hdr.ts = ts;
		}
		kc_area_commit(h, pos, size);
		kc_area_wake(idx, st, ps, pos + KC_AREA_HDR + ((size + 7) & ~7), atomic, 0);
		return 0;
	}
	ring = bpf_map_lookup_elem(&kc_rings, &idx);
	if (!ring)
		return -2; /* -ENOENT: no ring for this CPU */
	if (stamp)
		s->hdr.ts = kc_now();
	flags = kc_wakeup_flags(ring, size + 8, st, atomic, 0, 0);
	err = bpf_ringbuf_output(ring, s, size, flags);
	if (err)
		kc_wakeup_unused(st, flags, atomic);
	return err;
#endif
}

/*
 * kc_emit_counted is kc_emit, counting in st with atomic adds where
 * atomic is set: for a caller that programs of ours may interrupt on its
 * CPU (kc_sys_user_fault's record, made with preemption disabled, which
 * an interrupt's tp_btf program can still cut into).
 */
static __always_inline long kc_emit_counted(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len, int stamp, int atomic)
{
	long err;

	barrier_var(len);
	len &= KC_PAYLOAD_MASK;
	s->hdr.len = len;
	err = kc_output(ctx, s, sizeof(struct kc_rec) + len, st, atomic, stamp);
	if (atomic && err)
		__sync_fetch_and_add(&st->lost, 1);
	else if (err)
		st->lost++;
#ifndef KC_PERF
	else if (kc_area_on)
		; /* kc_area's drainer counts what it reads, as for kc_submit */
#endif
	else if (atomic)
		__sync_fetch_and_add(&st->emitted, 1);
	else
		st->emitted++;
	return err;
}

/*
 * kc_emit outputs len payload bytes of s, stamped by kc_output when stamp
 * is set (the time then in s->hdr.ts), else with the time s holds.
 * Returns 0 or a negative errno, which has been counted in the CPU's lost
 * counter.
 */
static __always_inline long kc_emit(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len, int stamp)
{
	return kc_emit_counted(ctx, s, st, len, stamp, 0);
}

/*
 * kc_emit_at outputs len payload bytes of s stamped with ts, a time the
 * caller took before (an event timed by another's). Returns 0 or a
 * negative errno, which has been counted in the CPU's lost counter.
 */
static __always_inline long kc_emit_at(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len, __u64 ts)
{
	s->hdr.ts = ts;
	return kc_emit(ctx, s, st, len, 0);
}

/*
 * kc_emit_end stamps the record and outputs len payload bytes of it; the
 * time is then in s->hdr.ts. The clock is read as late as the transport
 * allows: inside a kc_area ring's reservation, which keeps the ring in
 * time order, else right before the output, where the consumer restores
 * order within a bounded window. Returns 0 or a negative errno, which has
 * been counted in the CPU's lost counter.
 */
static __always_inline long kc_emit_end(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len)
{
	return kc_emit(ctx, s, st, len, 1);
}

#endif /* KC_EMIT_H */
