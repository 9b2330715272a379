/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/inject.bpf.h: injected records: kc_inject writes the events of user
 * space (synthetic events, klog markers) into a CPU's ring.
 */
#ifndef KC_INJECT_BPF_H
#define KC_INJECT_BPF_H

#include "kc/emit.h"

/*
 * struct kc_inject_rec is one event from user space (a synthetic event, a klog
 * marker): the consumer fills kc_inject_buf, then runs kc_inject with
 * BPF_PROG_TEST_RUN on the chosen CPU (BPF_F_TEST_RUN_ON_CPU), so the
 * record gets a kernel timestamp and travels that CPU's ring among the
 * kernel's events. The consumer injects one event at a time.
 */
struct kc_inject_rec {
	__u32 key; /* relayfmt class id */
	__u32 len; /* payload bytes in data */
	__u8 data[KC_MAX_PAYLOAD];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kc_inject_rec);
} kc_inject_buf SEC(".maps");

/* kc_inject's return values, read by the consumer. */
#define KC_INJECT_OK 0
#define KC_INJECT_OFF 1	 /* the gate is closed, or this CPU's buffer is stopped */
#define KC_INJECT_BADLEN 2
#define KC_INJECT_LOST 3 /* the ring was full: counted in the CPU's lost */

SEC("raw_tp")
int kc_inject(void *ctx)
{
	struct kc_cpu_state *st;
	struct kc_inject_rec *in;
	struct kc_scratch *s;
	__u32 zero = 0, len;

	in = bpf_map_lookup_elem(&kc_inject_buf, &zero);
	if (!in)
		return KC_INJECT_BADLEN;
	len = in->len;
	if (len > KC_MAX_PAYLOAD - 1)
		return KC_INJECT_BADLEN;
	s = kc_emit_begin(in->key, &st);
	if (!s)
		return KC_INJECT_OFF;
	barrier_var(len);
	len &= KC_PAYLOAD_MASK;
	bpf_probe_read_kernel(s->data, len, in->data);
	return kc_emit_end(ctx, s, st, len) ? KC_INJECT_LOST : KC_INJECT_OK;
}


#endif /* KC_INJECT_BPF_H */
