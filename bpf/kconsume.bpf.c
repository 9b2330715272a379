// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * kconsume.bpf.c: the generic tracepoint recorder. It copies the whole
 * trace record, the dynamic area behind __data_loc/__rel_loc fields
 * included, into the ring.
 *
 * The record cannot tell which event it is: before BPF runs, the kernel
 * overwrites its first 8 bytes, the common fields, with a pt_regs pointer
 * (kernel/trace/trace_event_perf.c:perf_trace_run_bpf_submit, and
 * kernel/trace/trace_syscalls.c:perf_call_bpf_enter for syscalls). So each
 * attachment carries its event's key: the attach cookie on Linux 5.15+, or
 * on older kernels a copy of the program per event whose key constant the
 * loader patches (KC_KEY_PLACEHOLDER).
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
	__u16 id;   /* trace event id, written back as common_type */
	__u16 size; /* bytes of the fixed part, common fields included */
	__u16 ndyn; /* entries used in dyn */
	__u16 dyn[KC_MAX_DYN]; /* field offsets, KC_DYN_REL set for __rel_loc */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* set to the number of events at load */
	__type(key, __u32);     /* event key: the relayfmt class id */
	__type(value, struct kc_tp_info);
} kc_tp_info_map SEC(".maps");

/* Use bpf_get_attach_cookie (5.15+) for the event key. */
const volatile __u32 kc_use_cookie = 0;

/* The loader replaces this 64-bit immediate by the event's key. */
#define KC_KEY_PLACEHOLDER 0x6b634b4559ULL

static __always_inline __u32 kc_event_key(void *ctx)
{
	__u64 key;

	if (kc_use_cookie)
		return bpf_get_attach_cookie(ctx);
	asm volatile("%0 = 0x6b634b4559 ll" : "=r"(key));
	return key;
}

SEC("tracepoint")
int kc_tracepoint(void *ctx)
{
	struct trace_entry *ent;
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	struct kc_tp_info *info;
	__u32 key, size;
	int i;

	if (!kc_running || !kc_pass())
		return 0;
	key = kc_event_key(ctx);
	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	if (!info)
		return 0;
	s = kc_emit_begin(key, &st);
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
	/*
	 * Rebuild the common fields that can be known here; common_flags and
	 * common_preempt_count cannot, and the consumer leaves them out.
	 */
	ent = (void *)s->data;
	ent->type = info->id;
	ent->flags = 0;
	ent->preempt_count = 0;
	ent->pid = (__u32)bpf_get_current_pid_tgid();
	kc_emit_end(ctx, s, st, size);
	return 0;
}

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

char LICENSE[] SEC("license") = "Dual BSD/GPL";
