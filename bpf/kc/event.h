/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/event.h: an event as the recorder's programs see it: its class
 * description (struct kc_tp_info, one per event key in kc_tp_info_map,
 * which the consumer fills at load), the layout of its ring record (the
 * trace record less KC_CUT bytes), and its event key, which a program
 * takes from the attach cookie or from a constant the loader patches in.
 */
#ifndef KC_EVENT_H
#define KC_EVENT_H

#include "kc/core.h"

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
	__u8 stack;       /* KC_STACK_*: the call chains recorded behind the record (kc/stack.h) */
	__u8 stack_depth; /* their most frames, at most KC_STACK_MAX */
	__u16 ctx;        /* KC_CTX_*: the contexts recorded behind the record (kc/context.h) */
	__u8 ctx_len;     /* their bytes */
	__u32 gen;      /* the program generation that records the event (kc_gen_ok) */
	__u32 gen_next; /* while a change of filter goes CPU by CPU: the next one's */
	__u32 switch_at; /* ... and the epoch from which a CPU takes gen_next, or 0 */
	struct kc_op ops[KC_MAX_OPS];
};

#define KC_TP_RECORD 1 /* write the event into the trace */
#define KC_TP_WAKING 2 /* remember when the task in pid_off was woken */
#define KC_TP_SWITCH 4 /* emit wakeup_latency for the task switched in */
#define KC_TP_SYSUSER 8 /* a syscall event with user-space fields to fill (kc_sys_user) */
#define KC_TP_FILTERED 16 /* a syscall event the syscall programs filter (kc_sys_field_filter) */

/* Set when synthetic:wakeup_latency is recorded, so the hooks cost nothing otherwise. */
const volatile __u32 kc_hooks = 0;

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

#endif /* KC_EVENT_H */
