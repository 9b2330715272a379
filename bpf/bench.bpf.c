// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * bench.bpf.c: a full-speed producer for benchmarks and overload tests. Run
 * with BPF_PROG_TEST_RUN on a chosen CPU, it writes kc_bench_count records of
 * kc_bench_len payload bytes with bpf_loop (5.17+), reserving in place as a
 * hand-written producer would. Payload: a u64 sequence number; the bytes
 * after it are left as the ring held them (only the size matters here).
 */
#include "kconsume.h"

const volatile __u32 kc_bench_len = 48;
const volatile __u32 kc_bench_key = 0;

/* Records per run, set by the benchmark before each BPF_PROG_TEST_RUN. */
volatile __u32 kc_bench_n = 0;

/* Each run continues the sequence so readers can check order and gaps. */
__u64 kc_bench_seq = 0;

#ifndef KC_PERF
static long kc_bench_one(__u32 i, void *data)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 idx = kc_global ? 0 : cpu;
	struct kc_cpu_state *st = bpf_map_lookup_elem(&kc_state, &cpu);
	void *ring = bpf_map_lookup_elem(&kc_rings, &idx);
	struct kc_rec *r;

	if (!st || !ring)
		return 1;
	r = bpf_ringbuf_reserve(ring, sizeof(*r) + kc_bench_len, 0);
	if (!r) {
		st->lost++;
		kc_bench_seq++;
		return 0;
	}
	r->key = kc_bench_key;
	r->len = kc_bench_len;
	r->cpu = cpu;
	*(__u64 *)(r + 1) = kc_bench_seq++;
	r->ts = kc_now();
	bpf_ringbuf_submit(r, kc_wakeup_flags(ring, 0, st, 0, sizeof(*r) + kc_bench_len <= KC_SAMPLED_MAX, 0));
	st->emitted++;
	return 0;
}
#endif

#ifdef KC_PERF
/*
 * Perf has no in-place reserve and bpf_perf_event_output needs the program
 * context, which a bpf_loop callback does not get: one record per run.
 */
SEC("raw_tp")
int kc_bench_perf(void *ctx)
{
	__u32 zero = 0, cpu = bpf_get_smp_processor_id();
	struct kc_cpu_state *st = bpf_map_lookup_elem(&kc_state, &cpu);
	struct kc_scratch *s = bpf_map_lookup_elem(&kc_scratch_map, &zero);
	__u32 len = kc_bench_len & 0xff8;

	if (!st || !s)
		return 0;
	s->hdr.key = kc_bench_key;
	s->hdr.len = len;
	s->hdr.cpu = cpu;
	*(__u64 *)s->data = kc_bench_seq++;
	s->hdr.ts = kc_now();
	if (bpf_perf_event_output(ctx, &kc_perf, BPF_F_CURRENT_CPU, s, sizeof(s->hdr) + len))
		st->lost++;
	else
		st->emitted++;
	return 0;
}
#else
SEC("raw_tp")
int kc_bench(void *ctx)
{
	bpf_loop(kc_bench_n, kc_bench_one, NULL, 0);
	return 0;
}
#endif

char LICENSE[] SEC("license") = "Dual BSD/GPL";
