/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/core.h: what every kconsume BPF program shares: the record header
 * (struct kc_rec, shared with Go through bpf2go -type), the per-CPU state
 * the consumer maps (kc_state), the clock, the state gate (kc_running) and
 * the per-CPU scratch record.
 */
#ifndef KC_CORE_H
#define KC_CORE_H

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
	__u64 prod;     /* kc_area: this ring's producer position (the writers') */
	__u64 cons;     /* kc_area: this ring's consumer position (the consumer's) */
	__u64 last;     /* kc_pkt: the time of a record reserved before the next one */
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

/* kc_now returns the time on the clock kc_clock selects. */
static __always_inline __u64 kc_now(void)
{
	if (kc_clock == KC_CLOCK_TAI)
		return bpf_ktime_get_tai_ns();
	if (kc_clock == KC_CLOCK_BOOT)
		return bpf_ktime_get_boot_ns();
	return bpf_ktime_get_ns();
}

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

/* Room for kc/stack.h's KC_TAIL_ROOM, checked there. */
#define KC_SCRATCH_TAIL 2192

/* One scratch record per CPU, for variable-sized payloads. */
struct kc_scratch {
	struct kc_rec hdr;
	/*
	 * 8 bytes of slack: the recorder reads a trace record in behind the
	 * ring record's 6-byte entry, its size bounded only by
	 * KC_PAYLOAD_MASK in the verifier's eyes; then room for the call
	 * chains behind it (kc/stack.h, KC_TAIL_ROOM).
	 */
	__u8 data[KC_MAX_PAYLOAD + 8 + KC_SCRATCH_TAIL];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kc_scratch);
} kc_scratch_map SEC(".maps");

#endif /* KC_CORE_H */
