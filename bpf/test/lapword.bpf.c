// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * lapword.bpf.c: a user object whose records are made to deceive the
 * consumer of a kc_area ring, for TestAreaStaleSlot. Each getpid(2) of
 * target_tgid gives one event, lapword or lapshort in turn: its number,
 * then words that each look like a written record's header of the ring's
 * next lap. Two sizes make each lap's records start where the last lap's
 * held such words. When the next lap reserves a record over them, the
 * slot of its header holds such a word until the header is stored,
 * unless the consumer zeroed the space when it released it
 * (consumer/ringbuf.go: release). The long copy of the record, between
 * its reservation and its header, gives the consumer time to look.
 */
#include "kc_synth.h"

KC_SYNTH_EVENT(lapword, "u64 n; u64 words[48]");
KC_SYNTH_EVENT(lapshort, "u64 n; u64 words[45]");

/* Process to trace. Set before load. */
const volatile __u32 target_tgid = 0;

/* Calls seen; the test calls getpid from one thread. */
__u64 calls = 0;

SEC("tp_btf/sys_enter")
int lapword_event(__u64 *ctx)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct kc_cpu_state *ps;
	struct kc_synth e;
	__u64 word, n;
	int i;

	/* getpid's number on x86_64 (arch/x86/entry/syscalls/syscall_64.tbl). */
	if (ctx[1] != 39 || bpf_get_current_pid_tgid() >> 32 != target_tgid)
		return 0;
	ps = bpf_map_lookup_elem(&kc_state, &cpu);
	if (!ps)
		return 0;
	n = ++calls;
	if (n & 1 ? !kc_synth_start(&e, lapword) : !kc_synth_start(&e, lapshort))
		return 0;
	/* A header of the next lap (kc_area_lap), of a 16-byte record. */
	word = (((ps->prod >> kc_area_lshift) + 2) << 32) | 16;
	kc_synth_u64(&e, n);
	for (i = 0; i < (n & 1 ? 48 : 45); i++)
		kc_synth_u64(&e, word);
	kc_synth_end(ctx, &e);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
