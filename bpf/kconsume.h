/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kconsume.h: the record header shared with Go (through bpf2go -type) and
 * the emit helpers every kconsume BPF program uses.
 *
 * A program calls kc_emit_begin() to pass the state gate and get a scratch
 * record, fills the payload, then kc_emit_end() to stamp and output it on
 * this CPU's ring (or the one global ring). Failures are counted per CPU in
 * kc_state, which the consumer maps and reads without a syscall.
 *
 * Transport is fixed at compile time: KC_PERF builds the perf event array
 * variant (kernels before 5.8), otherwise BPF ring buffers (5.8+). Both
 * objects come from the same source, so the record layout cannot drift.
 */
#ifndef KCONSUME_H
#define KCONSUME_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* Largest record payload; mirrors PERF_MAX_TRACE_SIZE (include/linux/trace_events.h). */
#define KC_MAX_PAYLOAD 8192
#define KC_PAYLOAD_MASK (KC_MAX_PAYLOAD - 1)

/* Clocks selectable at load time (kc_clock). */
enum kc_clock_id {
	KC_CLOCK_MONO = 0, /* bpf_ktime_get_ns: CLOCK_MONOTONIC */
	KC_CLOCK_BOOT = 1, /* bpf_ktime_get_boot_ns (5.8+): CLOCK_BOOTTIME */
	KC_CLOCK_TAI = 2,  /* bpf_ktime_get_tai_ns (6.1+): CLOCK_TAI */
};

/*
 * struct kc_rec heads every record in a ring. len counts the payload bytes
 * that follow the header; perf pads raw samples to 8 bytes, so the consumer
 * needs the true length from here, not from the transport.
 */
struct kc_rec {
	__u64 ts;  /* clock chosen by kc_clock, nanoseconds */
	__u32 key; /* event class key assigned by the consumer */
	__u16 len; /* payload bytes after this header */
	__u16 cpu; /* CPU that produced the record */
};

/*
 * struct kc_cpu_state is one CPU's slot of the mmapable kc_state array, a
 * cache line each so CPUs do not share lines. Only the owning CPU writes
 * emitted and lost; tracepoint and raw tracepoint programs never nest on one
 * CPU (bpf_prog_active, kernel/trace/bpf_trace.c), so plain adds suffice.
 */
struct kc_cpu_state {
	__u64 emitted;  /* records handed to the transport */
	__u64 lost;     /* reserve or output failures: records lost in the kernel */
	__u32 disabled; /* consumer's per-CPU record disable */
	__u32 armed;    /* KC_ARM_* bits the consumer sets before it sleeps */
	__u64 wakeups;  /* forced wakeups of the consumer */
	__u64 woke_at;  /* CLOCK_MONOTONIC of the last forced wakeup: how late the consumer ran */
	__u64 pad[3];
};

/*
 * What wakes a sleeping consumer (kc_cpu_state.armed): the unread data
 * reaching the watermark, or (with a latency bound) the first record of
 * another process, after which the consumer's timer picks the data up
 * within its latency. Records of the consumer's own process never wake
 * it that way: its own going to sleep (a sched_switch, an epoll_wait
 * syscall) would wake it again at once, and every wakeup would put more
 * of its own events into the trace.
 */
#define KC_ARM_FILL 1
#define KC_ARM_DATA 2

/* Set before load (rodata); the verifier prunes the branches not taken. */
const volatile __u32 kc_clock = KC_CLOCK_MONO;
const volatile __u32 kc_global = 0;         /* one shared ring at index 0 */
const volatile __u64 kc_wakeup_bytes = 0;   /* ringbuf: the watermark, in unread bytes */
const volatile __u64 kc_wakeup_mask = 0;    /* ringbuf: see kc_wakeup_flags */
const volatile __u32 kc_self_tgid = 0;      /* the consumer's process (KC_ARM_DATA) */

/* Largest record a sampled wakeup check may pass over (kc_wakeup_flags). */
#define KC_SAMPLED_MAX 256
_Static_assert(sizeof(struct kc_rec) + 8 * 16 <= KC_SAMPLED_MAX, "kc_record_small's records are sampled");

/*
 * The state gate the consumer flips: stopped costs this one load and branch.
 * It has a section of its own so that a user's program built on kc_synth.h
 * shares the recorder's gate: the loader hands that object this map in
 * place of its own (its .bss stays its own).
 */
volatile __u32 kc_running SEC(".data.kc_gate") = 0;

/*
 * Slot cpu belongs to the recorder; slot ncpu + cpu counts the records of
 * users' programs (kc_synth.h), which can nest on a CPU (fentry, tp_btf,
 * kprobes in interrupts) and so add atomically to a slot of their own.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1); /* set to twice the number of possible CPUs at load */
	__type(key, __u32);
	__type(value, struct kc_cpu_state);
} kc_state SEC(".maps");

/* One scratch record per CPU, for variable-sized payloads. */
struct kc_scratch {
	struct kc_rec hdr;
	/*
	 * 8 bytes of slack: the recorder reads a trace record in behind the
	 * ring record's 6-byte entry, its size bounded only by
	 * KC_PAYLOAD_MASK in the verifier's eyes.
	 */
	__u8 data[KC_MAX_PAYLOAD + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kc_scratch);
} kc_scratch_map SEC(".maps");

#ifdef KC_PERF
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} kc_perf SEC(".maps");
#else
struct kc_ringbuf {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096); /* replaced by the consumer's ring size */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1); /* set to the number of possible CPUs at load */
	__type(key, __u32);
	__array(values, struct kc_ringbuf);
} kc_rings SEC(".maps");
#endif

#ifndef KC_PERF
/*
 * kc_wakeup_flags returns the submit flags for the caller's record:
 * wake the consumer once it has drained and gone to sleep (armed) and the
 * unread data reaches the watermark (KC_ARM_FILL), or, when it asked for
 * it (KC_ARM_DATA), at the first record of a process other than its own;
 * one wakeup per sleep and never one per record (by default the kernel
 * wakes on every record written into a ring the consumer had caught up
 * with, kernel/bpf/ringbuf.c: bpf_ringbuf_commit). A consumer awake
 * costs one load and branch per record.
 *
 * Asking the ring for its fill is a helper call, which costs as much as
 * a tenth of a small record's recording; sampled callers, whose records
 * are at most KC_SAMPLED_MAX bytes, ask only when the low bits
 * kc_wakeup_mask of the slot's record count are clear. The loader sizes
 * the mask so that the records passed over fit well within the ring's
 * room above the watermark.
 *
 * pending is what the caller's record will add to the unread data: 0
 * once it is reserved (the producer position covers it), its size and
 * the ring's 8-byte header for bpf_ringbuf_output. Forcing a wakeup
 * disarms the slot; a caller whose record then fails to go out must
 * hand the wakeup back with kc_wakeup_unused, or the sleeping drainer
 * would sleep on.
 */
static __always_inline __u64 kc_wakeup_flags(void *ring, __u64 pending, struct kc_cpu_state *st, int atomic, int sampled)
{
	__u32 armed = st->armed;

	if (!armed)
		return BPF_RB_NO_WAKEUP;
	if ((armed & KC_ARM_DATA) && (__u32)(bpf_get_current_pid_tgid() >> 32) != kc_self_tgid)
		goto wake;
	if (!(armed & KC_ARM_FILL))
		return BPF_RB_NO_WAKEUP;
	if (sampled && (st->emitted & kc_wakeup_mask))
		return BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA) + pending < kc_wakeup_bytes)
		return BPF_RB_NO_WAKEUP;
wake:
	/* Racing writers may both wake it: one spare wakeup, no harm. */
	st->armed = 0;
	st->woke_at = bpf_ktime_get_ns();
	if (atomic)
		__sync_fetch_and_add(&st->wakeups, 1);
	else
		st->wakeups++;
	return BPF_RB_FORCE_WAKEUP;
}

/* kc_wakeup_unused re-arms st after a record given flags failed to go out. */
static __always_inline void kc_wakeup_unused(struct kc_cpu_state *st, __u64 flags, int atomic)
{
	if (flags != BPF_RB_FORCE_WAKEUP)
		return;
	st->armed = KC_ARM_FILL;
	if (atomic)
		__sync_fetch_and_add(&st->wakeups, -1);
	else
		st->wakeups--;
}
#endif

static __always_inline __u64 kc_now(void)
{
	if (kc_clock == KC_CLOCK_TAI)
		return bpf_ktime_get_tai_ns();
	if (kc_clock == KC_CLOCK_BOOT)
		return bpf_ktime_get_boot_ns();
	return bpf_ktime_get_ns();
}

/*
 * kc_emit_begin passes the gate and returns this CPU's scratch record with
 * its key set, or NULL when recording is off globally or on this CPU.
 */
static __always_inline struct kc_scratch *kc_emit_begin(__u32 key, struct kc_cpu_state **st)
{
	__u32 zero = 0, cpu;
	struct kc_scratch *s;

	if (!kc_running)
		return NULL;
	cpu = bpf_get_smp_processor_id();
	*st = bpf_map_lookup_elem(&kc_state, &cpu);
	if (!*st || (*st)->disabled)
		return NULL;
	s = bpf_map_lookup_elem(&kc_scratch_map, &zero);
	if (!s)
		return NULL;
	s->hdr.key = key;
	s->hdr.cpu = cpu;
	return s;
}

/*
 * kc_output hands size bytes of the stamped record s to the transport and
 * returns 0 or a negative errno; it counts only wakeups (in st).
 */
static __always_inline long kc_output(void *ctx, struct kc_scratch *s, __u32 size, struct kc_cpu_state *st, int atomic)
{
#ifdef KC_PERF
	return bpf_perf_event_output(ctx, &kc_perf, BPF_F_CURRENT_CPU, s, size);
#else
	__u32 idx = kc_global ? 0 : s->hdr.cpu;
	void *ring = bpf_map_lookup_elem(&kc_rings, &idx);

	__u64 flags;
	long err;

	if (!ring)
		return -2; /* -ENOENT: no ring for this CPU */
	flags = kc_wakeup_flags(ring, size + 8, st, atomic, 0);
	err = bpf_ringbuf_output(ring, s, size, flags);
	if (err)
		kc_wakeup_unused(st, flags, atomic);
	return err;
#endif
}

/*
 * kc_emit_at outputs len payload bytes of s stamped with ts. Returns 0 or
 * a negative errno, which has been counted in the CPU's lost counter.
 */
static __always_inline long kc_emit_at(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len, __u64 ts)
{
	long err;

	barrier_var(len);
	len &= KC_PAYLOAD_MASK;
	s->hdr.len = len;
	s->hdr.ts = ts;
	err = kc_output(ctx, s, sizeof(struct kc_rec) + len, st, 0);
	if (err)
		st->lost++;
	else
		st->emitted++;
	return err;
}

/*
 * kc_emit_end stamps the record and outputs len payload bytes of it. The
 * timestamp is read last, right before the output, which keeps the window
 * between clock read and ring position small; the consumer restores order
 * within a bounded window for what remains. Returns 0 or a negative errno,
 * which has been counted in the CPU's lost counter.
 */
static __always_inline long kc_emit_end(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len)
{
	return kc_emit_at(ctx, s, st, len, kc_now());
}

#endif /* KCONSUME_H */
