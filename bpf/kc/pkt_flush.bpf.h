/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/pkt_flush.bpf.h: packet mode's flush: kc_pkt_flush closes a CPU's
 * open packet.
 */
#ifndef KC_PKT_FLUSH_BPF_H
#define KC_PKT_FLUSH_BPF_H

#include "kc/pkt.h"

#ifndef KC_PERF
/*
 * kc_pkt_flush closes the packet open in this CPU's kc_area ring, when
 * one holds records, as a record that does not fit would: the consumer
 * runs it on the ring's CPU (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU)
 * at a flush (ctl flush, --live-timer) and at the end. The clock is read in
 * the compare-and-swap loop, so the packet's timestamp_end is no earlier
 * than its last record and no later than the next packet's
 * timestamp_begin. It returns 0, or 1 when the writers won every race
 * (the consumer tries again).
 */
SEC("raw_tp")
int kc_pkt_flush(void *ctx)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct kc_cpu_state *ps;
	__u64 old, off, ts;
	void *e;
	int i;

	ps = bpf_map_lookup_elem(&kc_state, &cpu);
	if (!ps || !kc_pkt_on)
		return 0;
	for (i = 0; i < KC_AREA_TRIES; i++) {
		old = *(volatile __u64 *)&ps->prod;
		asm volatile("" ::: "memory");
		ts = kc_now();
		off = old & (kc_area_esize - 1);
		if (!off)
			return 0;
		if (__sync_val_compare_and_swap(&ps->prod, old, old + kc_area_esize - off) == old)
			goto won;
	}
	return 1;
won:
	e = kc_pkt_elem(cpu, old);
	if (e)
		kc_pkt_close(e, off, ts);
	return 0;
}
#endif

#endif /* KC_PKT_FLUSH_BPF_H */
