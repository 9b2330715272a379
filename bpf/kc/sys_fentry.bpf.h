/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/sys_fentry.bpf.h: function syscalls: kc_sys_fentry and kc_sys_fexit
 * on the syscalls' entry points.
 */
#ifndef KC_SYS_FENTRY_BPF_H
#define KC_SYS_FENTRY_BPF_H

#include "kc/event.h"
#include "kc/fields.h"
#include "kc/syscall.h"

#ifndef KC_PERF
/*
 * The function path: one copy of kc_sys_fentry (entry events) or
 * kc_sys_fexit (exit events) per recorded syscall event, attached to
 * that syscall's x86_64 entry point, __x64_sys_NAME, which the loader
 * names as the copy's target and whose event key and number it patches
 * in. A syscall that is not recorded runs no BPF at all, and the one
 * recorded skips the syscall tracepoints' slow path
 * (SYSCALL_WORK_SYSCALL_TRACEPOINT) and the raw dispatch. The 32-bit
 * syscalls and the x32 ones are left out, as the tracepoints leave them
 * out: x32 calls share the x86_64 entry points and are told by their
 * number's __X32_SYSCALL_BIT (arch/x86/include/uapi/asm/unistd.h),
 * 32-bit ones by TS_COMPAT (kc_sys_task).
 */
#define KC_NR_PLACEHOLDER 0x6b634e5253ULL
#define KC_X32_SYSCALL_BIT 0x40000000

static __always_inline long kc_sys_nr(void)
{
	__u64 nr;

	asm volatile("%0 = 0x6b634e5253 ll" : "=r"(nr));
	return nr;
}

static __always_inline void kc_sys_fn(struct pt_regs *regs, __u32 exit, long ret)
{
	struct kc_tp_info *info;
	__u32 key;
	__s32 pid;

	if (!kc_running || (regs->orig_ax & KC_X32_SYSCALL_BIT))
		return;
	/*
	 * A syscall without arguments has one body for both ABIs
	 * (__x64_sys_NAME and __ia32_sys_NAME alias __do_sys_NAME): the
	 * thread's TS_COMPAT tells a 32-bit call.
	 */
	pid = kc_sys_task();
	if (pid < 0)
		return;
	key = kc_patched_key();
	info = bpf_map_lookup_elem(&kc_tp_info_map, &key);
	if (!info || !kc_gen_ok(info))
		return;
	kc_sys_emit(regs, NULL, key, info->id, info->size, kc_sys_nr(), exit, ret, pid, info->flags & KC_TP_FILTERED, 0);
}

SEC("fentry/__x64_sys_getpid")
int kc_sys_fentry(__u64 *ctx)
{
	kc_sys_fn((struct pt_regs *)ctx[0], 0, 0);
	return 0;
}

SEC("fexit/__x64_sys_getpid")
int kc_sys_fexit(__u64 *ctx)
{
	kc_sys_fn((struct pt_regs *)ctx[0], 1, (long)ctx[1]);
	return 0;
}

/*
 * The function path on kprobes, where trampolines would lose events:
 * kernels that run fentry programs preemptibly (the recorder's
 * Preemptible), where a task preempted inside one holds the program's
 * per-CPU recursion guard and the kernel skips the program for the other
 * tasks of that CPU (__bpf_prog_enter_recur, kernel/bpf/trampoline.c).
 * A kprobe on a function's entry runs from ftrace (kprobe_ftrace_handler)
 * and a kretprobe from its return hook, both with preemption off, so only
 * a program interrupting another on the same CPU is skipped, and counted
 * (trace_call_bpf's bpf_prog_active, kernel/trace/bpf_trace.c). The
 * syscall's registers are the task's user ones, task_pt_regs, which the
 * entry point also takes as its argument; a kretprobe has no argument
 * left, but the same registers.
 */
SEC("kprobe/__x64_sys_getpid")
int kc_sys_kprobe(struct pt_regs *ctx)
{
	kc_sys_fn((struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf()), 0, 0);
	return 0;
}

SEC("kretprobe/__x64_sys_getpid")
int kc_sys_kretprobe(struct pt_regs *ctx)
{
	kc_sys_fn((struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf()), 1, (long)ctx->ax);
	return 0;
}
#endif

#endif /* KC_SYS_FENTRY_BPF_H */
