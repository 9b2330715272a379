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
#include <bpf/bpf_core_read.h>

#define KC_MAX_DYN 8
#define KC_DYN_REL 0x8000 /* __rel_loc: offset counts from the end of the field */

/*
 * A ring record is the trace record without its bytes 2 and 3,
 * common_flags and common_preempt_count of struct trace_entry, which BPF
 * cannot know (the consumer's ringCut): common_type, common_pid, then
 * every other byte KC_CUT bytes before its place in the trace record, so
 * the consumer writes a record without dynamic fields into the trace as
 * it is. The fields after common_type land unaligned; kc_put stores them
 * with one instruction each (the verifier takes unaligned stores where
 * the architecture has efficient unaligned access, as x86 does).
 */
#define KC_CUT 2
#define KC_ENTRY_SIZE 6 /* common_type, common_pid */

#define kc_put(T, base, off, v) (*(T *)((void *)(base) + (off)) = (T)(v))

/* kc_put_entry writes a ring record's common_type and common_pid at d. */
#define kc_put_entry(d, type, pid)             \
	({                                     \
		kc_put(__u16, d, 0, type);     \
		kc_put(__u32, d, 2, pid);      \
	})

/*
 * struct kc_op is a step of building an event's payload as the trace holds
 * it from its ring record, in packet mode (kc_pkt_on), where no consumer
 * transcodes (consumer/layout.go: transcode, which this mirrors): copy
 * the n bytes at off; or, for the __data_loc (rel: __rel_loc) u32 at
 * off, its bytes up to a NUL and a NUL (a string), or their number of
 * elem-byte elements as a u32 and those elements (a sequence).
 */
struct kc_op {
	__u16 off;
	__u16 n;
	__u8 kind;
	__u8 rel;
	__u16 elem;
};

#define KC_OP_COPY 0
#define KC_OP_STRING 1
#define KC_OP_SEQ 2
#define KC_MAX_OPS 16

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
	__u16 nops;     /* packet mode: entries used in ops, 0 for a record written as it is */
	__u8 user_n;    /* KC_TP_SYSUSER: the user-space fields (kc_sys_user), at most KC_SYS_USER_CNT */
	__s8 user_len;  /* KC_TP_SYSUSER: the argument that bounds an array's copy, -1 for strings */
	__u8 user_arg[3]; /* KC_TP_SYSUSER: the argument each field's data comes from */
	__u8 user_max;  /* KC_TP_SYSUSER: bytes kept of each (syscall_user_buf_size) */
	__u16 user_loc; /* KC_TP_SYSUSER: offset of the first field's __data_loc in the trace record */
	struct kc_op ops[KC_MAX_OPS];
};

#define KC_TP_RECORD 1 /* write the event into the trace */
#define KC_TP_WAKING 2 /* remember when the task in pid_off was woken */
#define KC_TP_SWITCH 4 /* emit wakeup_latency for the task switched in */
#define KC_TP_SYSUSER 8 /* a syscall event with user-space fields to fill (kc_sys_user) */

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

static __always_inline __u32 kc_patched_key(void)
{
	__u64 key;

	asm volatile("%0 = 0x6b634b4559 ll" : "=r"(key));
	return key;
}

static __always_inline __u32 kc_event_key(void *ctx)
{
	if (kc_use_cookie)
		return bpf_get_attach_cookie(ctx);
	return kc_patched_key();
}

#ifndef KC_PERF
/*
 * struct kc_ctf holds an event's payload as the trace holds it, built by
 * kc_ctf_build: twice the largest payload, so that a step that starts
 * anywhere below KC_MAX_PAYLOAD may write up to KC_MAX_PAYLOAD bytes in
 * the verifier's eyes. Its head is struct kc_scratch's, for kc_emit.
 */
struct kc_ctf {
	struct kc_rec hdr;
	__u8 data[2 * KC_MAX_PAYLOAD];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kc_ctf);
} kc_ctf_map SEC(".maps");

/*
 * kc_ctf_build builds into t the payload of the ring record in s, of len
 * bytes, with the steps of info, and returns its length, or -1 for a
 * record whose locations point outside it or a payload too large: the
 * caller counts it lost. The write position is masked after each step,
 * so the verifier sees the same bounds whatever steps came before.
 */
static __always_inline long kc_ctf_build(struct kc_scratch *s, struct kc_ctf *t, struct kc_tp_info *info, __u32 len)
{
	__u32 d = 0, off, n, start, loc, cnt;
	long r;
	int i;

#pragma unroll
	for (i = 0; i < KC_MAX_OPS; i++) {
		if (i >= info->nops)
			break;
		off = info->ops[i].off & KC_PAYLOAD_MASK;
		n = info->ops[i].n & KC_PAYLOAD_MASK;
		if (info->ops[i].kind == KC_OP_COPY) {
			if (off + n > len)
				return -1;
			bpf_probe_read_kernel(t->data + d, n, s->data + off);
			d += n;
		} else {
			loc = 0;
			bpf_probe_read_kernel(&loc, sizeof(loc), s->data + off);
			start = loc & 0xffff;
			n = loc >> 16;
			if (info->ops[i].rel)
				start += off + 4;
			else if (start < 2 + KC_CUT)
				return -1;
			else
				start -= KC_CUT;
			if (start + n > len)
				return -1;
			start &= KC_PAYLOAD_MASK;
			if (info->ops[i].kind == KC_OP_STRING) {
				r = bpf_probe_read_kernel_str(t->data + d, (n + 1) & KC_PAYLOAD_MASK, s->data + start);
				if (r < 0)
					return -1;
				d += r;
			} else {
				cnt = info->ops[i].elem ? n / info->ops[i].elem : 0;
				*(__u32 *)(t->data + d) = cnt;
				d += 4;
				if (d > KC_MAX_PAYLOAD - 1)
					return -1;
				/* Kept from clang, which would drop the mask after the test. */
				barrier_var(d);
				d &= KC_PAYLOAD_MASK;
				n = (cnt * info->ops[i].elem) & KC_PAYLOAD_MASK;
				bpf_probe_read_kernel(t->data + d, n, s->data + start);
				d += n;
			}
		}
		if (d > KC_MAX_PAYLOAD - 1)
			return -1;
		barrier_var(d);
		d &= KC_PAYLOAD_MASK;
	}
	return d;
}
#endif

#ifndef KC_PERF
/*
 * Syscall events' user-space fields (Linux 6.19+). The kernel appends to
 * some sys_enter events a __data_loc char[] field per pointer argument,
 * right after the arguments, and fills it with what the argument points
 * to (kernel/trace/trace_syscalls.c: sys_fault_user, syscall_put_data).
 * A program on a syscall tracepoint gets only the number and the
 * arguments (perf_call_bpf_enter), so kc_sys_user reads the data, by the
 * kernel's rules:
 * - a string: up to KC_SYS_USER_READ bytes and its NUL
 *   (strncpy_from_user), each unprintable byte (isprint of lib/ctype.c)
 *   stored as '.'; longer than user_max bytes, it is cut there and
 *   "..." and a NUL follow, else its NUL ends it;
 * - an array (write's buf): min(the length argument, KC_SYS_USER_READ)
 *   bytes read, the first user_max of them kept as they are;
 * - a read that faults, or a user_max of 0: an empty field.
 * bpf_probe_read_user cannot page memory in where the kernel's copy can,
 * and nothing has paged it in for a program alone (seen on 7.3: a page
 * the task never touched read as a fault), so kc_sys_user_fault does
 * that first where the kernel allows it; a value still unread is
 * counted in kc_sys_user_unread.
 */
#define KC_SYS_USER_CNT 3    /* SYSCALL_FAULT_MAX_CNT */
#define KC_SYS_USER_MAX 165  /* SYSCALL_FAULT_USER_MAX */
#define KC_SYS_USER_READ 169 /* SYSCALL_FAULT_ARG_SZ - 1: what the kernel reads */

/*
 * kc_sys_user_unread counts per CPU the user-space values kc_sys_user
 * could not read: a bad pointer (the kernel's own event holds an empty
 * value then too) or memory not paged in (where it holds the data).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} kc_sys_user_unread SEC(".maps");

/*
 * Set when some recorded event has user-space fields: otherwise the
 * verifier drops kc_sys_user from every program copy, which it would
 * otherwise verify in each (hundreds of milliseconds a load).
 */
const volatile __u32 kc_sys_user_on = 0;

#define KC_BYTES(b) (0x0101010101010101ULL * (b))

/*
 * kc_printable returns the 8 bytes of w with each byte that isprint
 * (lib/ctype.c's table) calls unprintable replaced by '.': those below
 * 0x20, 0x7f and 0x80 to 0x9f. Without a branch per byte, so that the
 * verifier walks a string in 21 steps, not 165. With v a byte's low 7
 * bits, v + 0x60 reaches bit 7 where v >= 0x20 and v + 1 where v is
 * 0x7f, carrying into no other byte.
 */
static __always_inline __u64 kc_printable(__u64 w)
{
	__u64 high = w & KC_BYTES(0x80), low = w & KC_BYTES(0x7f);
	__u64 ge20 = (low + KC_BYTES(0x60)) & KC_BYTES(0x80);
	__u64 is7f = (low + KC_BYTES(0x01)) & KC_BYTES(0x80);
	__u64 bad = ((~ge20 & KC_BYTES(0x80)) | (is7f & ~high)) >> 7;
	__u64 m = bad * 0xff;

	return (w & ~m) | (KC_BYTES('.') & m);
}

/*
 * kc_sys_user fills the user-space fields of info's syscall event into
 * d, a ring record holding the number and the arguments, and returns
 * the trace record's size, or 0 for an info the loader never writes.
 */
static __always_inline __u32 kc_sys_user(__u8 *d, struct kc_tp_info *info)
{
	__u32 loc = info->user_loc, max = info->user_max, end, dst, n, x, a, bad;
	const void *ptr;
	__u64 *w;
	__u64 cnt;
	long r;
	int j;

	if (loc < 16 || loc > 16 + 8 * 6 || info->user_n > KC_SYS_USER_CNT || max > KC_SYS_USER_MAX)
		return 0;
	end = loc + 4 * info->user_n;
#pragma unroll
	for (j = 0; j < KC_SYS_USER_CNT; j++) {
		if (j >= info->user_n)
			break;
		/* Argument i sits at 16 + 8 * i of the trace record, KC_CUT before in the ring record. */
		a = info->user_arg[j];
		if (a > 5)
			return 0;
		ptr = (const void *)*(__u64 *)(d + 16 - KC_CUT + 8 * a);
		dst = (end - KC_CUT) & 0x3ff;
		n = 0;
		bad = 1;
		if (!max) {
			/* The kernel reads nothing. */
		} else if (info->user_len >= 0) {
			a = info->user_len;
			if (a > 5)
				return 0;
			cnt = *(__u64 *)(d + 16 - KC_CUT + 8 * a);
			if (cnt > KC_SYS_USER_READ)
				cnt = KC_SYS_USER_READ;
			/* Older verifiers (5.10, 6.1) lose the bound without the mask. */
			barrier_var(cnt);
			cnt &= 0xff;
			if (!bpf_probe_read_user(d + dst, cnt, ptr)) {
				n = cnt < max ? cnt : max;
				bad = 0;
			}
		} else {
			r = bpf_probe_read_user_str(d + dst, KC_SYS_USER_READ + 1, ptr);
			if (r > 0) {
				bad = 0;
				r--; /* the string's bytes, without the NUL read after them */
				n = r < max ? r : max;
				/*
				 * Whole words: bytes past n belong to no field yet
				 * (the next one is read after), and the NUL or
				 * "..." is written after.
				 */
				for (x = 0; x < (KC_SYS_USER_MAX + 7) / 8; x++) {
					if (8 * x >= n)
						break;
					w = (__u64 *)(d + ((dst + 8 * x) & 0x3ff));
					*w = kc_printable(*w);
				}
				if (r > max) {
					d[(dst + max) & 0x3ff] = '.';
					d[(dst + max + 1) & 0x3ff] = '.';
					d[(dst + max + 2) & 0x3ff] = '.';
					d[(dst + max + 3) & 0x3ff] = 0;
					n = max + 4;
				} else {
					d[(dst + r) & 0x3ff] = 0;
					n = r + 1; /* its NUL */
				}
			}
		}
		if (max && bad) {
			__u32 zero = 0;
			__u64 *unread = bpf_map_lookup_elem(&kc_sys_user_unread, &zero);

			if (unread)
				*unread += 1;
		}
		*(__u32 *)(d + ((loc - KC_CUT + 4 * j) & 0x7f)) = end | n << 16;
		end += n;
	}
	return end;
}
#endif

/*
 * kc_record_end writes as event key the ring record s holds, size bytes
 * past its entry, which it fills (common_type and common_pid). In packet
 * mode a record that is not its payload as it is (one with steps,
 * kc_tp_info.nops) is built first into slot of ctf_map, a per-CPU array
 * of struct kc_ctf. Counts in st with atomic adds where atomic is set
 * (kc_emit_counted). Returns the record's timestamp, or 0 when it was
 * lost.
 */
static __always_inline __u64 kc_record_end(void *ctx, struct kc_scratch *s, void *ctf_map, __u32 slot, struct kc_cpu_state *st, __u32 key, struct kc_tp_info *info, __u32 size, int atomic)
{
	kc_put_entry(s->data, info->id, bpf_get_current_pid_tgid());
#ifndef KC_PERF
	if (kc_pkt_on && info->nops) {
		struct kc_ctf *t = bpf_map_lookup_elem(ctf_map, &slot);
		long n;

		if (!t)
			return 0;
		n = kc_ctf_build(s, t, info, size + KC_ENTRY_SIZE);
		if (n < 0) {
			if (atomic)
				__sync_fetch_and_add(&st->lost, 1);
			else
				st->lost++;
			return 0;
		}
		t->hdr.key = key;
		t->hdr.cpu = s->hdr.cpu;
		if (kc_emit_counted(ctx, (struct kc_scratch *)t, st, n, 1, atomic))
			return 0;
		return t->hdr.ts;
	}
#endif
	if (kc_emit_counted(ctx, s, st, size + KC_ENTRY_SIZE, 1, atomic))
		return 0;
	return s->hdr.ts;
}

/*
 * kc_record writes the trace record at ctx as event key and returns its
 * timestamp, or 0 when the gate is closed for this CPU or the record was
 * lost. In packet mode a record that is not its payload as it is (one
 * with steps, kc_tp_info.nops) is built into a kc_ctf first.
 */
static __always_inline __u64 kc_record(void *ctx, __u32 key, struct kc_tp_info *info)
{
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	__u32 size;
	int i;

	if (info->size < 8)
		return 0; /* not a trace record: the loader never sets one */
	s = kc_emit_begin(key, &st);
	if (!s)
		return 0;
#ifndef KC_PERF
	if (kc_sys_user_on && (info->flags & KC_TP_SYSUSER)) {
		/* The context holds the number and the arguments, nothing after them. */
		size = info->user_loc;
		if (size < 16 || size > 16 + 8 * 6)
			return 0;
		bpf_probe_read_kernel(s->data + KC_ENTRY_SIZE, size - 8, ctx + 8);
		size = kc_sys_user(s->data, info);
		if (size < 16)
			return 0;
		size -= 8;
		goto copied;
	}
#endif
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
	 * The record past its common fields goes behind the ring record's
	 * entry. Trace records never exceed PERF_MAX_TRACE_SIZE. The barrier
	 * keeps clang from dropping the mask the verifier needs as a bound.
	 */
	size -= 8;
	if (size > KC_MAX_PAYLOAD - 8)
		size = KC_MAX_PAYLOAD - 8;
	barrier_var(size);
	size &= KC_PAYLOAD_MASK;
	bpf_probe_read_kernel(s->data + KC_ENTRY_SIZE, size, ctx + 8);
#ifndef KC_PERF
copied:
	return kc_record_end(ctx, s, &kc_ctf_map, 0, st, key, info, size, 0);
#else
	return kc_record_end(ctx, s, NULL, 0, st, key, info, size, 0);
#endif
}

#ifndef KC_PERF
/*
 * kc_cpu_ring returns this CPU's state, with its number in *cpu and, for
 * the BPF ring buffer transport, the ring it writes into in *ring; or NULL
 * when this CPU's buffer is stopped. A kc_area ring needs no ring buffer
 * to write (*ring is NULL then): kc_area_wake looks up its doorbell when
 * it rings it.
 */
static __always_inline struct kc_cpu_state *kc_cpu_ring(__u32 *cpu, void **ring)
{
	struct kc_cpu_state *st;
	__u32 idx;

	*ring = NULL;
	*cpu = bpf_get_smp_processor_id();
	st = bpf_map_lookup_elem(&kc_state, cpu);
	if (!st || st->disabled)
		return NULL;
	if (kc_area_on)
		return st;
	idx = kc_global ? 0 : *cpu;
	*ring = bpf_map_lookup_elem(&kc_rings, &idx);
	return *ring ? st : NULL;
}

/*
 * struct kc_resv is a reservation of kc_reserve: its size, and with
 * kc_area its position and its timestamp, taken in the reservation.
 */
struct kc_resv {
	__u64 pos;
	__u64 ts;
	__u32 size;
	struct kc_pkt pkt; /* packet mode's */
};

/*
 * kc_reserve reserves a ring record of size bytes (a constant of the
 * caller), struct kc_rec included, in this CPU's ring: the BPF ring
 * buffer ring, or its kc_area ring, whose positions are in st (and which
 * stamps the record as it reserves it, kc_area_reserve). It returns NULL
 * when the ring is full, and the reservation in *res.
 */
static __always_inline struct kc_rec *kc_reserve(void *ring, struct kc_cpu_state *st, __u32 cpu, __u32 size, struct kc_resv *res)
{
	__u64 *h;

	res->size = size;
	if (!kc_area_on)
		return bpf_ringbuf_reserve(ring, size, 0);
	if (kc_pkt_on)
		return NULL; /* kc_reserve_pkt's */
	h = kc_area_reserve(cpu, st, size, KC_AREA_HDR + ((size + 7) & ~7), &res->pos, &res->ts);
	return h ? (void *)(h + 1) : NULL;
}

/*
 * kc_reserve_pkt is kc_reserve in packet mode (kc_pkt_on): it reserves the
 * event of key with len payload bytes, at most max - KC_EVH_EXT (a
 * constant), and returns the event's payload as the struct kc_rec pointer
 * the callers pass around, or NULL when the ring is full. There is no
 * struct kc_rec in a packet: kc_submit writes none in packet mode, the
 * callers find the payload with kc_rec_data, and no byte past len may
 * be written. (A pointer before the payload, for r + 1 to reach it, may
 * point before the element, which Linux 7.x's verifier refuses.)
 */
static __always_inline struct kc_rec *kc_reserve_pkt(struct kc_cpu_state *st, __u32 cpu, __u32 key, __u32 len, __u32 max, struct kc_resv *res)
{
	return kc_pkt_reserve(cpu, st, key, len, max, &res->pkt);
}

/* kc_rec_data returns the payload of r, a reservation of kc_reserve or kc_reserve_pkt. */
#define kc_rec_data(r) (kc_pkt_on ? (void *)(r) : (void *)((r) + 1))

/*
 * kc_submit stamps r, reserved by kc_reserve as res (with the time taken
 * in a kc_area reservation, else now), as a record of len
 * payload bytes of event key from cpu, submits it and counts it in st,
 * with atomic adds for programs that can run preemptibly or nest with
 * another of ours on the CPU (raw and BTF tracepoints, trampolines). own
 * marks a record of the consumer's own that another task writes
 * (kc_wakeup_flags). It returns the timestamp.
 */
static __always_inline __u64 kc_submit(void *ring, struct kc_rec *r, struct kc_cpu_state *st, __u32 key, __u32 len, __u32 cpu, struct kc_resv *res, int atomic, int own)
{
	__u64 ts;

	if (kc_pkt_on) {
		kc_pkt_commit(&res->pkt);
		kc_area_wake(kc_global ? 0 : cpu, st, st, res->pkt.end, atomic, own);
		return res->pkt.ts;
	}
	r->key = key;
	r->len = len;
	r->cpu = cpu;
	ts = kc_area_on ? res->ts : kc_now();
	r->ts = ts;
	if (kc_area_on) {
		/* The consumer counts the records it reads: no atomic here. */
		kc_area_commit((__u64 *)r - 1, res->pos, res->size);
		kc_area_wake(kc_global ? 0 : cpu, st, st, res->pos + KC_AREA_HDR + ((res->size + 7) & ~7), atomic, own);
		return ts;
	}
	bpf_ringbuf_submit(r, kc_wakeup_flags(ring, 0, st, atomic, 1, own));
	if (atomic)
		__sync_fetch_and_add(&st->emitted, 1);
	else
		st->emitted++;
	return ts;
}

/* Largest record kc_record_small writes: 16 words, 128 bytes. */
#define KC_SMALL_MAX 128

/*
 * The loader replaces this immediate by the record size of the events a
 * program copy records with kc_record_small, or 0 for the general path.
 */
#define KC_SIZE_PLACEHOLDER 0x6b6353495aULL

static __always_inline __u32 kc_small_size(void)
{
	__u64 size;

	asm volatile("%0 = 0x6b6353495a ll" : "=r"(size));
	return size;
}

/*
 * kc_ld copies the T at offset off (8 or more) of the trace record at ctx
 * to its place in the ring record at dst, KC_CUT bytes before. Tracepoint programs may load their context directly, at
 * constant offsets from 8 (the first word holds a pt_regs pointer by now),
 * but perf refuses to attach a program whose loads reach past the event's
 * last field (kernel/events/core.c:perf_event_set_bpf_prog,
 * max_ctx_offset), so a copy loads the record's exact size. The load is
 * written in assembly because the verifier refuses a context pointer moved
 * by arithmetic, which clang would otherwise share between loads.
 */
#define kc_ld(dst, ctx, T, off)                                                   \
	({                                                                        \
		T _v;                                                             \
		asm volatile("%0 = *(" #T " *)(%1 + %2)" : "=r"(_v) : "r"(ctx), "i"(off)); \
		kc_put(T, dst, (off) - KC_CUT, _v);                               \
	})

/*
 * kc_word copies the bytes of word k (k ≥ 1) that lie below size, a
 * multiple of 2 (the loader uses this path only for such sizes): a u64,
 * or the u32 and u16 that the record's tail covers (task_rename ends with
 * a short at 44).
 */
#define kc_word(dst, ctx, size, k)                                                \
	({                                                                        \
		if ((size) >= 8 * (k) + 8) {                                      \
			kc_ld(dst, ctx, u64, 8 * (k));                            \
		} else {                                                          \
			if ((size) >= 8 * (k) + 4)                                \
				kc_ld(dst, ctx, u32, 8 * (k));                    \
			if ((size) == 8 * (k) + 6)                                \
				kc_ld(dst, ctx, u16, 8 * (k) + 4);                \
			else if ((size) == 8 * (k) + 2)                           \
				kc_ld(dst, ctx, u16, 8 * (k));                    \
		}                                                                 \
	})

#define KC_RESERVE(n)                                                             \
	case n:                                                                   \
		r = kc_reserve(ring, st, cpu, sizeof(struct kc_rec) + 8 * (n), &res); \
		break;

/*
 * kc_record_small writes the trace record at ctx, size bytes without
 * dynamic fields (a multiple of 2, at most KC_SMALL_MAX), straight into this CPU's ring as
 * event key (as a ring record, KC_CUT bytes shorter), and returns its timestamp, or 0 when this CPU's buffer is
 * stopped or the ring is full (then counted as lost). size is a constant
 * of the program copy (kc_small_size), so the verifier keeps only the
 * loads and the one bpf_ringbuf_reserve (which takes only a constant
 * size) of that size; the ring record is padded to whole words and
 * kc_rec.len holds the true size. This saves the scratch copy,
 * bpf_probe_read_kernel and the second copy of bpf_ringbuf_output for the
 * common events: syscalls, sched_switch, irqs.
 */
static __always_inline __u64 kc_record_small(void *ctx, __u32 key, struct kc_tp_info *info, __u32 size)
{
	struct kc_cpu_state *st;
	struct kc_rec *r = NULL;
	struct kc_resv res = {};
	void *ring, *d;
	__u32 cpu;

	st = kc_cpu_ring(&cpu, &ring);
	if (!st)
		return 0;
	if (kc_pkt_on) {
		r = kc_reserve_pkt(st, cpu, key, size - KC_CUT, KC_EVH_EXT + KC_SMALL_MAX, &res);
		goto reserved;
	}
	switch ((size - KC_CUT + 7) / 8) {
	KC_RESERVE(1)
	KC_RESERVE(2)
	KC_RESERVE(3)
	KC_RESERVE(4)
	KC_RESERVE(5)
	KC_RESERVE(6)
	KC_RESERVE(7)
	KC_RESERVE(8)
	KC_RESERVE(9)
	KC_RESERVE(10)
	KC_RESERVE(11)
	KC_RESERVE(12)
	KC_RESERVE(13)
	KC_RESERVE(14)
	KC_RESERVE(15)
	KC_RESERVE(16)
	}
reserved:
	if (!r) {
		st->lost++;
		return 0;
	}
	d = kc_rec_data(r);
	kc_word(d, ctx, size, 1);
	kc_word(d, ctx, size, 2);
	kc_word(d, ctx, size, 3);
	kc_word(d, ctx, size, 4);
	kc_word(d, ctx, size, 5);
	kc_word(d, ctx, size, 6);
	kc_word(d, ctx, size, 7);
	kc_word(d, ctx, size, 8);
	kc_word(d, ctx, size, 9);
	kc_word(d, ctx, size, 10);
	kc_word(d, ctx, size, 11);
	kc_word(d, ctx, size, 12);
	kc_word(d, ctx, size, 13);
	kc_word(d, ctx, size, 14);
	kc_word(d, ctx, size, 15);
	kc_put_entry(d, info->id, bpf_get_current_pid_tgid());
	return kc_submit(ring, r, st, key, size - KC_CUT, cpu, &res, 0, 0);
}
#endif

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
	if ((info->flags & KC_TP_RECORD) && (!kc_hooks || kc_pass())) {
#ifndef KC_PERF
		__u32 small = kc_small_size();

		if (small >= 8 && small <= KC_SMALL_MAX && !(small & 1) && small == info->size)
			ts = kc_record_small(ctx, key, info, small);
		else
#endif
			ts = kc_record(ctx, key, info);
	}
	if (kc_hooks && (info->flags & (KC_TP_WAKING | KC_TP_SWITCH)))
		kc_wakeup(ctx, info, ts ? ts : kc_now());
	return 0;
}

#ifndef KC_PERF
/*
 * Syscall events through the raw syscall tracepoints. The kernel hangs
 * every syscalls:sys_enter_* and sys_exit_* event off the sys_enter and
 * sys_exit tracepoints (kernel/trace/trace_syscalls.c); for perf and BPF
 * it then builds the record and runs the program through
 * perf_syscall_enter and trace_call_bpf, which costs more than the
 * recording itself. kc_sys_enter and kc_sys_exit sit on those tracepoints
 * directly (tp_btf), find the event by syscall number (the consumer
 * knows the numbers from the kernel's syscall table) and build the same
 * record as trace_syscalls.c: struct syscall_trace_enter (nr, then one
 * unsigned long per argument) or struct syscall_trace_exit (nr, ret).
 * x86_64 only: the arguments come from struct pt_regs as
 * syscall_get_arguments takes them (arch/x86/include/asm/syscall.h).
 */

/* Syscall numbers the dispatch covers; x86_64 has about 470. */
#define KC_SYS_MAX 1024

/*
 * struct kc_sys_key is what the raw path needs of a recorded syscall
 * event: its key, and the two fields of its struct kc_tp_info the record
 * takes, so that a traced syscall costs one map lookup, not two.
 */
struct kc_sys_key {
	__u32 key;  /* the event key + 1, or 0 when the event is not recorded */
	__u16 id;   /* kc_tp_info.id */
	__u16 size; /* kc_tp_info.size */
};

/* kc_sys_keys maps nr (sys_enter) and KC_SYS_MAX + nr (sys_exit) to the event's struct kc_sys_key. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * KC_SYS_MAX);
	__type(key, __u32);
	__type(value, struct kc_sys_key);
} kc_sys_keys SEC(".maps");

/* Read the current task with bpf_get_current_task_btf (5.11+). */
const volatile __u32 kc_task_btf = 0;

/*
 * arch/x86/include/asm/thread_info.h: TS_COMPAT marks a 32-bit syscall
 * (int $0x80, sysenter, a compat syscall), whose numbers are not the
 * x86_64 ones; the syscall events ignore those
 * (ARCH_TRACE_IGNORE_COMPAT_SYSCALLS, in_32bit_syscall) and so does this.
 */
#define KC_TS_COMPAT 0x0002

/*
 * kc_sys_task returns the current thread's id, or -1 during a 32-bit
 * syscall. With bpf_get_current_task_btf one read of the task gives both,
 * a helper call fewer per event than bpf_get_current_pid_tgid.
 */
static __always_inline __s32 kc_sys_task(void)
{
	struct task_struct *t;

	if (kc_task_btf) {
		t = bpf_get_current_task_btf();
		if (t->thread_info.status & KC_TS_COMPAT)
			return -1;
		return t->pid;
	}
	t = (struct task_struct *)bpf_get_current_task();
	if (BPF_CORE_READ(t, thread_info.status) & KC_TS_COMPAT)
		return -1;
	return (__u32)bpf_get_current_pid_tgid();
}

/*
 * The ring record of a syscall event, at most six arguments: struct
 * syscall_trace_enter or syscall_trace_exit as a ring record (KC_CUT),
 * and without the 4 bytes of padding after nr (the consumer's
 * sysRingOff): the entry, nr at 6, the arguments or ret from 10. Every
 * field follows the one before, so the consumer writes the record into
 * the trace as it is.
 */
struct kc_sys_rec {
	struct kc_rec hdr;
	__u8 data[KC_ENTRY_SIZE + 4 + 8 * 6];
};
_Static_assert(sizeof(struct kc_sys_rec) <= KC_SAMPLED_MAX, "syscall records are sampled");

#define KC_SYS_NR KC_ENTRY_SIZE
#define KC_SYS_ARG(i) (KC_ENTRY_SIZE + 4 + 8 * (i))

/* A syscall's six arguments, as the raw_syscalls:sys_enter record holds them. */
struct kc_sys_args {
	__u64 v[6];
};

/*
 * kc_sys_fill writes at data, a syscall record's payload, the part that
 * words (the ring record's size in 8-byte words, a constant at each call)
 * covers: the number, and the arguments on entry or ret on exit. Only stores inside
 * the reservation are made, which the verifier checks.
 */
static __always_inline void kc_sys_fill(void *data, __u32 words, struct pt_regs *regs, const struct kc_sys_args *a, long nr, __u32 exit, long ret)
{
	kc_put(__s32, data, KC_SYS_NR, nr);
	if (exit) {
		if (words > 2)
			kc_put(__u64, data, KC_SYS_ARG(0), ret);
		return;
	}
	if (a) {
		/* The perf tracepoint's record: its arguments already read. */
		if (words > 2)
			kc_put(__u64, data, KC_SYS_ARG(0), a->v[0]);
		if (words > 3)
			kc_put(__u64, data, KC_SYS_ARG(1), a->v[1]);
		if (words > 4)
			kc_put(__u64, data, KC_SYS_ARG(2), a->v[2]);
		if (words > 5)
			kc_put(__u64, data, KC_SYS_ARG(3), a->v[3]);
		if (words > 6)
			kc_put(__u64, data, KC_SYS_ARG(4), a->v[4]);
		if (words > 7)
			kc_put(__u64, data, KC_SYS_ARG(5), a->v[5]);
		return;
	}
	if (words > 2)
		kc_put(__u64, data, KC_SYS_ARG(0), regs->di);
	if (words > 3)
		kc_put(__u64, data, KC_SYS_ARG(1), regs->si);
	if (words > 4)
		kc_put(__u64, data, KC_SYS_ARG(2), regs->dx);
	if (words > 5)
		kc_put(__u64, data, KC_SYS_ARG(3), regs->r10);
	if (words > 6)
		kc_put(__u64, data, KC_SYS_ARG(4), regs->r8);
	if (words > 7)
		kc_put(__u64, data, KC_SYS_ARG(5), regs->r9);
}

/*
 * bpf_ringbuf_reserve takes only a constant size, so each record size a
 * syscall event can have (2 to 8 words) gets a reservation of its own.
 */
#define KC_SYS_RESERVE(w)                                                         \
	case w:                                                                   \
		r = (void *)kc_reserve(ring, st, cpu, sizeof(struct kc_rec) + 8 * (w), &res); \
		if (r)                                                            \
			kc_sys_fill(r->data, w, regs, a, nr, exit, ret);          \
		break;

/*
 * kc_sys_emit writes the syscall event key, number nr, of the thread pid:
 * on entry (exit 0) with the arguments in regs, on exit with ret, if the
 * filters pass; id and tsize are the event's kc_tp_info.id and .size.
 * The record is built in place in the ring, with no copy through the
 * stack. Its callers can nest with kc_tracepoint on one CPU
 * (a raw tracepoint or trampoline guards only against its own program,
 * kernel/trace/bpf_trace.c:__bpf_trace_run) and run preemptibly on
 * kernels with faultable syscall tracepoints, so it counts with atomic
 * adds.
 */
static __always_inline void kc_sys_emit(struct pt_regs *regs, const struct kc_sys_args *a, __u32 key, __u16 id, __u32 tsize, long nr, __u32 exit, long ret, __s32 pid)
{
	struct kc_sys_rec *r = NULL;
	struct kc_cpu_state *st;
	__u32 cpu, size;
	struct kc_resv res = {};
	void *ring;

	if (!kc_pass())
		return;
	st = kc_cpu_ring(&cpu, &ring);
	if (!st)
		return;
	/* 12 bytes without arguments (no padding then), else 16 + 8 per argument. */
	size = tsize - KC_CUT;
	if (size > KC_SYS_ARG(0))
		size -= 4;
	if (kc_pkt_on) {
		r = (void *)kc_reserve_pkt(st, cpu, key, size, KC_EVH_EXT + sizeof(r->data), &res);
		if (r)
			kc_sys_fill(r, (size + 7) / 8, regs, a, nr, exit, ret);
		goto reserved;
	}
	switch ((size + 7) / 8) {
	KC_SYS_RESERVE(2)
	KC_SYS_RESERVE(3)
	KC_SYS_RESERVE(4)
	KC_SYS_RESERVE(5)
	KC_SYS_RESERVE(6)
	KC_SYS_RESERVE(7)
	KC_SYS_RESERVE(8)
	default:
		return; /* not a syscall record: the loader never maps one here */
	}
reserved:
	if (!r) {
		__sync_fetch_and_add(&st->lost, 1);
		return;
	}
	kc_put_entry(kc_pkt_on ? (void *)r : (void *)r->data, id, pid);
	kc_submit(ring, &r->hdr, st, key, size, cpu, &res, 1, 0);
}

/*
 * kc_sys_record writes the syscall event for nr, if it is recorded, as
 * kc_sys_emit: the raw path's dispatch by syscall number.
 */
static __always_inline void kc_sys_record(struct pt_regs *regs, const struct kc_sys_args *a, long nr, __u32 exit, long ret)
{
	struct kc_sys_key *k;
	__u32 slot;
	__s32 pid;

	if ((__u64)nr >= KC_SYS_MAX || !kc_running)
		return;
	slot = exit * KC_SYS_MAX + nr;
	k = bpf_map_lookup_elem(&kc_sys_keys, &slot);
	if (!k || !k->key)
		return;
	pid = kc_sys_task();
	if (pid < 0)
		return;
	kc_sys_emit(regs, a, k->key - 1, k->id, k->size, nr, exit, ret, pid);
}

SEC("tp_btf/sys_enter")
int kc_sys_enter(__u64 *ctx)
{
	kc_sys_record((struct pt_regs *)ctx[0], NULL, (long)ctx[1], 0, 0);
	return 0;
}

SEC("tp_btf/sys_exit")
int kc_sys_exit(__u64 *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx[0];

	/* trace_syscalls.c:ftrace_syscall_exit: the number is orig_ax. */
	kc_sys_record(regs, NULL, regs->orig_ax, 1, (long)ctx[1]);
	return 0;
}

/*
 * The raw path from the perf tracepoints raw_syscalls:sys_enter and
 * sys_exit, for kernels where tracepoint and trampoline programs run
 * preemptibly (Linux 7.x with PREEMPT_RCU: tracepoints under SRCU-fast,
 * include/linux/tracepoint.h; __bpf_trace_run keeps only migration off,
 * kernel/trace/bpf_trace.c). There a task preempted inside kc_sys_enter
 * holds its per-CPU recursion guard (bpf_prog_get_recursion_context), and
 * the kernel skips every run of it on that CPU until the task runs again:
 * another task's events are lost, a quarter of them with two busy tasks
 * a CPU. perf_trace_##call keeps preemption off around its program
 * (include/trace/perf.h, guard(preempt_notrace)), as ftrace's own probes
 * do, so these run to their end before another task does; their guard,
 * bpf_prog_active, a CPU's for all such programs, is held only across a
 * nested interrupt's run. They cost more than kc_sys_enter (perf builds
 * its record first), so the loader takes them only there.
 */
struct kc_raw_sys_enter {
	__u64 common; /* the common fields; perf puts its regs pointer here */
	long id;
	struct kc_sys_args args;
};

struct kc_raw_sys_exit {
	__u64 common;
	long id;
	long ret;
};

SEC("tracepoint/raw_syscalls/sys_enter")
int kc_sys_enter_tp(struct kc_raw_sys_enter *ctx)
{
	struct kc_sys_args a = ctx->args;

	kc_sys_record(NULL, &a, ctx->id, 0, 0);
	return 0;
}

SEC("tracepoint/raw_syscalls/sys_exit")
int kc_sys_exit_tp(struct kc_raw_sys_exit *ctx)
{
	kc_sys_record(NULL, NULL, ctx->id, 1, ctx->ret);
	return 0;
}

/*
 * kc_sys_user_keys maps a syscall number to the event key + 1 of its
 * sys_enter event where that event has user-space fields (kc_sys_user)
 * and is recorded, else to 0.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, KC_SYS_MAX);
	__type(key, __u32);
	__type(value, __u32);
} kc_sys_user_keys SEC(".maps");

extern int bpf_copy_from_user_str(void *dst, __u32 dst__sz, const void *unsafe_ptr__ign, __u64 flags) __ksym;

/* kc_reg_arg returns syscall argument i (0 to 5) from regs (syscall_get_arguments). */
static __always_inline __u64 kc_reg_arg(struct pt_regs *regs, __u32 i)
{
	switch (i) {
	case 0:
		return regs->di;
	case 1:
		return regs->si;
	case 2:
		return regs->dx;
	case 3:
		return regs->r10;
	case 4:
		return regs->r8;
	}
	return regs->r9;
}

extern void bpf_preempt_disable(void) __ksym;
extern void bpf_preempt_enable(void) __ksym;

/*
 * Set by the loader where kc_sys_user_fault records the events it pages
 * memory in for (kc_sys_user_emit), so that they need no tracepoint of
 * their own: not under a cgroup filter, which a sleepable program cannot
 * test, nor with --syscalls tracepoint.
 */
const volatile __u32 kc_sys_user_rec = 0;

/*
 * kc_sys_user_fault's scratch: slot 0 the record (a struct kc_scratch
 * heads a struct kc_ctf), slot 1 packet mode's build of it, and before
 * that the bytes the paging-in copies read and drop. Not kc_scratch_map
 * or kc_ctf_map: a perf program of an interrupt may use those while this
 * one builds a record.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct kc_ctf);
} kc_sys_user_scratch SEC(".maps");

/*
 * kc_sys_user_emit records the entry event key of syscall nr, with
 * info, from the registers: as kc_record builds it from perf's
 * context (the number, 4 bytes of padding, the arguments before the
 * user-space fields), then kc_sys_user fills the fields. Run with
 * preemption disabled: then no other run of kc_sys_user_fault shares
 * this CPU's scratch, and interrupts, which never enter a syscall, do
 * not run it.
 */
static __always_inline void kc_sys_user_emit(struct pt_regs *regs, long nr, __u32 key, struct kc_tp_info *info)
{
	__u32 zero = 0, cpu, size;
	struct kc_cpu_state *st;
	struct kc_scratch *s;
	int j;

	cpu = bpf_get_smp_processor_id();
	st = bpf_map_lookup_elem(&kc_state, &cpu);
	if (!st || st->disabled)
		return;
	s = bpf_map_lookup_elem(&kc_sys_user_scratch, &zero);
	if (!s)
		return;
	s->hdr.key = key;
	s->hdr.cpu = cpu;
	kc_put(__s32, s->data, KC_ENTRY_SIZE, nr);
	kc_put(__u32, s->data, KC_ENTRY_SIZE + 4, 0);
	/*
	 * All six, whatever the event's count: kc_sys_user writes the
	 * fields over those past it. A store per argument it has would
	 * have the verifier check the rest once for each count.
	 */
#pragma unroll
	for (j = 0; j < 6; j++)
		kc_put(__u64, s->data, 16 - KC_CUT + 8 * j, kc_reg_arg(regs, j));
	size = kc_sys_user(s->data, info);
	if (size < 16)
		return;
	kc_record_end(NULL, s, &kc_sys_user_scratch, 1, st, key, info, size - 8, 1);
}

/*
 * kc_sys_user_fault pages in the user memory that kc_sys_user will read
 * for a recorded syscall event with user-space fields, by copying it as
 * the kernel copies it for its own events (sys_fault_user): the program
 * is sleepable (Linux 7.x takes such programs on the faultable syscall
 * tracepoints), so its copy may fault, where kc_sys_user's cannot. The
 * loader makes it sleepable (BPF_F_SLEEPABLE: cilium/ebpf reads no
 * tp_btf.s section).
 *
 * With kc_sys_user_rec it then records the event itself, as the raw
 * path records the others: no perf tracepoint per event, whose
 * perf_syscall_enter costs more than the record, and each of whose
 * links costs record's stop a grace period. Otherwise the loader
 * attaches it before the events' tracepoints, and a tracepoint calls its
 * probes in the order they came (kernel/tracepoint.c, func_add), so it
 * runs before perf_syscall_enter runs kc_tracepoint.
 */
SEC("tp_btf/sys_enter")
int kc_sys_user_fault(__u64 *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	__u32 slot, key, *k, a, one = 1;
	struct kc_tp_info *info;
	long nr = ctx[1];
	__u64 cnt, id;
	__u8 *buf;
	int j;

	if (!kc_running || (__u64)nr >= KC_SYS_MAX)
		return 0;
	slot = nr;
	k = bpf_map_lookup_elem(&kc_sys_user_keys, &slot);
	/*
	 * No cgroup filter: a sleepable program may not use kc_pass's
	 * cgroup array (the loader keeps the tracepoints under one, and
	 * paging in what the syscall is about to read itself changes
	 * nothing for a task the filter leaves out).
	 */
	id = bpf_get_current_pid_tgid();
	if (!k || !*k || kc_sys_task() < 0 || (!kc_pass_pid(id) && !kc_pass_pid(id >> 32)))
		return 0;
	if (kc_sys_user_rec && !kc_pass_comm())
		return 0;
	key = *k - 1;
	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	/* Slot 1 holds nothing yet: the copies only page memory in. */
	buf = bpf_map_lookup_elem(&kc_sys_user_scratch, &one);
	if (!info || !(info->flags & KC_TP_SYSUSER) || !buf)
		return 0;
#pragma unroll
	for (j = 0; j < KC_SYS_USER_CNT; j++) {
		if (j >= info->user_n || !info->user_max)
			break;
		a = info->user_arg[j];
		if (info->user_len >= 0) {
			cnt = kc_reg_arg(regs, info->user_len);
			if (cnt > KC_SYS_USER_READ)
				cnt = KC_SYS_USER_READ;
			bpf_copy_from_user(buf, cnt, (const void *)kc_reg_arg(regs, a));
		} else {
			bpf_copy_from_user_str(buf, KC_SYS_USER_READ + 1, (const void *)kc_reg_arg(regs, a), 0);
		}
	}
	if (kc_sys_user_rec) {
		bpf_preempt_disable();
		kc_sys_user_emit(regs, nr, key, info);
		bpf_preempt_enable();
	}
	return 0;
}

/*
 * The function path: one copy of kc_sys_fentry (entry events) or
 * kc_sys_fexit (exit events) per recorded syscall event, attached to
 * that syscall's x86_64 entry point, __x64_sys_NAME, which the loader
 * names as the copy's target and whose event key and number it patches
 * in. A syscall that is not recorded runs no BPF at all, and the one
 * recorded skips the syscall tracepoints' slow path
 * (SYSCALL_WORK_SYSCALL_TRACEPOINT) and the raw dispatch. The 32-bit
 * syscalls and the x32 ones are left out, as the tracepoints leave them
 * out: x32 calls share the x86_64 entry points and are told by their
 * number's __X32_SYSCALL_BIT (arch/x86/include/uapi/asm/unistd.h),
 * 32-bit ones by TS_COMPAT (kc_sys_task).
 */
#define KC_NR_PLACEHOLDER 0x6b634e5253ULL
#define KC_X32_SYSCALL_BIT 0x40000000

static __always_inline long kc_sys_nr(void)
{
	__u64 nr;

	asm volatile("%0 = 0x6b634e5253 ll" : "=r"(nr));
	return nr;
}

static __always_inline void kc_sys_fn(struct pt_regs *regs, __u32 exit, long ret)
{
	struct kc_tp_info *info;
	__u32 key;
	__s32 pid;

	if (!kc_running || (regs->orig_ax & KC_X32_SYSCALL_BIT))
		return;
	/*
	 * A syscall without arguments has one body for both ABIs
	 * (__x64_sys_NAME and __ia32_sys_NAME alias __do_sys_NAME): the
	 * thread's TS_COMPAT tells a 32-bit call.
	 */
	pid = kc_sys_task();
	if (pid < 0)
		return;
	key = kc_patched_key();
	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	if (!info)
		return;
	kc_sys_emit(regs, NULL, key, info->id, info->size, kc_sys_nr(), exit, ret, pid);
}

SEC("fentry/__x64_sys_getpid")
int kc_sys_fentry(__u64 *ctx)
{
	kc_sys_fn((struct pt_regs *)ctx[0], 0, 0);
	return 0;
}

SEC("fexit/__x64_sys_getpid")
int kc_sys_fexit(__u64 *ctx)
{
	kc_sys_fn((struct pt_regs *)ctx[0], 1, (long)ctx[1]);
	return 0;
}
#endif

#ifndef KC_PERF
/*
 * sched:sched_switch from its BTF tracepoint (tp_btf): the program reads
 * the arguments the kernel passes the tracepoint and builds the record
 * TP_fast_assign builds (include/trace/events/sched.h), 64 bytes on every
 * kernel since 4.x (the consumer checks the format before it attaches
 * this). It skips the perf trace record the classic tracepoint builds
 * for BPF, and perf's bpf_prog_active guard (kernel/trace/bpf_trace.c:
 * trace_call_bpf), which drops the event whenever any other BPF program
 * of that kind holds the CPU: a tp_btf program guards only against
 * itself (__bpf_trace_run).
 */

/* sched_switch's event key and trace event id (common_type); set before load. */
const volatile __u32 kc_switch_key = 0;
const volatile __u32 kc_switch_id = 0;

/*
 * Set when the tracepoint passes prev_state as its 4th argument (5.18+,
 * commit fa2c3254d7cf, moved last by 9c2136be0878); before, the state is
 * read from the task.
 */
const volatile __u32 kc_switch_state_arg = 0;

/* task_struct before 5.14 (2f064a59a11f renamed state to __state). */
struct task_struct___kc_old {
	long state;
} __attribute__((preserve_access_index));

/*
 * kc_switch_state returns the prev_state field as __trace_sched_switch_state
 * computes it: TASK_REPORT_MAX (0x100) when preempted, else the highest bit
 * of the reported state (TASK_REPORT, 0x7f), TASK_REPORT_IDLE (0x80) for
 * TASK_IDLE, and TASK_UNINTERRUPTIBLE for TASK_RTLOCK_WAIT or TASK_FROZEN
 * (5.18+, include/linux/sched.h:__task_state_index; the masked idle test
 * and TASK_FROZEN since 6.6 and 6.13, backported to 6.1.123 and 6.12.8).
 */
static __always_inline long kc_switch_state(__u64 *ctx, struct task_struct *prev)
{
	__u32 st, r;

	if (ctx[0])
		return 0x100;
	if (kc_switch_state_arg) {
		st = ctx[3];
		r = (st | prev->exit_state) & 0x7f;
		if ((st & 0x402) == 0x402)
			r = 0x80;
		if (st & (0x1000 | 0x8000))
			r = 2;
	} else {
		st = BPF_CORE_READ((struct task_struct___kc_old *)prev, state);
		r = (st | prev->exit_state) & 0x7f;
		if (st == 0x402)
			r = 0x80;
	}
	/* The highest set bit of r, or 0 (fls, then 1 << (idx - 1)). */
	r |= r >> 1;
	r |= r >> 2;
	r |= r >> 4;
	return r - (r >> 1);
}

/*
 * kc_put_comm copies a task's 16-byte comm as the kernel's memcpy does,
 * bytes after the NUL included.
 */
#define kc_put_comm(d, off, t)                                                    \
	({                                                                        \
		kc_put(__u64, d, off, *(__u64 *)&(t)->comm[0]);                   \
		kc_put(__u64, d, (off) + 8, *(__u64 *)&(t)->comm[8]);             \
	})

/*
 * kc_btf_begin starts a BTF program's record: it passes the gate and the
 * filters and reserves a record of size payload bytes (a constant) in
 * this CPU's ring. It returns the record, with the ring (as kc_cpu_ring
 * gives it), this CPU and its state in *ring, *cpu and *st, or NULL when
 * there is none to write (a full ring's record counted as lost).
 */
static __always_inline struct kc_rec *kc_btf_begin(__u32 size, __u32 key, __u32 len, void **ring, __u32 *cpu, struct kc_cpu_state **st, struct kc_resv *res)
{
	struct kc_rec *r;

	if (!kc_running || !kc_pass())
		return NULL;
	*st = kc_cpu_ring(cpu, ring);
	if (!*st)
		return NULL;
	if (kc_pkt_on)
		r = kc_reserve_pkt(*st, *cpu, key, len, KC_EVH_EXT + size, res);
	else
		r = kc_reserve(*ring, *st, *cpu, sizeof(*r) + size, res);
	if (!r)
		__sync_fetch_and_add(&(*st)->lost, 1);
	return r;
}

SEC("tp_btf/sched_switch")
int kc_btf_switch(__u64 *ctx)
{
	struct task_struct *prev = (void *)ctx[1], *next = (void *)ctx[2];
	struct kc_cpu_state *st;
	struct kc_rec *r;
	struct kc_resv res = {};
	void *ring, *d;
	__u32 cpu;

	r = kc_btf_begin(64, kc_switch_key, 64 - KC_CUT, &ring, &cpu, &st, &res);
	if (!r)
		return 0;
	/* The ring record: the trace record's offsets less KC_CUT. */
	d = kc_rec_data(r);
	kc_put_comm(d, 8 - KC_CUT, prev);
	kc_put(__s32, d, 24 - KC_CUT, prev->pid);
	kc_put(__s32, d, 28 - KC_CUT, prev->prio);
	kc_put(__s64, d, 32 - KC_CUT, kc_switch_state(ctx, prev));
	kc_put_comm(d, 40 - KC_CUT, next);
	kc_put(__s32, d, 56 - KC_CUT, next->pid);
	kc_put(__s32, d, 60 - KC_CUT, next->prio);
	/* common_pid is current's: the task switched out. */
	kc_put_entry(d, kc_switch_id, prev->pid);
	/*
	 * Atomic adds: a classic tracepoint's program preempted on this CPU
	 * (7.x runs them preemptible) may be between its load and store.
	 */
	/* A switch into one of the consumer's threads is the consumer's own. */
	kc_submit(ring, r, st, kc_switch_key, 64 - KC_CUT, cpu, &res, 1, next->tgid == kc_self_tgid);
	return 0;
}

/*
 * sched:sched_waking, sched_wakeup and sched_wakeup_new from their BTF
 * tracepoints, as kc_btf_switch: the record of sched_wakeup_template
 * (include/trace/events/sched.h): comm, pid, prio, target_cpu, and on
 * older kernels (5.10 among them) a success field, always 1, before
 * target_cpu.
 */

/* Event keys and trace event ids of the three events; set before load. */
const volatile __u32 kc_waking_key = 0, kc_waking_id = 0;
const volatile __u32 kc_wakeup_key = 0, kc_wakeup_id = 0;
const volatile __u32 kc_wakeup_new_key = 0, kc_wakeup_new_id = 0;

/* The record has the success field (40 bytes instead of 36). */
const volatile __u32 kc_wake_success = 0;

/* task_struct before 5.16 (bcf9033e5449 moved cpu into thread_info). */
struct task_struct___kc_cpu {
	unsigned int cpu;
} __attribute__((preserve_access_index));

/* kc_task_cpu returns task_cpu(p). */
static __always_inline __s32 kc_task_cpu(struct task_struct *p)
{
	if (bpf_core_field_exists(p->thread_info.cpu))
		return p->thread_info.cpu;
	return BPF_CORE_READ((struct task_struct___kc_cpu *)p, cpu);
}

/*
 * kc_wake records the wakeup of p as event key with trace event id. It
 * can run with interrupts on (try_to_wake_up of the current task), so
 * it counts with atomic adds.
 */
static __always_inline void kc_wake(struct task_struct *p, __u32 key, __u32 id)
{
	__u32 cpu, len = kc_wake_success ? 40 - KC_CUT : 36 - KC_CUT;
	struct kc_cpu_state *st;
	struct kc_rec *r;
	struct kc_resv res = {};
	void *ring, *d;

	r = kc_btf_begin(40, key, len, &ring, &cpu, &st, &res);
	if (!r)
		return;
	d = kc_rec_data(r);
	kc_put_comm(d, 8 - KC_CUT, p);
	kc_put(__s32, d, 24 - KC_CUT, p->pid);
	kc_put(__s32, d, 28 - KC_CUT, p->prio);
	if (kc_wake_success) {
		kc_put(__s32, d, 32 - KC_CUT, 1);
		kc_put(__s32, d, 36 - KC_CUT, kc_task_cpu(p));
	} else {
		kc_put(__s32, d, 32 - KC_CUT, kc_task_cpu(p));
	}
	/* common_pid is current's: the waker. */
	kc_put_entry(d, id, bpf_get_current_pid_tgid());
	/* The wakeup of one of the consumer's threads is the consumer's own. */
	kc_submit(ring, r, st, key, len, cpu, &res, 1, p->tgid == kc_self_tgid);
}

SEC("tp_btf/sched_waking")
int kc_btf_waking(__u64 *ctx)
{
	kc_wake((void *)ctx[0], kc_waking_key, kc_waking_id);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int kc_btf_wakeup(__u64 *ctx)
{
	kc_wake((void *)ctx[0], kc_wakeup_key, kc_wakeup_id);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int kc_btf_wakeup_new(__u64 *ctx)
{
	kc_wake((void *)ctx[0], kc_wakeup_new_key, kc_wakeup_new_id);
	return 0;
}

/*
 * task:task_rename from its BTF tracepoint, as kc_btf_switch: the record
 * TP_fast_assign builds (include/trace/events/task.h): pid, the old comm
 * (a memcpy of task->comm, still the old name when the tracepoint runs in
 * __set_task_comm), the new one (strlcpy, strscpy from 6.6: the string
 * and its NUL) and task->signal->oom_score_adj. pid is the task renamed,
 * which need not be current (a write to /proc/PID/comm); common_pid is
 * current's. Linux 6.14 to 6.17 had no pid field (e3f6a42272e0, reverted
 * in 7.0 and 6.18.y): kc_rename_pid is 0 there and the fields start at 8.
 */
const volatile __u32 kc_rename_key = 0, kc_rename_id = 0;
const volatile __u32 kc_rename_pid = 1;

/* KC_ONES and KC_HIGHS are 0x01 and 0x80 in every byte of a word. */
#define KC_ONES 0x0101010101010101ULL
#define KC_HIGHS 0x8080808080808080ULL

/*
 * kc_nul_flags returns 0 when the word w holds no NUL byte, else a word
 * whose lowest set bit is bit 7 of w's first NUL byte (Hacker's Delight
 * 6-1: the lowest flag is exact, those above it need not be).
 */
static __always_inline __u64 kc_nul_flags(__u64 w)
{
	return (w - KC_ONES) & ~w & KC_HIGHS;
}

extern void *bpf_rdonly_cast(const void *obj__ign, __u32 btf_id__k) __ksym __weak;

/* Bytes of a page that lie at or above any address's 4 KiB-aligned offset. */
#define KC_PAGE_MIN 4096

/*
 * kc_put_str16 writes at d + off the string at the kernel address src as
 * strscpy into 16 bytes writes it (at most 15 bytes and a NUL), with
 * zeroes after the NUL where the kernel leaves what the buffer held. It
 * reads 16 bytes at once, which costs less than the byte loop of
 * bpf_probe_read_kernel_str, which it falls back to where those 16 bytes
 * are not all readable (a short string before an unmapped page).
 *
 * Where the kernel lets a program load from memory it cannot vouch for
 * (bpf_rdonly_cast to void, Linux 6.17: the JIT turns each load into one
 * that reads 0 where it would fault, kernel/bpf/verifier.c,
 * BPF_FEAT_RDONLY_CAST_TO_VOID), two loads replace the helper call and
 * its page-fault bracket. They do so only where both words lie in the
 * 4 KiB page of the string's first byte, which is mapped: a load cannot
 * fault there, and a 0 read is a 0 held.
 */
static __always_inline void kc_put_str16(void *d, __u32 off, const char *src)
{
	__u64 w[2], z;
	const __u64 *p;

	if (bpf_core_enum_value_exists(enum bpf_features, BPF_FEAT_RDONLY_CAST_TO_VOID) &&
	    ((unsigned long)src & (KC_PAGE_MIN - 1)) <= KC_PAGE_MIN - sizeof(w)) {
		p = bpf_rdonly_cast(src, 0);
		w[0] = p[0];
		w[1] = p[1];
	} else if (bpf_probe_read_kernel(w, sizeof(w), src)) {
		kc_put(__u64, d, off, 0);
		kc_put(__u64, d, off + 8, 0);
		bpf_probe_read_kernel_str(d + off, 16, src);
		return;
	}
	/* Byte 15 is the NUL of a name of 15 bytes or more. */
	w[1] &= ~0ULL >> 8;
	z = kc_nul_flags(w[0]);
	if (z) {
		/* Keep the bytes below the first NUL: (lowest flag >> 7) - 1. */
		w[0] &= ((z & -z) >> 7) - 1;
		w[1] = 0;
	} else {
		z = kc_nul_flags(w[1]);
		w[1] &= ((z & -z) >> 7) - 1;
	}
	kc_put(__u64, d, off, w[0]);
	kc_put(__u64, d, off + 8, w[1]);
}

SEC("tp_btf/task_rename")
int kc_btf_rename(__u64 *ctx)
{
	struct task_struct *task = (void *)ctx[0];
	const char *comm = (void *)ctx[1];
	__u32 cpu, at = kc_rename_pid ? 12 - KC_CUT : 8 - KC_CUT;
	struct kc_cpu_state *st;
	struct kc_rec *r;
	struct kc_resv res = {};
	void *ring, *d;

	r = kc_btf_begin(48, kc_rename_key, at + 34, &ring, &cpu, &st, &res);
	if (!r)
		return 0;
	d = kc_rec_data(r);
	if (kc_rename_pid)
		kc_put(__s32, d, 8 - KC_CUT, task->pid);
	kc_put_comm(d, at, task);
	kc_put_str16(d, at + 16, comm);
	kc_put(__s16, d, at + 32, task->signal->oom_score_adj);
	kc_put_entry(d, kc_rename_id, bpf_get_current_pid_tgid());
	kc_submit(ring, r, st, kc_rename_key, at + 34, cpu, &res, 1, 0);
	return 0;
}
#endif

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

char LICENSE[] SEC("license") = "Dual BSD/GPL";
