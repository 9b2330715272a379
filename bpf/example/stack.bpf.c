// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * stack.bpf.c: a synthetic event with the kernel's stack field type,
 * filled by bpf_get_stack through kc_synth_stack; the tests record it.
 *
 *	clang -O2 -g -target bpf -I bpf -I bpf/include \
 *		-c bpf/example/stack.bpf.c -o stack.o
 *	kconsume record --bpf stack.o -o /tmp/t --duration 2s
 *
 * Each getpid(2) of the traced process (target_tgid, or all) gives one
 * getpid_stack event: the caller, two constants, and the kernel stack that
 * led to the syscall. It is a raw tracepoint: bpf_get_stack takes the
 * kernel's registers where it runs, so it has the kernel stack on every
 * kernel (on a syscalls tracepoint, 6.1 has only the user's registers and
 * gives none).
 */
#include "kc_synth.h"

KC_SYNTH_EVENT(getpid_stack, "pid_t pid; bool traced; char c; unsigned long[] stack");

/* Process to trace; 0 traces every process. Set before load. */
const volatile __u32 target_tgid = 0;

/* getpid's number on x86_64 (arch/x86/entry/syscalls/syscall_64.tbl). */
#define NR_GETPID 39

SEC("raw_tp/sys_enter")
int getpid_stack_event(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct kc_synth e;

	if (ctx->args[1] != NR_GETPID || (target_tgid && tgid != target_tgid))
		return 0;
	if (!kc_synth_start(&e, getpid_stack))
		return 0;
	kc_synth_s32(&e, (__s32)bpf_get_current_pid_tgid());
	kc_synth_u8(&e, target_tgid != 0);
	kc_synth_s8(&e, 'K');
	kc_synth_stack(ctx, &e, 0);
	kc_synth_end(ctx, &e);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
