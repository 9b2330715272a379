/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/sys_raw.bpf.h: raw syscalls: kc_sys_enter and kc_sys_exit on the raw
 * syscall tracepoints (tp_btf), kc_sys_enter_tp and kc_sys_exit_tp on
 * their perf tracepoints where programs run preemptibly.
 */
#ifndef KC_SYS_RAW_BPF_H
#define KC_SYS_RAW_BPF_H

#include "kc/event.h"
#include "kc/syscall.h"

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

/*
 * struct kc_sys_key is what the raw path needs of a recorded syscall
 * event: its key, and the two fields of its struct kc_tp_info the record
 * takes, so that a traced syscall costs one map lookup, not two.
 */
struct kc_sys_key {
	__u32 key;  /* the event key + 1, or 0 when the event is not recorded */
	__u16 id;   /* kc_tp_info.id */
	__u16 size; /* kc_tp_info.size */
	__u32 flags; /* KC_TP_FILTERED when the event has a field filter */
	/*
	 * The generation of the raw programs that record the event, and
	 * while a change of filter loads new ones (kconsume ctl filter,
	 * whose filters they carry), theirs and the epoch from which a CPU
	 * takes them, as in struct kc_tp_info (kc_gen_ok).
	 */
	__u32 gen;
	__u32 gen_next;
	__u32 switch_at;
	/* The event's trigger's slot in kc_trig_map plus one, 0 for none (kc/trigger.h). */
	__u32 trig;
};

/*
 * kc_sys_trig_start is set at load when an event of the raw path has a
 * start trigger, which looks at its events with the gate closed too.
 */
const volatile __u32 kc_sys_trig_start = 0;

/* kc_sys_keys maps nr (sys_enter) and KC_SYS_MAX + nr (sys_exit) to the event's struct kc_sys_key. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * KC_SYS_MAX);
	__type(key, __u32);
	__type(value, struct kc_sys_key);
} kc_sys_keys SEC(".maps");

/*
 * kc_sys_record writes the syscall event for nr, if it is recorded, as
 * kc_sys_emit: the raw path's dispatch by syscall number.
 */
static __always_inline void kc_sys_record(struct pt_regs *regs, const struct kc_sys_args *a, long nr, __u32 exit, long ret)
{
	struct kc_sys_key *k;
	__u32 slot, gen;
	__s32 pid;

	if ((__u64)nr >= KC_SYS_MAX || (!kc_running && !kc_sys_trig_start))
		return;
	slot = exit * KC_SYS_MAX + nr;
	k = bpf_map_lookup_elem(&kc_sys_keys, &slot);
	if (!k || !k->key || (!kc_running && !k->trig))
		return;
	gen = k->gen;
	if (k->switch_at && kc_epoch_reached(k->switch_at))
		gen = k->gen_next;
	if (gen != kc_prog_gen())
		return;
	pid = kc_sys_task();
	if (pid < 0)
		return;
	kc_sys_emit(regs, a, k->key - 1, k->id, k->size, nr, exit, ret, pid, k->flags & KC_TP_FILTERED, k->trig);
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
#endif

#endif /* KC_SYS_RAW_BPF_H */
