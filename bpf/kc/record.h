/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/record.h: the end of a record built in a scratch record
 * (kc_record_end), for the classic tracepoints' kc_record and the
 * user-space values' kc_sys_user_emit; in packet mode it first builds the
 * event's payload as the trace holds it (struct kc_ctf, kc_ctf_build).
 */
#ifndef KC_RECORD_H
#define KC_RECORD_H

#include "kc/emit.h"
#include "kc/event.h"
#include "kc/stack.h"

#ifndef KC_PERF
/*
 * struct kc_ctf holds an event's payload as the trace holds it, built by
 * kc_ctf_build: twice the largest payload, so that a step that starts
 * anywhere below KC_MAX_PAYLOAD may write up to KC_MAX_PAYLOAD bytes in
 * the verifier's eyes. Its head is struct kc_scratch's, for kc_emit.
 */
struct kc_ctf {
	struct kc_rec hdr;
	__u8 data[2 * KC_MAX_PAYLOAD];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kc_ctf);
} kc_ctf_map SEC(".maps");

/*
 * kc_ctf_build builds into t the payload of the ring record in s, of len
 * bytes, with the steps of info, and returns its length, or -1 for a
 * record whose locations point outside it or a payload too large: the
 * caller counts it lost. The write position is masked after each step,
 * so the verifier sees the same bounds whatever steps came before.
 */
static __always_inline long kc_ctf_build(struct kc_scratch *s, struct kc_ctf *t, struct kc_tp_info *info, __u32 len)
{
	__u32 d = 0, off, n, start, loc, cnt;
	long r;
	int i;

#pragma unroll
	for (i = 0; i < KC_MAX_OPS; i++) {
		if (i >= info->nops)
			break;
		off = info->ops[i].off & KC_PAYLOAD_MASK;
		n = info->ops[i].n & KC_PAYLOAD_MASK;
		if (info->ops[i].kind == KC_OP_COPY) {
			if (off + n > len)
				return -1;
			bpf_probe_read_kernel(t->data + d, n, s->data + off);
			d += n;
		} else {
			loc = 0;
			bpf_probe_read_kernel(&loc, sizeof(loc), s->data + off);
			start = loc & 0xffff;
			n = loc >> 16;
			if (info->ops[i].rel)
				start += off + 4;
			else if (start < 2 + KC_CUT)
				return -1;
			else
				start -= KC_CUT;
			if (start + n > len)
				return -1;
			start &= KC_PAYLOAD_MASK;
			if (info->ops[i].kind == KC_OP_STRING) {
				r = bpf_probe_read_kernel_str(t->data + d, (n + 1) & KC_PAYLOAD_MASK, s->data + start);
				if (r < 0)
					return -1;
				d += r;
			} else {
				cnt = info->ops[i].elem ? n / info->ops[i].elem : 0;
				*(__u32 *)(t->data + d) = cnt;
				d += 4;
				if (d > KC_MAX_PAYLOAD - 1)
					return -1;
				/* Kept from clang, which would drop the mask after the test. */
				barrier_var(d);
				d &= KC_PAYLOAD_MASK;
				n = (cnt * info->ops[i].elem) & KC_PAYLOAD_MASK;
				bpf_probe_read_kernel(t->data + d, n, s->data + start);
				d += n;
			}
		}
		if (d > KC_MAX_PAYLOAD - 1)
			return -1;
		barrier_var(d);
		d &= KC_PAYLOAD_MASK;
	}
	return d;
}
#endif

/*
 * kc_record_end writes as event key the ring record s holds, size bytes
 * past its entry, which it fills (common_type and common_pid), and the
 * tail bytes behind them (contexts and call chains, kc_tail, which the
 * loader keeps off packet mode: the consumer moves them before the
 * payload, where the trace holds an event's context). In packet
 * mode a record that is not its payload as it is (one with steps,
 * kc_tp_info.nops) is built first into slot of ctf_map, a per-CPU array
 * of struct kc_ctf. Counts in st with atomic adds where atomic is set
 * (kc_emit_counted). Returns the record's timestamp, or 0 when it was
 * lost.
 */
static __always_inline __u64 kc_record_end(void *ctx, struct kc_scratch *s, void *ctf_map, __u32 slot, struct kc_cpu_state *st, __u32 key, struct kc_tp_info *info, __u32 size, __u32 tail, int atomic)
{
	kc_put_entry(s->data, info->id, bpf_get_current_pid_tgid());
#ifndef KC_PERF
	if (kc_pkt_on && info->nops) {
		struct kc_ctf *t = bpf_map_lookup_elem(ctf_map, &slot);
		long n;

		if (!t)
			return 0;
		n = kc_ctf_build(s, t, info, size + KC_ENTRY_SIZE);
		if (n < 0) {
			if (atomic)
				__sync_fetch_and_add(&st->lost, 1);
			else
				st->lost++;
			return 0;
		}
		t->hdr.key = key;
		t->hdr.cpu = s->hdr.cpu;
		if (kc_emit_counted(ctx, (struct kc_scratch *)t, st, n, 1, atomic))
			return 0;
		return t->hdr.ts;
	}
#endif
	if (kc_emit_counted(ctx, s, st, size + KC_ENTRY_SIZE + tail, 1, atomic))
		return 0;
	return s->hdr.ts;
}

#endif /* KC_RECORD_H */
