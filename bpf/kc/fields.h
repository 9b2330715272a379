/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/fields.h: an event's field filter (ftrace's event filter language,
 * record -f), run on the trace record once it is in the scratch record
 * and before any ring space is reserved.
 *
 * The loader compiles each filter into BPF (consumer/recorder/
 * filtercode.go) and puts it in place of kc_field_filter's body in the
 * program copy of the filtered event, whose KC_FILTER_PLACEHOLDER it
 * patches to 1; every other copy gets 0, and the verifier then drops the
 * call.
 */
#ifndef KC_FIELDS_H
#define KC_FIELDS_H

#include "kconsume.h"

#define KC_FILTER_PLACEHOLDER 0x6b6346494cULL

/*
 * kc_field_filter returns nonzero to keep the event whose ring record
 * (its entry, then the trace record from byte 8 on, KC_CUT bytes before
 * their trace-record offsets) is the len bytes at data. As built it keeps
 * every event; the assembly keeps clang from knowing so, and from
 * inlining it or folding its result into the caller.
 */
static __noinline int kc_field_filter(__u8 *data, __u32 len)
{
	int keep;

	asm volatile("%0 = 1" : "=r"(keep) : "r"(data), "r"(len));
	return keep;
}

/* kc_fields_pass returns whether the event passes its field filter. */
static __always_inline int kc_fields_pass(__u8 *data, __u32 len)
{
	__u64 on;

	asm volatile("%0 = 0x6b6346494c ll" : "=r"(on));
	return on != 1 || kc_field_filter(data, len);
}

#endif /* KC_FIELDS_H */
