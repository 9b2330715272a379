/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc_synth.h: synthetic events and klog from a user's own BPF program,
 * recorded by kconsume among the kernel's events.
 *
 *	#include "kc_synth.h"
 *
 *	KC_SYNTH_EVENT(open_slow, "pid_t pid; u64 ns; char[] path");
 *
 *	SEC("fexit/do_sys_openat2") int BPF_PROG(...)
 *	{
 *		struct kc_synth e;
 *
 *		if (!kc_synth_start(&e, open_slow))	// one branch when off
 *			return 0;
 *		kc_synth_s32(&e, pid);			// fields in definition order
 *		kc_synth_u64(&e, ns);
 *		kc_synth_str_user(&e, filename);
 *		kc_synth_end(ctx, &e);			// always, once started
 *		kc_klog(ctx, "slow open by %d", pid);	// Linux 5.13+
 *		return 0;
 *	}
 *
 * or all at once from a packed struct laid out as the definition:
 * kc_synth_emit(ctx, open_fixed, &val). Build with the include paths of
 * bpf/ and bpf/include, and `-DKC_PERF` for the perf transport; record with
 * `kconsume record --bpf prog.o`. The loader gives the object kconsume's
 * gate, rings and counters in place of its own, sets each kc_key_NAME to the
 * class of synthetic:NAME and attaches every program by its section.
 *
 * Payloads are the relayfmt encoding of the definition (relayfmt/FORMAT.md):
 * fields byte-aligned in order, integers little-endian (bool and char one
 * byte, long and unsigned long eight), char[N] and [N] arrays inline,
 * char[] a NUL-terminated string, a stack (unsigned long[]) a u32 count
 * then the addresses: kc_synth_stack. The consumer checks every
 * record against its class: one that does not match is counted as invalid
 * and reported in the stream as discarded, never written half.
 */
#ifndef KC_SYNTH_H
#define KC_SYNTH_H

#include "kconsume.h"

/* A kc_key_NAME the loader left alone: the event is not recorded. */
#define KC_NO_KEY 0xffffffffu

/* Contexts that can nest on one CPU: task, softirq, hardirq, NMI. */
#define KC_SYNTH_NEST 4

/* Longest string field, NUL included (synth.MaxString + 1 bounds it). */
#define KC_SYNTH_STR_MAX 1024

/* Longest klog message, NUL included. */
#define KC_KLOG_MAX 1024

/* Set by the loader: the number of possible CPUs (the user slots of kc_state). */
const volatile __u32 kc_ncpu = 0;

/* One scratch record per nesting level per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KC_SYNTH_NEST);
	__type(key, __u32);
	__type(value, struct kc_scratch);
} kc_synth_scratch SEC(".maps");

/*
 * This CPU's nesting depth. A nested program raises and restores it before
 * the one it interrupted resumes, so plain increments are safe.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} kc_synth_depth SEC(".maps");

/*
 * KC_SYNTH_EVENT declares synthetic event name with its fields in the
 * kernel's synthetic_events syntax. The definition travels in the object,
 * so `kconsume record --bpf` needs nothing else.
 */
#define KC_SYNTH_EVENT(name, fields)                            \
	const volatile __u32 kc_key_##name = KC_NO_KEY;         \
	const char kc_def_##name[] = #name " " fields

/* klog: one string field, built into kconsume. */
KC_SYNTH_EVENT(klog, "char[] msg");

/* struct kc_synth is one event being written; it lives on the BPF stack. */
struct kc_synth {
	struct kc_scratch *s;
	struct kc_cpu_state *st; /* this CPU's user slot of kc_state */
	__u32 *depth;
	__u32 off; /* payload bytes written */
	__u32 err; /* a field did not fit: the event is counted lost at end */
};

/*
 * __kc_synth_begin starts an event of class key. It returns 0, and the
 * event must not be ended, when the key is unset, the gate is closed, this
 * CPU's buffer is stopped, or the nesting is too deep (counted as lost).
 */
static __always_inline int __kc_synth_begin(struct kc_synth *e, __u32 key)
{
	__u32 zero = 0, cpu, slot, d;
	struct kc_cpu_state *own;

	if (key == KC_NO_KEY || !kc_running)
		return 0;
	cpu = bpf_get_smp_processor_id();
	own = bpf_map_lookup_elem(&kc_state, &cpu);
	if (!own || own->disabled)
		return 0;
	slot = kc_ncpu + cpu;
	e->st = bpf_map_lookup_elem(&kc_state, &slot);
	e->depth = bpf_map_lookup_elem(&kc_synth_depth, &zero);
	if (!e->st || !e->depth)
		return 0;
	d = *e->depth;
	if (d >= KC_SYNTH_NEST) {
		__sync_fetch_and_add(&e->st->lost, 1);
		return 0;
	}
	e->s = bpf_map_lookup_elem(&kc_synth_scratch, &d);
	if (!e->s)
		return 0;
	*e->depth = d + 1;
	e->s->hdr.key = key;
	e->s->hdr.cpu = cpu;
	e->off = 0;
	e->err = 0;
	return 1;
}

/* kc_synth_start starts an event of synthetic event name; see __kc_synth_begin. */
#define kc_synth_start(e, name) __kc_synth_begin(e, kc_key_##name)

/*
 * kc_synth_end stamps and outputs a started event, or counts it as lost
 * when a field did not fit or the ring was full. It returns 0 or a
 * negative errno and must be called exactly once per started event.
 */
static __always_inline long kc_synth_end(void *ctx, struct kc_synth *e)
{
	__u32 len = e->off;
	long err = -7; /* -E2BIG */

	if (!e->err && len <= KC_MAX_PAYLOAD - 1) {
		barrier_var(len);
		len &= KC_PAYLOAD_MASK;
		e->s->hdr.len = len;
		err = kc_output(ctx, e->s, sizeof(struct kc_rec) + len, e->st, 1, 1);
	}
	if (err)
		__sync_fetch_and_add(&e->st->lost, 1);
	else
		__sync_fetch_and_add(&e->st->emitted, 1);
	*e->depth -= 1;
	return err;
}

/* __kc_synth_room returns the write offset for n more bytes, or marks e failed. */
static __always_inline int __kc_synth_room(struct kc_synth *e, __u32 n)
{
	if (e->off > KC_MAX_PAYLOAD - 1 - n) {
		e->err = 1;
		return 0;
	}
	return 1;
}

#define __KC_SYNTH_INT(suffix, type)                                                    \
	static __always_inline void kc_synth_##suffix(struct kc_synth *e, type v)       \
	{                                                                               \
		__u32 off = e->off;                                                     \
		if (!__kc_synth_room(e, sizeof(type)))                                  \
			return;                                                         \
		off &= KC_PAYLOAD_MASK;                                                 \
		if (off > KC_MAX_PAYLOAD - sizeof(type))                                \
			return;                                                         \
		*(type *)(e->s->data + off) = v;                                        \
		e->off = off + sizeof(type);                                            \
	}

/* kc_synth_u8 … kc_synth_s64 append the next integer field (pid_t and int: s32). */
__KC_SYNTH_INT(u8, __u8)
__KC_SYNTH_INT(u16, __u16)
__KC_SYNTH_INT(u32, __u32)
__KC_SYNTH_INT(u64, __u64)
__KC_SYNTH_INT(s8, __s8)
__KC_SYNTH_INT(s16, __s16)
__KC_SYNTH_INT(s32, __s32)
__KC_SYNTH_INT(s64, __s64)

/*
 * kc_synth_bytes appends n bytes from src (BPF stack, map value or kernel
 * memory): a char[N] or [N] array field, or a packed run of fields. n must
 * be a constant or bounded for the verifier.
 */
static __always_inline void kc_synth_bytes(struct kc_synth *e, const void *src, __u32 n)
{
	__u32 off = e->off;

	if (n > KC_MAX_PAYLOAD - 1 || !__kc_synth_room(e, n))
		return;
	off &= KC_PAYLOAD_MASK;
	if (off > KC_MAX_PAYLOAD - 1 - n)
		return;
	if (bpf_probe_read_kernel(e->s->data + off, n, src))
		e->err = 1;
	e->off = off + n;
}

static __always_inline void __kc_synth_str(struct kc_synth *e, const void *src, int user)
{
	__u32 off = e->off;
	long n;

	if (!__kc_synth_room(e, KC_SYNTH_STR_MAX))
		return;
	off &= KC_PAYLOAD_MASK;
	if (off > KC_MAX_PAYLOAD - 1 - KC_SYNTH_STR_MAX)
		return;
	if (user)
		n = bpf_probe_read_user_str(e->s->data + off, KC_SYNTH_STR_MAX, src);
	else
		n = bpf_probe_read_kernel_str(e->s->data + off, KC_SYNTH_STR_MAX, src);
	if (n < 1 || n > KC_SYNTH_STR_MAX) {
		/* An unreadable string is recorded empty, as the kernel's "(fault)" would be noise. */
		e->s->data[off] = 0;
		n = 1;
	}
	e->off = off + n;
}

/* kc_synth_str appends a char[] field: the NUL-terminated kernel string at src. */
static __always_inline void kc_synth_str(struct kc_synth *e, const void *src)
{
	__kc_synth_str(e, src, 0);
}

/* kc_synth_str_user appends a char[] field read from user memory. */
static __always_inline void kc_synth_str_user(struct kc_synth *e, const void *src)
{
	__kc_synth_str(e, src, 1);
}

/* Most addresses of a stack field (synth.MaxStack). */
#define KC_SYNTH_STACK_MAX 64

/*
 * kc_synth_stack appends a stack field ("unsigned long[] NAME"): the
 * stack bpf_get_stack gives for ctx, the kernel's (flags 0) or the user's
 * (BPF_F_USER_STACK), at most KC_SYNTH_STACK_MAX addresses, recorded as
 * a u32 count and the 8-byte addresses. A stack that cannot be read is
 * recorded empty: a syscalls tracepoint on Linux 6.1 has only the user's
 * registers, so no kernel stack; a raw_tp or kprobe has it.
 * ctx must be the program's context.
 */
static __always_inline void kc_synth_stack(void *ctx, struct kc_synth *e, __u64 flags)
{
	__u32 off = e->off;
	long n;

	if (!__kc_synth_room(e, 4 + KC_SYNTH_STACK_MAX * 8))
		return;
	off &= KC_PAYLOAD_MASK;
	if (off > KC_MAX_PAYLOAD - 1 - 4 - KC_SYNTH_STACK_MAX * 8)
		return;
	n = bpf_get_stack(ctx, e->s->data + off + 4, KC_SYNTH_STACK_MAX * 8, flags);
	if (n < 0)
		n = 0;
	n /= 8;
	if (n > KC_SYNTH_STACK_MAX)
		n = KC_SYNTH_STACK_MAX;
	*(__u32 *)(e->s->data + off) = n;
	e->off = off + 4 + n * 8;
}

/*
 * kc_synth_emit writes event name all at once from *val, a packed struct
 * laid out as its definition. Returns 0, a negative errno (counted as
 * lost), or 1 when the event is not being recorded.
 */
#define kc_synth_emit(ctx, name, val) __kc_synth_emit(ctx, kc_key_##name, val, sizeof(*(val)))

static __always_inline long __kc_synth_emit(void *ctx, __u32 key, const void *val, __u32 n)
{
	struct kc_synth e;

	if (!__kc_synth_begin(&e, key))
		return 1;
	kc_synth_bytes(&e, val, n);
	return kc_synth_end(ctx, &e);
}

/*
 * kc_klog_write writes a klog event holding the text at buf (kernel or BPF
 * memory), at most n bytes, ending at its first NUL. Returns as kc_synth_emit.
 */
static __always_inline long kc_klog_write(void *ctx, const void *buf, __u32 n)
{
	struct kc_synth e;
	long r;

	if (!kc_synth_start(&e, klog))
		return 1;
	if (n > KC_KLOG_MAX - 1)
		n = KC_KLOG_MAX - 1;
	r = bpf_probe_read_kernel_str(e.s->data, n + 1, buf);
	if (r < 1) {
		e.s->data[0] = 0;
		r = 1;
	}
	e.off = r;
	return kc_synth_end(ctx, &e);
}

static __always_inline long __kc_klogf(void *ctx, const char *fmt, __u32 fmt_size, __u64 *args, __u32 args_size)
{
	struct kc_synth e;
	long r;

	if (!kc_synth_start(&e, klog))
		return 1;
	r = bpf_snprintf((char *)e.s->data, KC_KLOG_MAX, fmt, args, args_size);
	if (r < 0) {
		e.s->data[0] = 0;
		r = 1;
	}
	if (r > KC_KLOG_MAX)
		r = KC_KLOG_MAX; /* truncated: bpf_snprintf wrote KC_KLOG_MAX - 1 bytes and a NUL */
	e.off = r;
	return kc_synth_end(ctx, &e);
}

/*
 * kc_klog writes a klog event formatted by bpf_snprintf (Linux 5.13+; the
 * kernel's format rules: %d %u %x %s %p… with at most 12 arguments). When
 * klog is not recorded it costs the one branch of the gate.
 */
#define kc_klog(ctx, fmt, args...)                                              \
	({                                                                      \
		static const char ___fmt[] = fmt;                               \
		unsigned long long ___param[___bpf_narg(args)];                 \
		_Pragma("GCC diagnostic push")                                  \
		_Pragma("GCC diagnostic ignored \"-Wint-conversion\"")          \
		___bpf_fill(___param, args);                                    \
		_Pragma("GCC diagnostic pop")                                   \
		__kc_klogf(ctx, ___fmt, sizeof(___fmt), ___param, sizeof(___param)); \
	})

#endif /* KC_SYNTH_H */
