/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/trigger.h: triggers (record --trigger 'EVENT[ FILTER] : ACTION'),
 * decided in the recorder. The program that records an event with a
 * trigger (its tracepoint's copy, or the raw syscall programs,
 * kc/syscall.h) evaluates the trigger's condition on the record the
 * event's field filter kept, before it reserves ring space, and on a
 * match takes the action itself: stop and start flip the gate (kc_running) at once,
 * snapshot and rotate wake the consumer through kc_trig_ring once the
 * event is in its ring. A rate limit (kc_trig.interval) lets one CPU act per
 * interval, claimed by a compare-and-swap of the last action's time.
 *
 * The loader compiles the condition into BPF (consumer/recorder/
 * filtercode.go) and puts it in place of kc_trig_filter's body in the
 * copy, whose KC_TRIG_PLACEHOLDER it patches to the trigger's slot in
 * kc_trig_map plus one; every other copy keeps the placeholder, and the
 * verifier drops the code.
 */
#ifndef KC_TRIGGER_H
#define KC_TRIGGER_H

#include "kconsume.h"

#define KC_TRIG_PLACEHOLDER 0x6b63545247ULL

/* Actions (kc_trig.action); mirrored in consumer/recorder/trigger.go. */
#define KC_TRIG_SNAPSHOT 1
#define KC_TRIG_STOP 2
#define KC_TRIG_START 3
#define KC_TRIG_ROTATE 4

/* struct kc_trig is one trigger's slot of kc_trig_map. */
struct kc_trig {
	__u64 last;     /* bpf_ktime_get_ns of the last action taken, 0 before the first */
	__u64 interval; /* least ns between two actions */
	__u64 matched;  /* recorded events on which the condition held */
	__u64 fired;    /* actions taken */
	__u32 action;   /* KC_TRIG_* */
	__u32 pad;
};

/* One slot per trigger (sized at load). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kc_trig);
} kc_trig_map SEC(".maps");

/* struct kc_trig_note tells the consumer that a snapshot or rotate trigger fired. */
struct kc_trig_note {
	__u64 ts;   /* the event's time, 0 when its record was lost */
	__u32 slot; /* the trigger's slot in kc_trig_map */
	__u32 action;
};

/* The consumer's doorbell for snapshot and rotate triggers, apart from the event rings. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} kc_trig_ring SEC(".maps");

/*
 * kc_trig_live is set by the consumer from the session's first start to
 * its close: a start trigger must not open the gate before the session
 * starts, nor while it closes.
 */
volatile __u32 kc_trig_live = 0;

/*
 * kc_trig_slot returns this program copy's trigger slot plus one, or 0
 * when it has no trigger. A program calls it once (the loader patches one
 * placeholder); the placeholder is above 32 bits and a slot below.
 */
static __always_inline __u32 kc_trig_slot(void)
{
	__u64 v;

	asm volatile("%0 = 0x6b63545247 ll" : "=r"(v));
	return v >> 32 ? 0 : (__u32)v;
}

/*
 * kc_trig_filter returns nonzero when the trigger's condition holds on
 * the ring record that is the len bytes at data (as kc_field_filter). As
 * built it always holds.
 */
static __noinline int kc_trig_filter(__u8 *data, __u32 len)
{
	int hit;

	asm volatile("%0 = 1" : "=r"(hit) : "r"(data), "r"(len));
	return hit;
}

/*
 * kc_trig_find returns the trigger of slot (plus one) when it has an
 * event to decide on: the session is live, and the gate is open or the
 * trigger is a start trigger; else NULL.
 */
static __always_inline struct kc_trig *kc_trig_find(__u32 slot)
{
	__u32 idx = slot - 1;
	struct kc_trig *t;

	if (!kc_trig_live)
		return NULL;
	t = bpf_map_lookup_elem(&kc_trig_map, &idx);
	if (!t)
		return NULL;
	if (!kc_running && t->action != KC_TRIG_START)
		return NULL; /* the event is not recorded: nothing to decide */
	return t;
}

/*
 * kc_trig_act counts a match of trigger t, whose condition held on an
 * event about to be recorded (or, start triggers alone, one that would
 * be were the gate open). When the trigger's interval has passed since
 * its last action, the one CPU that claims the action applies stop or
 * start to the gate before the event is stamped, and kc_trig_act
 * returns t; else NULL.
 */
static __always_inline struct kc_trig *kc_trig_act(struct kc_trig *t)
{
	__u64 now, last;

	__sync_fetch_and_add(&t->matched, 1);
	if (t->action == KC_TRIG_START && kc_running)
		return NULL; /* already running: nothing to do */
	now = bpf_ktime_get_ns();
	last = t->last;
	if (last && now - last < t->interval)
		return NULL;
	if (__sync_val_compare_and_swap(&t->last, last, now) != last)
		return NULL; /* another CPU took this interval's action */
	if (t->action == KC_TRIG_STOP)
		kc_running = 0;
	else if (t->action == KC_TRIG_START)
		kc_running = 1;
	/* A locked add: the gate's store is seen before the event's timestamp is taken. */
	__sync_fetch_and_add(&t->fired, 1);
	return t;
}

/*
 * kc_trig_check evaluates the trigger of slot (plus one) on the ring
 * record at data, len bytes, of an event about to be recorded (as
 * kc_trig_act) and returns the trigger when it acted; else NULL.
 */
static __always_inline struct kc_trig *kc_trig_check(__u32 slot, __u8 *data, __u32 len)
{
	struct kc_trig *t = kc_trig_find(slot);

	if (!t || !kc_trig_filter(data, len))
		return NULL;
	return kc_trig_act(t);
}

/*
 * kc_trig_done tells the consumer, once the event of trigger t (slot plus
 * one) is in its ring with time ts, that a snapshot or a rotation is
 * due, waking it at once.
 */
static __always_inline void kc_trig_done(struct kc_trig *t, __u32 slot, __u64 ts)
{
	struct kc_trig_note n = {.ts = ts, .slot = slot - 1, .action = t->action};

	if (t->action == KC_TRIG_SNAPSHOT || t->action == KC_TRIG_ROTATE)
		bpf_ringbuf_output(&kc_trig_ring, &n, sizeof(n), BPF_RB_FORCE_WAKEUP);
}

#endif /* KC_TRIGGER_H */
