// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * sched.bpf.c: the events `record --profile lttng` builds itself because
 * ftrace's carry other values than lttng-modules' (its
 * include/instrumentation/events/sched.h). Loaded by the profile like a
 * user's object (bpf/kc_synth.h) in place of ftrace's tracepoint; the
 * profile names its synthetic events as lttng-modules does.
 *
 * lttng_sched_process_fork is lttng-modules' sched_process_fork: the
 * parent's and the child's thread ids (task->pid) and process ids
 * (task->tgid), so readers tell a new process (child_tid == child_pid)
 * from a new thread, and the inode numbers of their active pid namespaces.
 * ftrace's event has only the thread ids. vtids is written with one
 * element, the child's thread id in the initial namespace (lttng-modules
 * writes one per namespace level, numbers[0..level]).
 *
 * tp_btf: Linux 5.5+ with kernel BTF.
 */
#include "kc_synth.h"
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

KC_SYNTH_EVENT(lttng_sched_process_fork,
	       "char parent_comm[16]; pid_t parent_tid; pid_t parent_pid; unsigned int parent_ns_inum; "
	       "char child_comm[16]; pid_t child_tid; u8 _vtids_length; pid_t vtids[1]; pid_t child_pid; "
	       "unsigned int child_ns_inum");

/* Laid out as the definition: packed, fields in order. */
struct lttng_fork {
	char parent_comm[16];
	__s32 parent_tid;
	__s32 parent_pid;
	__u32 parent_ns_inum;
	char child_comm[16];
	__s32 child_tid;
	__u8 vtids_length;
	__s32 vtids[1];
	__s32 child_pid;
	__u32 child_ns_inum;
} __attribute__((packed));

/* The deepest pid namespace level (MAX_PID_NS_LEVEL, kernel/pid_namespace.c). */
#define PID_NS_LEVEL_MAX 32

/*
 * pid_ns_inum returns the inode number of t's active pid namespace, as
 * task_active_pid_ns(t)->ns.inum: the namespace of the deepest level of
 * t's struct pid (include/linux/pid.h ns_of_pid); 0 when t has none.
 */
static __always_inline __u32 pid_ns_inum(struct task_struct *t)
{
	struct pid *p = BPF_CORE_READ(t, thread_pid);
	struct pid_namespace *ns = NULL;
	unsigned int level;

	if (!p)
		return 0;
	level = BPF_CORE_READ(p, level);
	if (level >= PID_NS_LEVEL_MAX)
		return 0;
	if (bpf_core_read(&ns, sizeof(ns), &p->numbers[level].ns) || !ns)
		return 0;
	return BPF_CORE_READ(ns, ns.inum);
}

/* fork_emit records the fork of child by parent. */
static __always_inline void fork_emit(void *ctx, struct task_struct *parent, struct task_struct *child)
{
	struct lttng_fork f = {};

	BPF_CORE_READ_INTO(&f.parent_comm, parent, comm);
	f.parent_tid = BPF_CORE_READ(parent, pid);
	f.parent_pid = BPF_CORE_READ(parent, tgid);
	f.parent_ns_inum = pid_ns_inum(parent);
	BPF_CORE_READ_INTO(&f.child_comm, child, comm);
	f.child_tid = BPF_CORE_READ(child, pid);
	f.vtids_length = 1;
	f.vtids[0] = f.child_tid;
	f.child_pid = BPF_CORE_READ(child, tgid);
	f.child_ns_inum = pid_ns_inum(child);
	kc_synth_emit(ctx, lttng_sched_process_fork, &f);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(lttng_sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	if (kc_key_lttng_sched_process_fork == KC_NO_KEY || !kc_running)
		return 0;
	fork_emit(ctx, parent, child);
	return 0;
}

/* include/linux/sched.h */
#define PF_IO_WORKER 0x00000010
#define PF_USER_WORKER 0x00004000

/*
 * The same event where tp_btf programs run preemptibly (Linux 7.x: a
 * task preempted inside one makes the kernel skip it for the other tasks
 * of its CPU), from a kprobe on wake_up_new_task, which a kprobe.multi
 * link runs with preemption off. kernel_clone calls it on the new task
 * right after the tracepoint, with the parent current (kernel/fork.c);
 * the io_uring and vhost workers that copy_process makes without the
 * tracepoint are woken there too, and left out by their flags. x86-64's
 * first argument register.
 */
SEC("kprobe.multi/wake_up_new_task")
int lttng_sched_process_fork_kprobe(struct pt_regs *ctx)
{
	struct task_struct *child = (struct task_struct *)ctx->di;

	if (kc_key_lttng_sched_process_fork == KC_NO_KEY || !kc_running)
		return 0;
	if (BPF_CORE_READ(child, flags) & (PF_IO_WORKER | PF_USER_WORKER))
		return 0;
	fork_emit(ctx, bpf_get_current_task_btf(), child);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
