// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * kconsume.bpf.c: the recorder, built for each transport (gen/gen.go:
 * Ringbuf, and Perf with -DKC_PERF). Each kind of event is one family of
 * programs, in a file of its own:
 *
 * - kc/NAME.bpf.h is a family: its programs (SEC), and the maps and
 *   load-time knobs that only they use, included only here. Those that
 *   need the BPF ring buffer transport are empty under KC_PERF.
 * - kc/NAME.h is a header: shared by families, or (core, the transports,
 *   emit, through kconsume.h) by every kconsume BPF program.
 *
 * Each file includes what it uses, and compiles alone. The objects'
 * layout follows the order in which definitions first come: programs
 * within an ELF section (kc_sys_enter before kc_sys_user_fault in
 * tp_btf/sys_enter, kc_inject before kc_pkt_flush in raw_tp), knobs in
 * .rodata, maps in .maps. The includes here and in each family keep it
 * as it was before the split: add a new family at the end.
 */
#include "kconsume.h"
#include "filter.h"
#include <bpf/bpf_core_read.h>

#include "kc/tracepoint.bpf.h" /* classic tracepoints */
#include "kc/sys_raw.bpf.h"    /* raw syscalls */
#include "kc/sys_user.bpf.h"   /* syscalls' user-space values */
#include "kc/sys_fentry.bpf.h" /* function syscalls */
#include "kc/sched_btf.bpf.h"  /* BTF sched events */
#include "kc/hot_btf.bpf.h"    /* the hot events table, generated */
#include "kc/inject.bpf.h"     /* injected records */
#include "kc/pkt_flush.bpf.h"  /* packet mode's flush */
#include "kc/probe.bpf.h"      /* uprobes */

char LICENSE[] SEC("license") = "Dual BSD/GPL";
