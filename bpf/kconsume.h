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
 * kc_area holds the recorder's own rings, when the loader sets kc_area_on
 * (x86_64, 5.12+ for BPF_CMPXCHG): one ring per CPU of kc_area_kmask + 1
 * elements of kc_area_esize bytes, adjacent in the map's memory, which the
 * consumer maps and reads in place. A BPF ring buffer takes a spinlock
 * with interrupts off for every reservation and another atomic for every
 * commit (kernel/bpf/ringbuf.c); here a record costs one compare-and-swap
 * of the ring's producer position, kept in the ring's kc_state slot with
 * the consumer position, which is also the fill to wake the consumer at.
 *
 * A record is an 8-byte header, then its payload, padded to 8 bytes: the
 * header holds the payload length (bits 0-29; KC_AREA_DISC marks padding
 * to skip) and, in the upper word, the lap of the ring the record was
 * written in plus one, (position >> kc_area_lshift) + 1, so that the
 * zeroes of memory never written are no record of the first lap. It is
 * stored last: on x86 the stores before it are seen first (TSO), so a
 * header with the ring's lap tells the consumer the whole record is
 * written. A record never crosses an element's end, which keeps every
 * store inside the element the verifier knows: a record that would is
 * preceded by padding up to the next element. The BPF ring buffer of the
 * CPU (kc_rings) then only carries the wakeups, a doorbell.
 *
 * Until a record's header is stored, its slot must not look like one: an
 * earlier lap's bytes there may be any word of a payload, a kc_rec's
 * key and length (whose upper half is the payload length on CPU 0) or a
 * syscall argument, and one whose upper half equals the lap would pass
 * for a written record. So the consumer zeroes the space it hands back
 * before it moves the consumer position (consumer/ringbuf.go: release):
 * free space is all zeroes, and a writer stores only inside the space
 * its compare-and-swap won. A writer cannot clear a slot it has not won:
 * a program nesting between its load of the position and its swap may
 * have written a record there.
 */
const volatile __u32 kc_area_on = 0;
const volatile __u64 kc_area_esize = 1 << 16; /* bytes per element: a power of two */
const volatile __u32 kc_area_eshift = 16;     /* log2(kc_area_esize) */
const volatile __u32 kc_area_kmask = 0;       /* elements per ring, less one */
const volatile __u64 kc_area_rsize = 1 << 16; /* bytes per ring */
const volatile __u32 kc_area_lshift = 16;     /* log2(kc_area_rsize) */

#define KC_AREA_HDR 8
#define KC_AREA_DISC (1U << 30) /* as BPF_RINGBUF_DISCARD_BIT */
/* The largest record: a scratch record of kc_output. */
#define KC_AREA_MAX (KC_AREA_HDR + sizeof(struct kc_rec) + KC_MAX_PAYLOAD)
/* Compare-and-swap attempts before a reservation counts as lost: only programs nesting on the CPU race. */
#define KC_AREA_TRIES 3

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 8); /* set to kc_area_esize at load */
	__uint(max_entries, 1); /* set to the CPUs times the elements per ring at load */
} kc_area SEC(".maps");

/* kc_area_lap returns the upper word of a header at position pos. */
static __always_inline __u64 kc_area_lap(__u64 pos)
{
	return ((pos >> kc_area_lshift) + 1) << 32;
}

/*
 * kc_area_reserve reserves a record of size payload bytes, padded to 8,
 * in ring idx, whose positions are in ps; max is a constant bound on
 * KC_AREA_HDR + the padded size, which the verifier needs. It returns the
 * record's header, with its position in *pos and, when ts is not NULL,
 * its timestamp in *ts, or NULL when the ring is full or the reservation
 * lost its races: the caller counts that as lost.
 *
 * The clock is read inside the compare-and-swap loop, after the producer
 * position it swaps, as LTTng's ring buffer reads it inside its
 * reservation (lib/ringbuffer/frontend_api.h): a program that nests
 * between the read and the swap (an interrupt's) moves the position, so
 * the swap fails and both are taken again. Each record stamped here is
 * thus stamped no earlier than the one before it in the ring, and the
 * consumer's reorder window has nothing to reorder.
 */
static __always_inline __u64 *kc_area_reserve(__u32 idx, struct kc_cpu_state *ps, __u32 size, __u32 max, __u64 *pos, __u64 *ts)
{
	__u64 old, at, off, pad, end, lim;
	__u32 elem;
	void *e;
	int i;

	for (i = 0; i < KC_AREA_TRIES; i++) {
		old = *(volatile __u64 *)&ps->prod;
		if (ts) {
			/* The clock after the position: no load may pass it. */
			asm volatile("" ::: "memory");
			*ts = kc_now();
		}
		off = old & (kc_area_esize - 1);
		pad = off > kc_area_esize - max ? kc_area_esize - off : 0;
		end = old + pad + KC_AREA_HDR + ((size + 7) & ~7);
		if (end - *(volatile __u64 *)&ps->cons > kc_area_rsize)
			return NULL;
		if (__sync_val_compare_and_swap(&ps->prod, old, end) == old)
			goto won;
	}
	return NULL;
won:
	if (pad) {
		elem = idx * (kc_area_kmask + 1) + ((old >> kc_area_eshift) & kc_area_kmask);
		e = bpf_map_lookup_elem(&kc_area, &elem);
		/*
		 * off is a multiple of 8 below the element's end: the mask
		 * changes nothing but tells the verifier (6.1's does not learn
		 * it from a comparison here).
		 */
		if (e)
			*(volatile __u64 *)(e + (off & (kc_area_esize - KC_AREA_HDR))) = kc_area_lap(old) | KC_AREA_DISC | (pad - KC_AREA_HDR);
	}
	at = old + pad;
	elem = idx * (kc_area_kmask + 1) + ((at >> kc_area_eshift) & kc_area_kmask);
	e = bpf_map_lookup_elem(&kc_area, &elem);
	off = at & (kc_area_esize - 1);
	lim = kc_area_esize - max;
	/*
	 * Never taken: at starts an element or fits before its end. Both
	 * sides stay in registers, so that the verifier bounds off by a
	 * comparison with a constant, which older ones need.
	 */
	barrier_var(lim);
	barrier_var(off);
	if (!e || off > lim)
		return NULL;
	*pos = at;
	return e + off;
}

/* kc_area_commit publishes the record of size payload bytes at hdr, position pos. */
static __always_inline void kc_area_commit(__u64 *hdr, __u64 pos, __u32 size)
{
	asm volatile("" ::: "memory");
	*(volatile __u64 *)hdr = kc_area_lap(pos) | size;
}

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
 *
 * own marks a record that is the consumer's although another task writes
 * it: the switch into one of its threads (written by the task switched
 * out, often the idle task), the wakeup of one (written by the waker, an
 * interrupt among them). Such a record never wakes the consumer for its
 * data: counted as another process's, the switch that brings the drainer
 * back from a sleep armed for data would wake it again, each drain
 * feeding the next (with --latency, a drain each latency period on an
 * idle machine, 7,000 of the recorder's own switches in 5 s).
 */
/* kc_wake_taken disarms st for a wakeup the caller is about to force, and counts it. */
static __always_inline void kc_wake_taken(struct kc_cpu_state *st, int atomic)
{
	/* Racing writers may both wake it: one spare wakeup, no harm. */
	st->armed = 0;
	st->woke_at = bpf_ktime_get_ns();
	if (atomic)
		__sync_fetch_and_add(&st->wakeups, 1);
	else
		st->wakeups++;
}

static __always_inline __u64 kc_wakeup_flags(void *ring, __u64 pending, struct kc_cpu_state *st, int atomic, int sampled, int own)
{
	__u32 armed = st->armed;

	if (!armed)
		return BPF_RB_NO_WAKEUP;
	if ((armed & KC_ARM_DATA) && !own && (__u32)(bpf_get_current_pid_tgid() >> 32) != kc_self_tgid)
		goto wake;
	if (!(armed & KC_ARM_FILL))
		return BPF_RB_NO_WAKEUP;
	if (sampled && (st->emitted & kc_wakeup_mask))
		return BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA) + pending < kc_wakeup_bytes)
		return BPF_RB_NO_WAKEUP;
wake:
	kc_wake_taken(st, atomic);
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

/*
 * kc_area_wake wakes the consumer of kc_area ring idx as kc_wakeup_flags
 * decides, when the writer of slot st has left the ring's producer
 * position at end (ps holds the ring's positions), by a record on the
 * ring's doorbell, its BPF ring buffer in kc_rings. Testing the fill
 * needs no helper call here, so every record tests it; the doorbell is
 * looked up only to ring it, so a record that wakes no one costs no
 * lookup of it.
 */
static __always_inline void kc_area_wake(__u32 idx, struct kc_cpu_state *st, struct kc_cpu_state *ps, __u64 end, int atomic, int own)
{
	__u32 armed = st->armed;
	void *ring;

	if (!armed)
		return;
	if ((armed & KC_ARM_DATA) && !own && (__u32)(bpf_get_current_pid_tgid() >> 32) != kc_self_tgid)
		goto wake;
	if (!(armed & KC_ARM_FILL) || end - *(volatile __u64 *)&ps->cons < kc_wakeup_bytes)
		return;
wake:
	ring = bpf_map_lookup_elem(&kc_rings, &idx);
	if (!ring)
		return;
	kc_wake_taken(st, atomic);
	if (bpf_ringbuf_output(ring, &end, sizeof(end), BPF_RB_FORCE_WAKEUP))
		kc_wakeup_unused(st, BPF_RB_FORCE_WAKEUP, atomic);
}

/*
 * Packet mode (kc_pkt_on, with kc_area_on): each element of a kc_area
 * ring is a CTF packet of the trace (relayfmt/FORMAT.md) that the writers
 * fill in place, as LTTng's ring buffer has its producers write the
 * sub-buffers (lib/ringbuffer/frontend_api.h), so that the consumer
 * writes whole elements to the file and reads no record.
 *
 * - A record is the trace's event: its compact header (id and the low 27
 *   bits of the time) or extended one (13 bytes), then the payload, with
 *   no padding. The compact header is taken when the time is within 2^27
 *   ns of kc_cpu_state.last, the time of a record reserved before this
 *   one, so within 2^27 of the one just before it in the packet, which is
 *   how a CTF reader rebuilds it.
 * - The writer that reserves an element's first bytes also reserves its
 *   packet header (KC_PKT_HDR bytes) and writes timestamp_begin; the
 *   rest of the header is the consumer's (relayfmt.Channel.PutPacket).
 * - A record that would start past the element's size less its bound
 *   (the max of kc_pkt_reserve) closes the element: its writer reserves
 *   the rest as padding, writes the packet's
 *   timestamp_end and content_size, and opens the next element. So does
 *   one that ends exactly at the element's end, without padding.
 * - Each writer adds (1 << 32) + the bytes it reserved in an element to
 *   its commit word (KC_PKT_COMMIT, packet_seq_num's place until the
 *   consumer writes the number), with an atomic add after its stores:
 *   programs preempted on faultable tracepoints nest in any order, so no
 *   one store can say the element is written. The element is complete
 *   when the low half equals its size, and the high half counts its
 *   records.
 * - Only an element's opener checks the consumer position: the element
 *   is then free up to its end.
 * - The consumer closes the open element at a flush and at the end with
 *   kc_pkt_flush, run on the ring's CPU.
 */
const volatile __u32 kc_pkt_on = 0;

#define KC_PKT_HDR 84     /* relayfmt.PacketHeaderSize */
#define KC_PKT_BEGIN 32   /* timestamp_begin */
#define KC_PKT_END 40     /* timestamp_end */
#define KC_PKT_CONTENT 48 /* content_size, in bits */
#define KC_PKT_COMMIT 64  /* the commit word, where packet_seq_num goes */
#define KC_EVH_COMPACT 4
#define KC_EVH_EXT 13
#define KC_EVH_MAX_ID 30 /* ids 31 and above take the extended header */
#define KC_EVH_TS_BITS 27
#define KC_PKT_SMALL 256 /* kc_output's records below this size take a bound of their own */

/* struct kc_pkt is a reservation of kc_pkt_reserve. */
struct kc_pkt {
	void *elem;  /* the element the record is in */
	__u64 end;   /* the producer position after the record */
	__u64 ts;    /* its time */
	__u32 bytes; /* bytes it reserved in elem: the record, and the packet header for an opener */
};

/* kc_pkt_elem returns ring idx's element at position pos, or NULL. */
static __always_inline void *kc_pkt_elem(__u32 idx, __u64 pos)
{
	__u32 elem = idx * (kc_area_kmask + 1) + ((pos >> kc_area_eshift) & kc_area_kmask);

	return bpf_map_lookup_elem(&kc_area, &elem);
}

/*
 * kc_pkt_close ends the packet elem at offset off (its content_size) and
 * time ts, and commits the padding after it; off is the packet's end when
 * nothing pads it.
 */
static __always_inline void kc_pkt_close(void *elem, __u64 off, __u64 ts)
{
	*(volatile __u64 *)(elem + KC_PKT_END) = ts;
	*(volatile __u64 *)(elem + KC_PKT_CONTENT) = off * 8;
	if (off < kc_area_esize)
		__sync_fetch_and_add((__u64 *)(elem + KC_PKT_COMMIT), kc_area_esize - off);
}

/*
 * kc_pkt_reserve reserves the event of key with size payload bytes in
 * ring idx, whose positions are in ps; max is a constant bound on
 * KC_EVH_EXT + size, which the verifier needs. It writes the event
 * header, and the packet's opening or closing fields where the event
 * opens or closes one, and returns where the payload goes, with the
 * reservation in *p; or NULL when the element it needs is not free or
 * the reservation lost its races: the caller counts that as lost. The
 * clock is read inside the compare-and-swap loop, as kc_area_reserve
 * does.
 */
static __always_inline void *kc_pkt_reserve(__u32 idx, struct kc_cpu_state *ps, __u32 key, __u32 size, __u32 max, struct kc_pkt *p)
{
	__u64 old, at, off, pad, need, end, ts, last, lim;
	__u32 hlen, open;
	void *e;
	int i;

	for (i = 0; i < KC_AREA_TRIES; i++) {
		old = *(volatile __u64 *)&ps->prod;
		asm volatile("" ::: "memory");
		ts = kc_now();
		last = *(volatile __u64 *)&ps->last;
		off = old & (kc_area_esize - 1);
		open = off == 0;
		pad = 0;
		hlen = !open && key <= KC_EVH_MAX_ID && ts - last < (1ULL << KC_EVH_TS_BITS) ? KC_EVH_COMPACT : KC_EVH_EXT;
		/*
		 * As kc_area_reserve pads: an event never starts past
		 * esize - max, which bounds its stores for the verifier.
		 */
		if (!open && off > kc_area_esize - max) {
			pad = kc_area_esize - off;
			open = 1;
			hlen = KC_EVH_EXT;
		}
		at = old + pad;
		need = hlen + size;
		if (open) {
			need += KC_PKT_HDR;
			if (at + kc_area_esize - *(volatile __u64 *)&ps->cons > kc_area_rsize)
				return NULL;
		}
		end = at + need;
		if (__sync_val_compare_and_swap(&ps->prod, old, end) == old)
			goto won;
	}
	return NULL;
won:
	*(volatile __u64 *)&ps->last = ts;
	if (pad) {
		e = kc_pkt_elem(idx, old);
		if (e)
			kc_pkt_close(e, off, ts);
	}
	e = kc_pkt_elem(idx, at);
	off = at & (kc_area_esize - 1);
	if (e && open) {
		*(volatile __u64 *)(e + KC_PKT_BEGIN) = ts;
		off += KC_PKT_HDR;
	}
	lim = kc_area_esize - max;
	/* Never taken, as in kc_area_reserve: the verifier's bound. */
	barrier_var(lim);
	barrier_var(off);
	if (!e || off > lim)
		return NULL;
	e += off;
	if (hlen == KC_EVH_COMPACT) {
		*(__u32 *)e = key | (__u32)ts << (32 - KC_EVH_TS_BITS);
	} else {
		*(__u8 *)e = 31;
		*(__u32 *)(e + 1) = key;
		*(__u64 *)(e + 5) = ts;
	}
	p->elem = e - off;
	p->end = end;
	p->ts = ts;
	p->bytes = need;
	if (!(end & (kc_area_esize - 1)))
		kc_pkt_close(p->elem, kc_area_esize, ts);
	return e + hlen;
}

/* kc_pkt_commit publishes the event of reservation p. */
static __always_inline void kc_pkt_commit(struct kc_pkt *p)
{
	__sync_fetch_and_add((__u64 *)(p->elem + KC_PKT_COMMIT), (1ULL << 32) | p->bytes);
}
#endif

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
 * kc_output hands size bytes of the record s to the transport and returns
 * 0 or a negative errno; it counts only wakeups (in st). With stamp set it
 * stamps the record itself, in s->hdr.ts too: inside a kc_area ring's
 * reservation, so that the record keeps its ring's time order
 * (kc_area_reserve), else right before the output. Without it the record
 * keeps the time the caller gave it, and the consumer's reorder window
 * puts it in its place.
 */
static __always_inline long kc_output(void *ctx, struct kc_scratch *s, __u32 size, struct kc_cpu_state *st, int atomic, int stamp)
{
#ifdef KC_PERF
	if (stamp)
		s->hdr.ts = kc_now();
	return bpf_perf_event_output(ctx, &kc_perf, BPF_F_CURRENT_CPU, s, size);
#else
	__u32 idx = kc_global ? 0 : s->hdr.cpu;
	__u64 flags;
	void *ring;
	long err;

	if (kc_area_on) {
		struct kc_cpu_state *ps = bpf_map_lookup_elem(&kc_state, &idx);
		__u64 *h, pos, ts;

		if (!ps)
			return -2;
		barrier_var(size);
		if (size > sizeof(struct kc_rec) + KC_PAYLOAD_MASK)
			return -7; /* -E2BIG: kc_emit's callers mask the payload */
		if (kc_pkt_on) {
			struct kc_pkt p;
			__u32 len = size - sizeof(struct kc_rec);
			void *d;

			/* A packet is in time order: no time given by the caller. */
			if (!stamp || size < sizeof(struct kc_rec))
				return -22; /* -EINVAL; the loader keeps such events off packets */
			/*
			 * The bound decides where a packet ends (kc_pkt_reserve
			 * pads past esize - max): the usual small record must
			 * not end packets a largest record early.
			 */
			if (len < KC_PKT_SMALL) {
				d = kc_pkt_reserve(idx, ps, s->hdr.key, len, KC_EVH_EXT + KC_PKT_SMALL, &p);
				if (!d)
					return -11;
				bpf_probe_read_kernel(d, len & (KC_PKT_SMALL - 1), s->data);
			} else {
				d = kc_pkt_reserve(idx, ps, s->hdr.key, len, KC_EVH_EXT + KC_MAX_PAYLOAD, &p);
				if (!d)
					return -11;
				bpf_probe_read_kernel(d, len & KC_PAYLOAD_MASK, s->data);
			}
			s->hdr.ts = p.ts;
			kc_pkt_commit(&p);
			kc_area_wake(idx, st, ps, p.end, atomic, 0);
			return 0;
		}
		h = kc_area_reserve(idx, ps, size, KC_AREA_MAX, &pos, stamp ? &ts : NULL);
		if (!h)
			return -11; /* -EAGAIN: ring full, as bpf_ringbuf_output */
		bpf_probe_read_kernel(h + 1, size, s);
		if (stamp) {
			/* struct kc_rec's first field, behind the ring's header. */
			*(volatile __u64 *)(h + 1) = ts;
			s->hdr.ts = ts;
		}
		kc_area_commit(h, pos, size);
		kc_area_wake(idx, st, ps, pos + KC_AREA_HDR + ((size + 7) & ~7), atomic, 0);
		return 0;
	}
	ring = bpf_map_lookup_elem(&kc_rings, &idx);
	if (!ring)
		return -2; /* -ENOENT: no ring for this CPU */
	if (stamp)
		s->hdr.ts = kc_now();
	flags = kc_wakeup_flags(ring, size + 8, st, atomic, 0, 0);
	err = bpf_ringbuf_output(ring, s, size, flags);
	if (err)
		kc_wakeup_unused(st, flags, atomic);
	return err;
#endif
}

/*
 * kc_emit_counted is kc_emit, counting in st with atomic adds where
 * atomic is set: for a caller that programs of ours may interrupt on its
 * CPU (kc_sys_user_fault's record, made with preemption disabled, which
 * an interrupt's tp_btf program can still cut into).
 */
static __always_inline long kc_emit_counted(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len, int stamp, int atomic)
{
	long err;

	barrier_var(len);
	len &= KC_PAYLOAD_MASK;
	s->hdr.len = len;
	err = kc_output(ctx, s, sizeof(struct kc_rec) + len, st, atomic, stamp);
	if (atomic && err)
		__sync_fetch_and_add(&st->lost, 1);
	else if (err)
		st->lost++;
#ifndef KC_PERF
	else if (kc_area_on)
		; /* kc_area's drainer counts what it reads, as for kc_submit */
#endif
	else if (atomic)
		__sync_fetch_and_add(&st->emitted, 1);
	else
		st->emitted++;
	return err;
}

/*
 * kc_emit outputs len payload bytes of s, stamped by kc_output when stamp
 * is set (the time then in s->hdr.ts), else with the time s holds.
 * Returns 0 or a negative errno, which has been counted in the CPU's lost
 * counter.
 */
static __always_inline long kc_emit(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len, int stamp)
{
	return kc_emit_counted(ctx, s, st, len, stamp, 0);
}

/*
 * kc_emit_at outputs len payload bytes of s stamped with ts, a time the
 * caller took before (an event timed by another's). Returns 0 or a
 * negative errno, which has been counted in the CPU's lost counter.
 */
static __always_inline long kc_emit_at(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len, __u64 ts)
{
	s->hdr.ts = ts;
	return kc_emit(ctx, s, st, len, 0);
}

/*
 * kc_emit_end stamps the record and outputs len payload bytes of it; the
 * time is then in s->hdr.ts. The clock is read as late as the transport
 * allows: inside a kc_area ring's reservation, which keeps the ring in
 * time order, else right before the output, where the consumer restores
 * order within a bounded window. Returns 0 or a negative errno, which has
 * been counted in the CPU's lost counter.
 */
static __always_inline long kc_emit_end(void *ctx, struct kc_scratch *s, struct kc_cpu_state *st, __u32 len)
{
	return kc_emit(ctx, s, st, len, 1);
}

#endif /* KCONSUME_H */
