/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/hot.bpf.h: what the generated programs of the hot events table
 * (kc/hot_btf.bpf.h, written by consumer/recorder/hot/hotgen from
 * consumer/recorder/hot) share: the record's construction, as the
 * hand-written BTF programs of kc/sched_btf.bpf.h do it.
 */
#ifndef KC_HOT_BPF_H
#define KC_HOT_BPF_H

#include "kc/sched_btf.bpf.h"

#ifndef KC_PERF
/*
 * kc_read_s64 returns the 8 bytes at the kernel address p, or 0 where
 * they cannot be read: a tracepoint's pointer to a scalar (ktime_t *) is
 * not one a tp_btf program may load through.
 */
static __always_inline __s64 kc_read_s64(const void *p)
{
	__s64 v = 0;

	bpf_probe_read_kernel(&v, sizeof(v), p);
	return v;
}

/*
 * kc_ctx_raw returns argument i of a tp_btf program's ctx without the
 * verifier's typing of it: a pointer to a function (a work_func_t) is
 * an argument the program may not load directly.
 */
static __always_inline __u64 kc_ctx_raw(__u64 *ctx, int i)
{
	__u64 v = 0;

	bpf_probe_read_kernel(&v, sizeof(v), &ctx[i]);
	return v;
}

/*
 * KC_HOT_RECORD records event key (trace event id id) from a tp_btf
 * program's arguments ctx: fill(d, cut, ctx) writes the record's fields at
 * d, each cut bytes before its trace-record offset, with stores aligned
 * at trace-record offsets. size is the largest record of the event's
 * layouts (a multiple of 4, at most KC_BTF_REC), len the running
 * kernel's. With a field filter the record is built on the stack first
 * and reserves nothing when the filter rejects it, then copy(d, rec) copies
 * it; without, in place. common_pid is current's.
 */
#define KC_HOT_RECORD(ctx, key, id, size, len, fill, copy)                                 \
	({                                                                                  \
		__u64 rec[KC_BTF_REC / 8] = {};                                             \
		int filtered = kc_filter_on();                                              \
		struct kc_cpu_state *st;                                                    \
		struct kc_resv res = {};                                                    \
		struct kc_rec *r;                                                           \
		void *ring, *d;                                                             \
		__u32 cpu;                                                                  \
                                                                                            \
		if (!kc_btf_gate(key))                                                      \
			return 0;                                                           \
		if (filtered) {                                                             \
			fill(rec, 0, ctx);                                                  \
			if (!kc_field_filter((__u8 *)rec, size))                            \
				return 0;                                                   \
			kc_fields_count(key);                                               \
		}                                                                           \
		r = kc_btf_begin(size, key, (len) - KC_CUT, &ring, &cpu, &st, &res);        \
		if (!r)                                                                     \
			return 0;                                                           \
		d = kc_rec_data(r);                                                         \
		if (filtered)                                                               \
			copy(d, rec);                                                       \
		else                                                                        \
			fill(d, KC_CUT, ctx);                                               \
		kc_put_entry(d, id, bpf_get_current_pid_tgid());                            \
		kc_submit(ring, r, st, key, (len) - KC_CUT, cpu, &res, 1, 0);               \
	})

/*
 * kc_hot_str reads the string (of 16 bytes at most) at src into s as __assign_str copies it:
 * the string and its NUL, the bytes after it zero. It returns the bytes
 * copied, 1 to 16 (an unreadable string is empty).
 */
static __always_inline __u32 kc_hot_str(__u64 *s, const char *src)
{
	long n = bpf_probe_read_kernel_str(s, 16, src);

	if (n < 1 || n > 16) {
		s[0] = s[1] = 0;
		return 1;
	}
	return n;
}

/*
 * kc_hot_put_str writes the n bytes of the string s (kc_hot_str's)
 * at d + off, no more: in packet mode the record's length ends there, and
 * the next record may follow.
 */
static __always_inline void kc_hot_put_str(void *d, __u32 off, const __u64 *s, __u32 n)
{
	if (n < 1 || n > 16)
		return;
	bpf_probe_read_kernel(d + off, n, s);
}

/*
 * KC_HOT_RECORD_STRINGS is KC_HOT_RECORD for an event whose record has
 * strings after its fixed fields in some layout: strings(), which reads
 * them, gives their bytes; the record is then len bytes (the trace
 * record's fixed part) or, in packet mode, pktlen (its CTF payload's,
 * consumer/layout) more. fill(d, cut, ctx, s, n) writes the ring record,
 * payload(d, ctx, s, n) the CTF payload. A field filter runs as in
 * KC_HOT_RECORD, on a layout without strings only: the recorder records
 * an event of a layout with strings and a filter through its tracepoint
 * (the strings' place on the stack record would vary).
 */
#define KC_HOT_RECORD_STRINGS(ctx, key, id, size, strings, len, pktlen, fill, payload, copy) \
	({                                                                                  \
		__u64 rec[KC_BTF_REC / 8] = {};                                             \
		int filtered = kc_filter_on();                                              \
		struct kc_cpu_state *st;                                                    \
		struct kc_resv res = {};                                                    \
		struct kc_rec *r;                                                           \
		void *ring, *d;                                                             \
		__u32 cpu, n_all, rlen;                                                     \
                                                                                            \
		if (!kc_btf_gate(key))                                                      \
			return 0;                                                           \
		n_all = strings;                                                            \
		if (filtered) {                                                             \
			fill(rec, 0, ctx, s, n);                                            \
			if (!kc_field_filter((__u8 *)rec, size))                            \
				return 0;                                                   \
			kc_fields_count(key);                                               \
		}                                                                           \
		rlen = (kc_pkt_on ? (pktlen) : (len) - KC_CUT) + n_all;                     \
		if (rlen > size)                                                            \
			return 0;                                                           \
		r = kc_btf_begin(size, key, rlen, &ring, &cpu, &st, &res);                  \
		if (!r)                                                                     \
			return 0;                                                           \
		d = kc_rec_data(r);                                                         \
		if (filtered)                                                               \
			copy(d, rec);                                                       \
		else if (kc_pkt_on)                                                         \
			payload(d, ctx, s, n);                                              \
		else                                                                        \
			fill(d, KC_CUT, ctx, s, n);                                         \
		kc_put_entry(d, id, bpf_get_current_pid_tgid());                            \
		kc_submit(ring, r, st, key, rlen, cpu, &res, 1, 0);                         \
	})
#endif

#endif /* KC_HOT_BPF_H */
