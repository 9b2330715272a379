// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * getpid.bpf.c: an example of a user's own BPF program emitting synthetic
 * events and klog messages into a kconsume trace; the tests record it too.
 *
 *	clang -O2 -g -target bpf -I bpf -I bpf/include \
 *		-c bpf/example/getpid.bpf.c -o getpid.o
 *	kconsume record --bpf getpid.o -o /tmp/t -- sh -c 'for i in 1 2 3; do :; done'
 *
 * Each getpid(2) of the traced tasks (target_tgid, or all) gives one
 * getpid_whole event written all at once from a struct, one getpid_piece
 * written field by field, and, from the second program (Linux 5.13+), a klog
 * line. n counts the calls of this object, so tests can check every value.
 */
#include "kc_synth.h"

KC_SYNTH_EVENT(getpid_whole, "pid_t pid; u64 n; char comm[16]; u16 tag[3]");
KC_SYNTH_EVENT(getpid_piece, "pid_t pid; char[] comm; u32 n; s64 neg");

/* Laid out as getpid_whole's definition: packed, fields in order. */
struct getpid_whole {
	__s32 pid;
	__u64 n;
	char comm[16];
	__u16 tag[3];
} __attribute__((packed));

/* Process to trace; 0 traces every process. Set before load. */
const volatile __u32 target_tgid = 0;

/* Calls seen; the traced task is single-threaded, so a plain add will do. */
__u64 calls = 0;

static __always_inline int traced(void)
{
	return !target_tgid || bpf_get_current_pid_tgid() >> 32 == target_tgid;
}

SEC("tracepoint/syscalls/sys_enter_getpid")
int getpid_events(void *ctx)
{
	struct getpid_whole w = {};
	struct kc_synth e;
	__u64 n;

	if (!traced())
		return 0;
	n = ++calls;
	w.pid = bpf_get_current_pid_tgid();
	w.n = n;
	bpf_get_current_comm(w.comm, sizeof(w.comm));
	w.tag[0] = n & 0xffff;
	w.tag[1] = 7;
	w.tag[2] = 0xffff;
	kc_synth_emit(ctx, getpid_whole, &w);

	if (kc_synth_start(&e, getpid_piece)) {
		kc_synth_s32(&e, w.pid);
		kc_synth_str(&e, w.comm);
		kc_synth_u32(&e, n);
		kc_synth_s64(&e, -(__s64)n);
		kc_synth_end(ctx, &e);
	}
	return 0;
}

/* The same calls as klog lines: bpf_snprintf needs Linux 5.13. */
SEC("tracepoint/syscalls/sys_enter_getpid")
int getpid_klog(void *ctx)
{
	char comm[16];

	if (!traced())
		return 0;
	bpf_get_current_comm(comm, sizeof(comm));
	kc_klog(ctx, "getpid by %s[%d]", comm, (__u32)bpf_get_current_pid_tgid());
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
