// Package filter reads the kernel's trace event filter language: the
// expressions written to tracefs events/SYSTEM/EVENT/filter (trace-cmd
// -f), parsed as the newest kernel's kernel/trace/trace_events_filter.c
// parses them, accepting and refusing the same strings, into the
// kernel's own program of typed predicates with forward jumps, and
// evaluated over raw records as the kernel evaluates it.
//
// # The language
//
// A filter is predicates FIELD OP VALUE joined by && and || (&& binds
// tighter), negated by ! and grouped by parentheses. FIELD is any field
// of the event's format, a common field (common_pid...), or a pseudo
// field: CPU, cpu and common_cpu (the CPU the event fires on), COMM and
// comm (the current task's name), stacktrace and STACKTRACE (accepted,
// never true). The event's own fields are found first, then the pseudo
// fields, then the common ones. FIELD may carry .ustring (read a char *
// from user memory) and .function (compare a long with a kernel
// function's address range).
//
// Integers take == != < <= > >= & with a number, which is read as
// kstrtoll (signed fields) or kstrtoull (the others) reads it: decimal,
// 0x hex, 0 octal, a '-' only for signed fields. Strings (char arrays, __data_loc and __rel_loc
// strings, char * fields) take == != ~ with a value in "double" or
// 'single' quotes; no bare words, no escapes. ~ classifies its pattern
// as the kernel's filter_parse_regex does: see MatchKind. CPUS{list}
// compares a scalar field, the CPU or a cpumask field with a cpulist.
//
// # The program
//
// Filter.Prog is predicate_parse's program after its three passes: each
// Inst evaluates one Pred and jumps forward when the result is
// Inst.BranchIf. A compiler to BPF emits one compare per Pred and one
// conditional jump per Inst; '!' never reaches a Pred (the kernel folds
// it into BranchIf).
//
// # Evaluation
//
// Filter.Match runs the program over a raw record as the format lays it
// out, with the task's comm and the CPU for the pseudo fields. It keeps
// the kernel's quirks (an end match on a fixed array looks at the
// array's last bytes; a char * field's string is not in the record, so
// its predicates are false; stacktrace predicates are false) and keeps
// nothing it cannot read.
//
// # Kernel versions
//
// The package models the newest kernel (7.3). Changes lists what older
// kernels do differently, for tests on them and for users' pages
// (docs/filters.md).
package filter
