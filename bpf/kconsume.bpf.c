// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * kconsume.bpf.c: the generic tracepoint recorder. One program is attached
 * to every requested tracepoint; it finds the event's layout by the record's
 * common_type (the trace event id, include/linux/trace_events.h:struct
 * trace_entry) and copies the whole record, common fields and the dynamic
 * area behind __data_loc/__rel_loc fields included, into the ring.
 */
#include "kconsume.h"
#include "filter.h"

#define KC_MAX_DYN 8
#define KC_DYN_REL 0x8000 /* __rel_loc: offset counts from the end of the field */

/*
 * struct kc_tp_info describes one tracepoint for the recorder: the record's
 * fixed size and where its dynamic-location fields sit. A __data_loc field
 * is a u32: low 16 bits the offset of the data in the record, high 16 bits
 * its length (include/trace/stages/stage5_get_offsets.h).
 */
struct kc_tp_info {
	__u32 key;  /* class key written into kc_rec.key */
	__u16 id;   /* trace event id (common_type) */
	__u16 size; /* bytes of the fixed part, common fields included */
	__u16 ndyn; /* entries used in dyn */
	__u16 dyn[KC_MAX_DYN]; /* field offsets, KC_DYN_REL set for __rel_loc */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* set to the number of attached tracepoints */
	__type(key, __u32);     /* trace event id, or a KC_KEY_SYSCALL key */
	__type(value, struct kc_tp_info);
} kc_tp_info_map SEC(".maps");

/* Keys of syscall events in kc_tp_info_map, apart from trace event ids. */
#define KC_KEY_SYSCALL (1u << 31)
#define KC_KEY_EXIT (1u << 30)

/*
 * kc_record copies the trace record at ctx. For syscall events the kernel
 * hands BPF a record whose first 8 bytes hold a pt_regs pointer instead of
 * the common fields (kernel/trace/trace_syscalls.c:perf_call_bpf_enter), so
 * they are rebuilt: common_type from the event, common_pid from the task;
 * common_flags and common_preempt_count are not known there and read 0.
 */
static __always_inline int kc_record(void *ctx, __u32 tkey, int syscall)
{
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	struct kc_tp_info *info;
	__u32 size;
	int i;

	info = bpf_map_lookup_elem(&kc_tp_info_map, &tkey);
	if (!info)
		return 0;
	s = kc_emit_begin(info->key, &st);
	if (!s)
		return 0;
	size = info->size;
#pragma unroll
	for (i = 0; i < KC_MAX_DYN; i++) {
		__u32 loc = 0, off, end;

		if (i >= info->ndyn)
			break;
		off = info->dyn[i] & ~KC_DYN_REL;
		bpf_probe_read_kernel(&loc, sizeof(loc), ctx + off);
		end = (loc & 0xffff) + (loc >> 16);
		if (info->dyn[i] & KC_DYN_REL)
			end += off + sizeof(loc);
		if (end > size)
			size = end;
	}
	/*
	 * Trace records never exceed PERF_MAX_TRACE_SIZE. The barrier keeps
	 * clang from dropping the mask the verifier needs as a bound.
	 */
	if (size > KC_MAX_PAYLOAD - 1)
		size = KC_MAX_PAYLOAD - 1;
	barrier_var(size);
	size &= KC_PAYLOAD_MASK;
	bpf_probe_read_kernel(s->data, size, ctx);
	if (syscall) {
		struct trace_entry *ent = (void *)s->data;

		ent->type = info->id;
		ent->flags = 0;
		ent->preempt_count = 0;
		ent->pid = (__u32)bpf_get_current_pid_tgid();
	}
	kc_emit_end(ctx, s, st, size);
	return 0;
}

SEC("tracepoint")
int kc_tracepoint(void *ctx)
{
	__u16 type = 0;

	if (!kc_running || !kc_pass())
		return 0;
	bpf_probe_read_kernel(&type, sizeof(type), ctx);
	return kc_record(ctx, type, 0);
}

/*
 * struct syscall_tp_t of perf_call_bpf_enter/exit: the nr follows the regs.
 * Only these 12 bytes may be read directly: attaching fails with EACCES
 * when a program reads past the event's fields (perf_event_set_bpf_prog),
 * and getpid has no field after the nr.
 */
struct kc_syscall_ctx {
	__u64 regs;
	__s32 nr;
};

SEC("tracepoint")
int kc_sys_enter(struct kc_syscall_ctx *ctx)
{
	if (!kc_running || !kc_pass())
		return 0;
	return kc_record(ctx, KC_KEY_SYSCALL | (__u32)ctx->nr, 1);
}

SEC("tracepoint")
int kc_sys_exit(struct kc_syscall_ctx *ctx)
{
	if (!kc_running || !kc_pass())
		return 0;
	return kc_record(ctx, KC_KEY_SYSCALL | KC_KEY_EXIT | (__u32)ctx->nr, 1);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
