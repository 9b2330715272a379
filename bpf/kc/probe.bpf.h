/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/probe.bpf.h: dynamic probes, kprobes, kretprobes, uprobes and
 * uretprobes (kc_probe): the record the kernel's own probe event of the
 * same fetch arguments holds (kernel/trace/trace_kprobe.c,
 * trace_uprobe.c, and trace_probe_tmpl.h: store_trace_args), built
 * from the registers and memory by the steps the consumer compiled the
 * arguments into (consumer/probe).
 */
#ifndef KC_PROBE_BPF_H
#define KC_PROBE_BPF_H

#include "kc/event.h"
#include "kc/fields.h"
#include "kc/record.h"
#include "kc/stack.h"

#ifndef KC_PERF

#define KC_PROBE_ARGS 12  /* probe.MaxArgs */
#define KC_PROBE_DEREFS 4 /* probe.MaxDerefs */
#define KC_PROBE_REGS 32  /* words read from struct pt_regs (x86-64 has 21) */
#define KC_PROBE_STR 4096 /* a string's bytes with its NUL: MAX_STRING_SIZE (PATH_MAX) */
#define KC_PROBE_FIXED 256 /* the most bytes before the dynamic area */

/* Where an argument's value starts (probe.Base). */
#define KC_PB_REG 0
#define KC_PB_STACK 1
#define KC_PB_RETVAL 2
#define KC_PB_COMM 3
#define KC_PB_IMM 4
#define KC_PB_MEM 5
#define KC_PB_FARG 6 /* fentry/fexit: the function's argument n (bpf_get_func_arg) */

/*
 * struct kc_probe_arg is one fetch argument: its base (n: the register's
 * word in pt_regs, the stack word or -1 for the stack pointer, the
 * constant, the address), the dereferences applied in turn, and where
 * and how its field is stored: size bytes at off of the trace record, or
 * a string (size 0) behind a __data_loc there. user says which memory
 * accesses read the process's memory rather than the kernel's: bit 0
 * the base's, bit j + 1 dereference j's, KC_PU_STR the string's.
 */
struct kc_probe_arg {
	__s64 n;
	__s32 deref[KC_PROBE_DEREFS];
	__u16 off;
	__u8 base;
	__u8 nderef;
	__u8 size;
	__u8 user;
	__u8 pad[2];
};

#define KC_PU_STR 0x80

/*
 * struct kc_probe_def is a probe event: its arguments, the trace record's
 * bytes before its dynamic area, whether it fires on return (then
 * __probe_func and __probe_ret_ip head the record, else __probe_ip),
 * the registers' words that hold the instruction pointer, the stack
 * pointer and a return value, and whether the probed address (a
 * kprobe's __probe_ip, a return probe's __probe_func) comes from
 * bpf_get_func_ip (a kprobe's kp.addr, as trace_kprobe.c writes it; a
 * uprobe's needs Linux 6.6) rather than the instruction pointer.
 */
struct kc_probe_def {
	__u16 nargs;
	__u16 fixed;
	__u8 ret;
	__u8 ip_reg;
	__u8 sp_reg;
	__u8 ret_reg;
	__u8 func_ip; /* the probed address from bpf_get_func_ip, not the registers */
	__u8 pad[7];
	struct kc_probe_arg args[KC_PROBE_ARGS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* set to the number of events at load */
	__type(key, __u32);     /* event key */
	__type(value, struct kc_probe_def);
} kc_probe_map SEC(".maps");

/*
 * kc_probe's scratch: slot 0 the record (a struct kc_scratch heads a
 * struct kc_ctf), slot 1 packet mode's build of it. Not kc_scratch_map:
 * a uprobe's program runs with preemption on in recent kernels
 * (bpf_prog_run_array_uprobe), where a tracepoint's program on the same
 * CPU would write over its record. busy keeps two runs of it apart: a
 * plain load and store (BPF_FETCH atomics need Linux 5.12 and clang's
 * -mcpu=v3), so a run preempted between the two, a window of two
 * instructions, is the one case it misses.
 */
struct kc_probe_scratch {
	struct kc_ctf rec;
	__u64 regs[KC_PROBE_REGS];
	__u32 busy;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct kc_probe_scratch);
} kc_probe_scratch SEC(".maps");

/* kc_context_probe: kc/context.h. */
__noinline __u32 kc_context_probe(__u32 off, __u32 bits)
{
	/* Its record, rec, is the value's first member. */
	return kc_context_at(&kc_probe_scratch, off, bits);
}

/* kc_probe_read reads n bytes at addr, of the process or the kernel. */
static __always_inline long kc_probe_read(void *dst, __u32 n, __u64 addr, int user)
{
	if (user)
		return bpf_probe_read_user(dst, n, (const void *)addr);
	return bpf_probe_read_kernel(dst, n, (const void *)addr);
}

/*
 * kc_probe_word reads the size bytes (the word, at most) at addr, of
 * the process or the kernel, into *v.
 */
static __always_inline long kc_probe_word(__u64 *v, __u64 addr, __u32 size, int user)
{
	*v = 0;
	/* Constant sizes: the verifier would lose a clamped one's bound. */
	if (size >= 8)
		return kc_probe_read(v, 8, addr, user);
	if (size >= 4)
		return kc_probe_read(v, 4, addr, user);
	if (size >= 2)
		return kc_probe_read(v, 2, addr, user);
	return kc_probe_read(v, 1, addr, user);
}

/*
 * kc_probe_value returns argument a's value, fetched from regs and the
 * process's memory, into *v; the last dereference reads only the
 * field's size, as the kernel's probe_mem_read does. A string's last
 * memory access only gives its address: the string is read there
 * (trace_probe.c turns it into a store of the string). tracing, a
 * constant, is set for the fentry and fexit programs, which have the
 * function's arguments and no registers. It returns nonzero when a read
 * faulted.
 */
static __always_inline int kc_probe_value(void *ctx, struct kc_probe_def *p, struct kc_probe_arg *a, __u64 *regs, __u64 *v, const int tracing)
{
	__u32 size = a->size ? a->size : 8;
	int j;

	switch (a->base) {
	case KC_PB_REG:
		if (tracing)
			return 1;
		*v = regs[a->n & (KC_PROBE_REGS - 1)];
		break;
	case KC_PB_RETVAL:
		if (tracing)
			return bpf_get_func_ret(ctx, v) != 0;
		*v = regs[p->ret_reg & (KC_PROBE_REGS - 1)];
		break;
	case KC_PB_FARG:
		if (!tracing)
			return 1;
		/* A string's value is its address: no dereference follows. */
		if (bpf_get_func_arg(ctx, a->n, v))
			return 1;
		break;
	case KC_PB_STACK:
		if (tracing)
			return 1;
		*v = regs[p->sp_reg & (KC_PROBE_REGS - 1)];
		if (a->n >= 0 && kc_probe_word(v, *v + 8 * a->n, a->nderef ? 8 : size, a->user & 1))
			return 1;
		break;
	case KC_PB_IMM:
		*v = a->n;
		break;
	case KC_PB_MEM:
		*v = a->n;
		if (!(a->size == 0 && !a->nderef) && kc_probe_word(v, a->n, a->nderef ? 8 : size, a->user & 1))
			return 1;
		break;
	default:
		return 1;
	}
	for (j = 0; j < KC_PROBE_DEREFS; j++) {
		if (j >= a->nderef)
			break;
		if (j + 1 == a->nderef && a->size == 0) {
			*v += a->deref[j];
			break;
		}
		if (kc_probe_word(v, *v + a->deref[j], j + 1 == a->nderef ? size : 8, a->user & (2 << j)))
			return 1;
	}
	return 0;
}

/*
 * kc_probe_string writes, at dst of the trace record in d (a ring
 * record, KC_CUT bytes before), the string at addr of the process, or
 * the task's name for $comm, and returns its bytes with the NUL; a read
 * that faults stores nothing and returns 0 (the kernel's event then
 * holds an empty value too).
 */
static __always_inline __u32 kc_probe_string(__u8 *d, __u32 dst, struct kc_probe_arg *a, __u64 addr, int fault)
{
	long r;

	dst = (dst - KC_CUT) & (KC_PROBE_STR - 1);
	if (a->base == KC_PB_COMM && !a->nderef) {
		bpf_get_current_comm(d + dst, 16);
		r = bpf_probe_read_kernel_str(d + dst, 16, d + dst);
	} else if (fault) {
		return 0;
	} else if (a->user & KC_PU_STR) {
		r = bpf_probe_read_user_str(d + dst, KC_PROBE_STR, (const void *)addr);
	} else {
		r = bpf_probe_read_kernel_str(d + dst, KC_PROBE_STR, (const void *)addr);
	}
	return r > 0 ? r : 0;
}

/*
 * kc_probe_fill builds probe p's record into d (a ring record past its
 * entry) from regs and returns the trace record's size, or 0 for a
 * probe the loader never writes.
 */
static __always_inline __u32 kc_probe_fill(void *ctx, struct kc_probe_def *p, __u64 *regs, __u8 *d, const int tracing)
{
	__u32 end = p->fixed, n;
	struct kc_probe_arg *a;
	__u64 v, ip, func;
	int i, fault;

	if (end < 16 || end > KC_PROBE_FIXED)
		return 0;
	ip = tracing ? 0 : regs[p->ip_reg & (KC_PROBE_REGS - 1)];
	func = tracing || p->func_ip ? bpf_get_func_ip(ctx) : ip;
	if (p->ret) {
		kc_put(__u64, d, 8 - KC_CUT, func);
		kc_put(__u64, d, 16 - KC_CUT, ip);
	} else {
		kc_put(__u64, d, 8 - KC_CUT, func);
	}
	for (i = 0; i < KC_PROBE_ARGS; i++) {
		if (i >= p->nargs)
			break;
		a = &p->args[i];
		fault = kc_probe_value(ctx, p, a, regs, &v, tracing);
		n = (a->off - KC_CUT) & (KC_PROBE_FIXED - 1);
		switch (a->size) {
		case 0:
			if (end > KC_PROBE_STR - 1)
				return 0;
			n = kc_probe_string(d, end, a, v, fault);
			kc_put(__u32, d, (a->off - KC_CUT) & (KC_PROBE_FIXED - 1), (n << 16) | end);
			end += n;
			break;
		case 1:
			kc_put(__u8, d, n, fault ? 0 : v);
			break;
		case 2:
			kc_put(__u16, d, n, fault ? 0 : v);
			break;
		case 4:
			kc_put(__u32, d, n, fault ? 0 : v);
			break;
		default:
			kc_put(__u64, d, n, fault ? 0 : v);
		}
	}
	return end;
}

/*
 * kc_probe_run records probe event key: the program of every kind of
 * probe, tracing set (a constant) for fentry and fexit.
 */
static __always_inline int kc_probe_run(void *ctx, __u32 key, const int tracing)
{
	struct kc_probe_scratch *sc;
	struct kc_cpu_state *st;
	struct kc_tp_info *info;
	struct kc_scratch *s;
	struct kc_probe_def *p;
	__u32 zero = 0, cpu, size, tail;

	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	p = bpf_map_lookup_elem(&kc_probe_map, &key);
	if (!info || !p || !(info->flags & KC_TP_RECORD))
		return 0;
	cpu = bpf_get_smp_processor_id();
	st = bpf_map_lookup_elem(&kc_state, &cpu);
	sc = bpf_map_lookup_elem(&kc_probe_scratch, &zero);
	if (!st || st->disabled || !sc)
		return 0;
	if (sc->busy) {
		/* Another run on this CPU, preempted mid-record, holds it. */
		__sync_fetch_and_add(&st->lost, 1);
		return 0;
	}
	sc->busy = 1;
	if (!tracing && bpf_probe_read_kernel(sc->regs, 8 * KC_PROBE_REGS < sizeof(struct pt_regs) ? 8 * KC_PROBE_REGS : sizeof(struct pt_regs), ctx))
		goto out;
	s = (struct kc_scratch *)&sc->rec;
	s->hdr.key = key;
	s->hdr.cpu = cpu;
	size = kc_probe_fill(ctx, p, sc->regs, s->data, tracing);
	if (size < 16)
		goto out;
	size -= 8;
	if (!kc_fields_pass(key, s->data, KC_ENTRY_SIZE + size))
		goto out;
	tail = kc_tail(ctx, s->data, KC_ENTRY_SIZE + size, info, 1);
	kc_record_end(ctx, s, &kc_probe_scratch, 1, st, key, info, size, tail, 1);
out:
	sc->busy = 0;
	return 0;
}

SEC("kprobe")
int kc_probe(struct pt_regs *ctx)
{
	if (!kc_running || !kc_pass())
		return 0;
	return kc_probe_run(ctx, kc_event_key(ctx), 0);
}

/*
 * fentry and fexit probes: a copy of these per probe, attached to its
 * function (the loader sets AttachTo) with its key patched in (the
 * loader's patchImm of KC_KEY_PLACEHOLDER).
 */
SEC("fentry/kc_probe_stub")
int kc_fentry(__u64 *ctx)
{
	if (!kc_running || !kc_pass())
		return 0;
	return kc_probe_run(ctx, kc_patched_key(), 1);
}

SEC("fexit/kc_probe_stub")
int kc_fexit(__u64 *ctx)
{
	if (!kc_running || !kc_pass())
		return 0;
	return kc_probe_run(ctx, kc_patched_key(), 1);
}

#endif

#endif /* KC_PROBE_BPF_H */
