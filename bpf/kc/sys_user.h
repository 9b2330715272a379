/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kc/sys_user.h: kc_sys_user, which reads syscall events' user-space
 * values into a ring record, for the classic tracepoints' records
 * (kc_record) and for those of kc_sys_user_fault (kc/sys_user.bpf.h).
 */
#ifndef KC_SYS_USER_H
#define KC_SYS_USER_H

#include "kc/event.h"

#ifndef KC_PERF
/*
 * Syscall events' user-space fields (Linux 6.19+). The kernel appends to
 * some sys_enter events a __data_loc char[] field per pointer argument,
 * right after the arguments, and fills it with what the argument points
 * to (kernel/trace/trace_syscalls.c: sys_fault_user, syscall_put_data).
 * A program on a syscall tracepoint gets only the number and the
 * arguments (perf_call_bpf_enter), so kc_sys_user reads the data, by the
 * kernel's rules:
 * - a string: up to KC_SYS_USER_READ bytes and its NUL
 *   (strncpy_from_user), each unprintable byte (isprint of lib/ctype.c)
 *   stored as '.'; longer than user_max bytes, it is cut there and
 *   "..." and a NUL follow, else its NUL ends it;
 * - an array (write's buf): min(the length argument, KC_SYS_USER_READ)
 *   bytes read, the first user_max of them kept as they are;
 * - a read that faults, or a user_max of 0: an empty field.
 * bpf_probe_read_user cannot page memory in where the kernel's copy can,
 * and nothing has paged it in for a program alone (seen on 7.3: a page
 * the task never touched read as a fault), so kc_sys_user_fault does
 * that first where the kernel allows it; a value still unread is
 * counted in kc_sys_user_unread.
 */
#define KC_SYS_USER_CNT 3    /* SYSCALL_FAULT_MAX_CNT */
#define KC_SYS_USER_MAX 165  /* SYSCALL_FAULT_USER_MAX */
#define KC_SYS_USER_READ 169 /* SYSCALL_FAULT_ARG_SZ - 1: what the kernel reads */

/*
 * kc_sys_user_unread counts per CPU the user-space values kc_sys_user
 * could not read: a bad pointer (the kernel's own event holds an empty
 * value then too) or memory not paged in (where it holds the data).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} kc_sys_user_unread SEC(".maps");

/*
 * Set when some recorded event has user-space fields: otherwise the
 * verifier drops kc_sys_user from every program copy, which it would
 * otherwise verify in each (hundreds of milliseconds a load).
 */
const volatile __u32 kc_sys_user_on = 0;

#define KC_BYTES(b) (0x0101010101010101ULL * (b))

/*
 * kc_printable returns the 8 bytes of w with each byte that isprint
 * (lib/ctype.c's table) calls unprintable replaced by '.': those below
 * 0x20, 0x7f and 0x80 to 0x9f. Without a branch per byte, so that the
 * verifier walks a string in 21 steps, not 165. With v a byte's low 7
 * bits, v + 0x60 reaches bit 7 where v >= 0x20 and v + 1 where v is
 * 0x7f, carrying into no other byte.
 */
static __always_inline __u64 kc_printable(__u64 w)
{
	__u64 high = w & KC_BYTES(0x80), low = w & KC_BYTES(0x7f);
	__u64 ge20 = (low + KC_BYTES(0x60)) & KC_BYTES(0x80);
	__u64 is7f = (low + KC_BYTES(0x01)) & KC_BYTES(0x80);
	__u64 bad = ((~ge20 & KC_BYTES(0x80)) | (is7f & ~high)) >> 7;
	__u64 m = bad * 0xff;

	return (w & ~m) | (KC_BYTES('.') & m);
}

/*
 * kc_sys_user fills the user-space fields of info's syscall event into
 * d, a ring record holding the number and the arguments, and returns
 * the trace record's size, or 0 for an info the loader never writes.
 */
static __always_inline __u32 kc_sys_user(__u8 *d, struct kc_tp_info *info)
{
	__u32 loc = info->user_loc, max = info->user_max, end, dst, n, x, a, bad;
	const void *ptr;
	__u64 *w;
	__u64 cnt;
	long r;
	int j;

	if (loc < 16 || loc > 16 + 8 * 6 || info->user_n > KC_SYS_USER_CNT || max > KC_SYS_USER_MAX)
		return 0;
	end = loc + 4 * info->user_n;
#pragma unroll
	for (j = 0; j < KC_SYS_USER_CNT; j++) {
		if (j >= info->user_n)
			break;
		/* Argument i sits at 16 + 8 * i of the trace record, KC_CUT before in the ring record. */
		a = info->user_arg[j];
		if (a > 5)
			return 0;
		ptr = (const void *)*(__u64 *)(d + 16 - KC_CUT + 8 * a);
		dst = (end - KC_CUT) & 0x3ff;
		n = 0;
		bad = 1;
		if (!max) {
			/* The kernel reads nothing. */
		} else if (info->user_len >= 0) {
			a = info->user_len;
			if (a > 5)
				return 0;
			cnt = *(__u64 *)(d + 16 - KC_CUT + 8 * a);
			if (cnt > KC_SYS_USER_READ)
				cnt = KC_SYS_USER_READ;
			/* Older verifiers (5.10, 6.1) lose the bound without the mask. */
			barrier_var(cnt);
			cnt &= 0xff;
			if (!bpf_probe_read_user(d + dst, cnt, ptr)) {
				n = cnt < max ? cnt : max;
				bad = 0;
			}
		} else {
			r = bpf_probe_read_user_str(d + dst, KC_SYS_USER_READ + 1, ptr);
			if (r > 0) {
				bad = 0;
				r--; /* the string's bytes, without the NUL read after them */
				n = r < max ? r : max;
				/*
				 * Whole words: bytes past n belong to no field yet
				 * (the next one is read after), and the NUL or
				 * "..." is written after.
				 */
				for (x = 0; x < (KC_SYS_USER_MAX + 7) / 8; x++) {
					if (8 * x >= n)
						break;
					w = (__u64 *)(d + ((dst + 8 * x) & 0x3ff));
					*w = kc_printable(*w);
				}
				if (r > max) {
					d[(dst + max) & 0x3ff] = '.';
					d[(dst + max + 1) & 0x3ff] = '.';
					d[(dst + max + 2) & 0x3ff] = '.';
					d[(dst + max + 3) & 0x3ff] = 0;
					n = max + 4;
				} else {
					d[(dst + r) & 0x3ff] = 0;
					n = r + 1; /* its NUL */
				}
			}
		}
		if (max && bad) {
			__u32 zero = 0;
			__u64 *unread = bpf_map_lookup_elem(&kc_sys_user_unread, &zero);

			if (unread)
				*unread += 1;
		}
		*(__u32 *)(d + ((loc - KC_CUT + 4 * j) & 0x7f)) = end | n << 16;
		end += n;
	}
	return end;
}
#endif

#endif /* KC_SYS_USER_H */
