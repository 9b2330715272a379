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
#define KC_GEN_PLACEHOLDER 0x6b6347454eULL

/*
 * kc_prog_gen returns the generation of this program copy: 0 for the
 * copies loaded with the recorder, whose placeholder stays, and the
 * value the loader patches into a copy it loads later to change an
 * event's filter (kconsume ctl filter). An event is recorded only by the
 * copy whose generation its kc_tp_info.gen names, so that while the new
 * copy and the old are both attached, each event is recorded once.
 */
static __always_inline __u32 kc_prog_gen(void)
{
	__u64 gen;

	/*
	 * The placeholder is above 32 bits and a patched generation below:
	 * a compare with the placeholder itself would be a second copy of
	 * it, which the loader would patch too.
	 */
	asm volatile("%0 = 0x6b6347454e ll" : "=r"(gen));
	return gen >> 32 ? 0 : (__u32)gen;
}

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

/*
 * kc_filter_kept counts, per CPU and event key, the events their filter
 * kept, so that a filter that keeps nothing can say so (sized to the
 * events at load).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} kc_filter_kept SEC(".maps");

/*
 * kc_epoch is each CPU's epoch of filter changes: a change of an event's
 * filter names in kc_tp_info the epoch (switch_at) from which a CPU takes
 * the new program copy (gen_next), then moves every CPU's epoch there one
 * CPU at a time, by running kc_set_epoch on it. The programs of one
 * firing of a tracepoint run on one CPU and read the same epoch, so
 * exactly one of the two copies records it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} kc_epoch SEC(".maps");

/* kc_epoch_reached returns whether this CPU's epoch has reached at. */
static __always_inline int kc_epoch_reached(__u32 at)
{
	__u32 zero = 0, *e = bpf_map_lookup_elem(&kc_epoch, &zero);

	return e && *e >= at;
}

/* kc_gen_ok returns whether this program copy records the event of info. */
static __always_inline int kc_gen_ok(struct kc_tp_info *info)
{
	__u32 gen = info->gen;

	if (info->switch_at && kc_epoch_reached(info->switch_at))
		gen = info->gen_next;
	return gen == kc_prog_gen();
}

/*
 * kc_filter_on returns whether this program copy has a field filter in
 * kc_field_filter: the loader patches its KC_FILTER_PLACEHOLDER to 1.
 * A program calls it once (the loader patches one placeholder).
 */
static __always_inline int kc_filter_on(void)
{
	__u64 on;

	asm volatile("%0 = 0x6b6346494c ll" : "=r"(on));
	return on == 1;
}

/* kc_fields_count counts an event of key that its field filter kept. */
static __always_inline void kc_fields_count(__u32 key)
{
	__u64 *kept = bpf_map_lookup_elem(&kc_filter_kept, &key);

	if (kept)
		__sync_fetch_and_add(kept, 1);
}

/* kc_fields_pass returns whether event key passes its field filter. */
static __always_inline int kc_fields_pass(__u32 key, __u8 *data, __u32 len)
{
	if (!kc_filter_on())
		return 1;
	if (!kc_field_filter(data, len))
		return 0;
	kc_fields_count(key);
	return 1;
}

#endif /* KC_FIELDS_H */
