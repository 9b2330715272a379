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
	__u16 flags;    /* KC_TP_* */
	__u16 pid_off;  /* hooks: offset of pid (sched_waking) or next_pid (sched_switch) */
	__u16 prio_off; /* sched_switch hook: offset of next_prio */
	__u16 comm_off; /* sched_switch hook: offset of next_comm */
	__u32 aux_key;  /* sched_switch hook: class of synthetic:wakeup_latency */
};

#define KC_TP_RECORD 1 /* write the event into the trace */
#define KC_TP_WAKING 2 /* remember when the task in pid_off was woken */
#define KC_TP_SWITCH 4 /* emit wakeup_latency for the task switched in */

/* Set when synthetic:wakeup_latency is recorded, so the hooks cost nothing otherwise. */
const volatile __u32 kc_hooks = 0;

/* When each woken task was woken, until it runs. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __s32);
	__type(value, __u64);
} kc_wake_ts SEC(".maps");

/*
 * struct kc_wakeup_latency is the payload of synthetic:wakeup_latency,
 * "pid_t pid; char comm[16]; int prio; u64 latency_ns; unsigned int cpu"
 * (consumer/wakeup.go), packed as relayfmt lays fields out.
 */
struct kc_wakeup_latency {
	__s32 pid;
	char comm[16];
	__s32 prio;
	__u64 latency_ns;
	__u32 cpu;
} __attribute__((packed));

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

/*
 * kc_record writes the trace record at ctx as event key and returns its
 * timestamp, or 0 when the gate is closed for this CPU.
 */
static __always_inline __u64 kc_record(void *ctx, __u32 key, struct kc_tp_info *info)
{
	struct trace_entry *ent;
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	__u32 size;
	__u64 ts;
	int i;

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
	ts = kc_now();
	kc_emit_at(ctx, s, st, size, ts);
	return ts;
}

/*
 * kc_wakeup computes synthetic:wakeup_latency as the kernel's histogram
 * triggers do (Documentation/trace/histogram.rst, "wakeup_latency"):
 * sched_waking stores the time per pid, sched_switch to that pid emits the
 * difference. ts is the time of the record written for this tracepoint,
 * when there is one, so the latency equals the difference of the two
 * records' timestamps in the trace. The pid filter applies to the woken
 * task (the current task is the waker or the one switched out).
 */
static __always_inline void kc_wakeup(void *ctx, struct kc_tp_info *info, __u64 ts)
{
	struct kc_wakeup_latency *w;
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	__u64 *then, woken;
	__s32 pid = 0;

	bpf_probe_read_kernel(&pid, sizeof(pid), ctx + (info->pid_off & 0xfff));
	if (pid <= 0)
		return;
	if (info->flags & KC_TP_WAKING) {
		bpf_map_update_elem(&kc_wake_ts, &pid, &ts, BPF_ANY);
		return;
	}
	then = bpf_map_lookup_elem(&kc_wake_ts, &pid);
	if (!then)
		return;
	woken = *then;
	bpf_map_delete_elem(&kc_wake_ts, &pid);
	if (woken > ts || !kc_pass_pid(pid))
		return;
	s = kc_emit_begin(info->aux_key, &st);
	if (!s)
		return;
	w = (void *)s->data;
	w->pid = pid;
	bpf_probe_read_kernel(w->comm, sizeof(w->comm), ctx + (info->comm_off & 0xfff));
	w->prio = 0;
	bpf_probe_read_kernel(&w->prio, sizeof(w->prio), ctx + (info->prio_off & 0xfff));
	w->latency_ns = ts - woken;
	w->cpu = s->hdr.cpu;
	kc_emit_at(ctx, s, st, sizeof(*w), ts);
}

SEC("tracepoint")
int kc_tracepoint(void *ctx)
{
	struct kc_tp_info *info;
	__u64 ts = 0;
	__u32 key;

	if (!kc_running)
		return 0;
	/* Without hooks a filtered-out task costs no map lookup. */
	if (!kc_hooks && !kc_pass())
		return 0;
	key = kc_event_key(ctx);
	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	if (!info)
		return 0;
	if ((info->flags & KC_TP_RECORD) && (!kc_hooks || kc_pass()))
		ts = kc_record(ctx, key, info);
	if (kc_hooks && (info->flags & (KC_TP_WAKING | KC_TP_SWITCH)))
		kc_wakeup(ctx, info, ts ? ts : kc_now());
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
