/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/perf.h: the perf buffer transport, built with -DKC_PERF for kernels
 * before 5.8: one perf event array, which kc_output writes with
 * bpf_perf_event_output into the current CPU's buffer.
 */
#ifndef KC_PERF_H
#define KC_PERF_H

#include "kc/core.h"

#ifdef KC_PERF
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} kc_perf SEC(".maps");
#endif

#endif /* KC_PERF_H */
