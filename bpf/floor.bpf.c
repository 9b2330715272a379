// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * floor.bpf.c: the parts a BPF recorder's per-event cost is made of, each
 * alone, for BenchmarkRecorderFloor: entering a program from a
 * tracepoint, reading the clock, and writing a record into a BPF ring
 * buffer or into plain per-CPU memory. kc_floor_nr is the syscall number
 * the sys_enter programs act on; every other syscall returns at once
 * (what an untraced syscall pays on kconsume's raw syscall path).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

const volatile long kc_floor_nr = -1;

/* What the clock programs read, so the read is not optimised away. */
__u64 kc_floor_sink = 0;

struct kc_floor_rec {
	__u64 ts;
	__u64 word[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 26); /* 1.6 M records; the benchmark empties it after each run */
} kc_floor_ring SEC(".maps");

/* A per-CPU area records are written into in turn, as into a ring of its own. */
#define KC_FLOOR_AREA 4096
struct kc_floor_area {
	__u64 head;
	__u8 data[KC_FLOOR_AREA];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kc_floor_area);
} kc_floor_areas SEC(".maps");

SEC("tp_btf/sys_enter")
int BPF_PROG(kc_floor_enter, struct pt_regs *regs, long nr)
{
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(kc_floor_clock, struct pt_regs *regs, long nr)
{
	if (nr != kc_floor_nr)
		return 0;
	kc_floor_sink = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(kc_floor_ringbuf, struct pt_regs *regs, long nr)
{
	struct kc_floor_rec *r;

	if (nr != kc_floor_nr)
		return 0;
	r = bpf_ringbuf_reserve(&kc_floor_ring, sizeof(*r), 0);
	if (!r)
		return 0;
	r->ts = nr;
	r->word[0] = regs->di;
	r->word[1] = 0;
	r->word[2] = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(kc_floor_area, struct pt_regs *regs, long nr)
{
	struct kc_floor_area *a;
	struct kc_floor_rec *r;
	__u32 zero = 0;
	__u64 head;

	if (nr != kc_floor_nr)
		return 0;
	a = bpf_map_lookup_elem(&kc_floor_areas, &zero);
	if (!a)
		return 0;
	/* An atomic reservation, as nesting programs on one CPU would need. */
	head = __sync_fetch_and_add(&a->head, sizeof(*r));
	r = (void *)&a->data[head & (KC_FLOOR_AREA - sizeof(*r))];
	r->ts = nr;
	r->word[0] = regs->di;
	r->word[1] = 0;
	r->word[2] = 0;
	return 0;
}

SEC("tp_btf/task_rename")
int BPF_PROG(kc_floor_rename_btf, struct task_struct *task, const char *comm)
{
	return 0;
}

SEC("tracepoint/task/task_rename")
int kc_floor_rename_tp(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
