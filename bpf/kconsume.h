/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * kconsume.h: the record header shared with Go (through bpf2go -type) and
 * the emit helpers every kconsume BPF program uses.
 *
 * A program calls kc_emit_begin() to pass the state gate and get a scratch
 * record, fills the payload, then kc_emit_end() to stamp and output it on
 * this CPU's ring (or the one global ring). Failures are counted per CPU in
 * kc_state, which the consumer maps and reads without a syscall.
 *
 * Transport is fixed at compile time: KC_PERF builds the perf event array
 * variant (kernels before 5.8), otherwise BPF ring buffers (5.8+). Both
 * objects come from the same source, so the record layout cannot drift.
 *
 * The parts are in kc/, included here in this order: core.h (the record
 * header, per-CPU state, clock, state gate, scratch record), the
 * transports perf.h (perf buffers), ringbuf.h (BPF ring buffers and the
 * consumer's wakeups), area.h (the recorder's own rings, kc_area) and
 * pkt.h (packet mode), then emit.h (kc_emit_begin, kc_output and the
 * kc_emit family, over all of them).
 */
#ifndef KCONSUME_H
#define KCONSUME_H

#include "kc/core.h"
#include "kc/perf.h"
#include "kc/ringbuf.h"
#include "kc/area.h"
#include "kc/pkt.h"
#include "kc/emit.h"

#endif /* KCONSUME_H */
