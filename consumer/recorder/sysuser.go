package recorder

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
)

// Syscall events' user-space fields. Since Linux 6.19 the kernel appends
// to some sys_enter events a `__data_loc char[] __ARG_val` field for each
// pointer argument whose data it copies into the record: the path of an
// openat, the bytes of a write (kernel/trace/trace_syscalls.c,
// check_faultable_syscall and sys_fault_user). A BPF program on a
// syscall tracepoint sees only the number and the arguments
// (perf_call_bpf_enter), so the recorder reads that data itself
// (kc_sys_user in bpf/kc/sys_user.h), by the kernel's rules.

// sysUserMax is SYSCALL_FAULT_USER_MAX (kernel/trace/trace.h): the most
// bytes of one field the kernel keeps, and the largest
// syscall_user_buf_size it takes.
const sysUserMax = 165

// sysUserCnt is SYSCALL_FAULT_MAX_CNT: the most user-space fields of one
// event (KC_SYS_USER_CNT).
const sysUserCnt = 3

// SysUserDefault is the default of CONFIG_TRACE_SYSCALL_BUF_SIZE_DEFAULT,
// the size used where a kernel has the fields but no
// syscall_user_buf_size file to say it.
const SysUserDefault = 63

// SysUser is what the recorder needs to fill a syscall event's
// user-space fields.
type SysUser struct {
	loc    int   // trace-record offset of the first field's __data_loc
	args   []int // the argument each field's data comes from, in field order
	lenArg int   // the argument that bounds an array's copy, or -1 for strings
}

// SysUserOf returns the user-space fields of the syscall event f, or nil
// for an event without them. It fails for fields the recorder cannot
// fill as the kernel does: one that names no argument, more than
// sysUserCnt, fields not right after the arguments, or data the print
// fmt shows as an array of a syscall whose length argument tracefs.UserLenArg
// does not know.
func SysUserOf(f *tracefs.Format) (*SysUser, error) {
	if f.System != "syscalls" || !strings.HasPrefix(f.Name, "sys_enter_") {
		return nil, nil
	}
	var args []string
	var vals []tracefs.Field
	for _, fl := range f.Fields {
		switch {
		case fl.Name == "__syscall_nr":
		case fl.Loc == tracefs.Inline && len(vals) == 0:
			args = append(args, fl.Name)
		default:
			vals = append(vals, fl)
		}
	}
	if len(vals) == 0 {
		return nil, nil
	}
	u := &SysUser{loc: 16 + 8*len(args), lenArg: -1}
	name := f.FullName()
	if len(vals) > sysUserCnt {
		return nil, fmt.Errorf("event %s: %d user-space fields, more than the kernel's %d", name, len(vals), sysUserCnt)
	}
	for j, fl := range vals {
		if fl.Loc != tracefs.DataLoc || !fl.IsChar() || fl.Offset != u.loc+4*j {
			return nil, fmt.Errorf("event %s: field %s (%s at %d) is not a user-space field after the arguments", name, fl.Name, fl.Type, fl.Offset)
		}
		arg := -1
		for i, a := range args {
			if fl.Name == "__"+a+"_val" {
				arg = i
			}
		}
		if arg < 0 || arg >= 6 {
			return nil, fmt.Errorf("event %s: user-space field %s names no argument", name, fl.Name)
		}
		u.args = append(u.args, arg)
		if strings.Contains(f.Print, "__print_dynamic_array("+fl.Name+",") {
			if _, ok := tracefs.UserLenArg(f.Syscall()); !ok {
				return nil, fmt.Errorf("event %s: user-space field %s holds bytes whose length argument kconsume does not know", name, fl.Name)
			}
		}
	}
	if i, ok := tracefs.UserLenArg(f.Syscall()); ok {
		if len(vals) != 1 || i >= len(args) {
			return nil, fmt.Errorf("event %s: %d user-space fields and %d arguments, not one field bounded by argument %d", name, len(vals), len(args), i)
		}
		u.lenArg = i
	}
	return u, nil
}

// sysUserBuf returns how many bytes of each user-space field the
// recorder keeps: the top instance's syscall_user_buf_size, as the
// kernel's own syscall events there (and trace-cmd's recording) keep,
// at most sysUserMax.
func sysUserBuf(fs tracefs.FS) (int, error) {
	n, ok, err := fs.SyscallUserBufSize()
	if err != nil {
		return 0, err
	}
	if !ok {
		return SysUserDefault, nil
	}
	return min(n, sysUserMax), nil
}

// SysUsers returns, per format, its user-space fields (sysUserOf), and
// the bytes of each the recorder keeps (sysUserBuf) where some event has
// them. It fails as sysUserOf does, with ErrNotSupported, and when
// syscall_user_buf_size cannot be read.
func SysUsers(fs tracefs.FS, formats []*tracefs.Format) ([]*SysUser, int, error) {
	users := make([]*SysUser, len(formats))
	any := false
	for i, f := range formats {
		u, err := SysUserOf(f)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		users[i], any = u, any || u != nil
	}
	if !any {
		return users, 0, nil
	}
	buf, err := sysUserBuf(fs)
	if err != nil {
		return nil, 0, err
	}
	return users, buf, nil
}

// put sets in ti the fields and the flag by which kc_sys_user fills the
// user-space fields u describes, keeping buf bytes of each.
func (u *SysUser) put(ti *gen.RingbufKcTpInfo, buf int) {
	ti.Flags |= tpSysUser
	ti.UserN = uint8(len(u.args))
	ti.UserLen = int8(u.lenArg)
	for j, a := range u.args {
		ti.UserArg[j] = uint8(a)
	}
	ti.UserMax = uint8(buf)
	ti.UserLoc = uint16(u.loc)
}

// UserFaultProbe loads an empty sleepable program on the sys_enter
// tracepoint and returns the kernel's error, if any: Linux 7.x takes
// sleepable programs on the faultable syscall tracepoints, older kernels
// refuse them.
func UserFaultProbe() error {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "kc_sleep_probe",
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceRawTp,
		AttachTo:     "sys_enter",
		Flags:        unix.BPF_F_SLEEPABLE,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return err
	}
	return p.Close()
}

// userPath is kc_sys_user_fault's path: a sleepable program on
// sys_enter pages in the user memory of syscall events' user-space
// fields and, where it can, records those events itself.
type userPath struct {
	on bool // kc_sys_user is on: some event has user-space fields
	// rec is set when kc_sys_user_fault, once attached, records the
	// events it pages memory in for, which then need no tracepoint;
	// tp when kc_tracepoint fills user-space fields, for the others.
	rec bool
	tp  bool
}

// setup readies spec for the recorded events with user-space
// fields, where need says there are some. It keeps kc_sys_user_fault,
// made sleepable, where the kernel takes it, else removes it, and
// r.plan[PathUserFault] says why. The program then records those
// events itself (kc_sys_user_rec, r.userRec) unless a cgroup filter,
// which it cannot test, Config.Syscalls SyscallsTracepoint, a
// preemptible kernel (Preemptible) or, with tail set, one of them
// recording call chains or contexts, which only kc_tracepoint writes
// (kc_tail), keeps them on their tracepoints.
// kc_tracepoint fills user-space fields (kc_sys_user_on, r.userTP),
// which costs every copy of it a longer load, only where some such
// event stays on its tracepoint: all of them without r.userRec, else
// those whose syscall number the dispatch does not know (byNr unset).
func (u *userPath) setup(r *Recorder, spec *ebpf.CollectionSpec, need, byNr, tail bool) {
	u.on = need
	ps := spec.Programs[gen.RingbufProgKcSysUserFault]
	var err error
	switch {
	case !need || ps == nil:
	case r.transport != Ringbuf:
		err = errors.New("needs BPF ring buffers")
	default:
		if err = UserFaultProbe(); err != nil {
			err = fmt.Errorf("a sleepable program on sys_enter: %w", err)
		}
	}
	if !need || err != nil {
		r.plan[PathUserFault].why = err
		delete(spec.Programs, gen.RingbufProgKcSysUserFault)
	} else if ps != nil {
		ps.Flags |= unix.BPF_F_SLEEPABLE
		// Where BPF tracing programs run preemptibly, a run preempted or
		// asleep in a fault holds the program's per-CPU recursion guard
		// and the kernel skips every other run on the CPU meanwhile:
		// recording there would lose those events. The perf
		// tracepoints keep preemption off; a skipped paging-in only
		// leaves a value that may not be read, which is counted.
		u.rec = r.cfg.Cgroup == "" && r.cfg.Syscalls != SyscallsTracepoint && !tail && (!r.preempt.On || Testing.UserFaultRecords)
	}
	u.tp = need && (!u.rec || !byNr)
	u.setVars(spec)
}

// setVars sets kc_sys_user_rec and kc_sys_user_on in spec from
// r.userRec and r.userTP.
func (u *userPath) setVars(spec *ebpf.CollectionSpec) {
	if v := spec.Variables[gen.RingbufVarKcSysUserRec]; v != nil {
		_ = v.Set(boolU32(u.rec))
	}
	if v := spec.Variables[gen.RingbufVarKcSysUserOn]; v != nil {
		// Without it the verifier leaves kc_sys_user out of kc_tracepoint.
		_ = v.Set(boolU32(u.tp))
	}
}

// attach attaches kc_sys_user_fault, where it was loaded, for
// the recorded events with user-space fields (users, indexed by event
// key like formats), before their tracepoints attach: it must run
// before them. It returns, by event key, the program's name for the
// events it records itself (r.userRec), which need no tracepoint, and
// "" for the others. Where it fails, the events are recorded without it
// and r.plan[PathUserFault] says why; but where it was to record them and
// kc_tracepoint was loaded without the means to fill their fields
// (r.userTP), it fails with ErrNotSupported.
func (u *userPath) attach(r *Recorder, formats []*tracefs.Format, users []*SysUser) ([]string, error) {
	progs := make([]string, len(formats))
	prog := r.coll.Programs[gen.RingbufProgKcSysUserFault]
	if prog == nil {
		return progs, nil
	}
	keys := r.coll.Maps[gen.RingbufMapKcSysUserKeys]
	for i, su := range users {
		nr, known := sysNr(formats[i])
		if su == nil || !known {
			continue
		}
		if err := keys.Put(uint32(nr), uint32(i+1)); err != nil {
			r.plan.off(PathUserFault, fmt.Errorf("dispatching %s: %w", formats[i].FullName(), err))
			return u.failed(r, formats)
		}
		if u.rec {
			progs[i] = gen.RingbufProgKcSysUserFault
		}
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		r.plan.off(PathUserFault, fmt.Errorf("attaching %s: %w", gen.RingbufProgKcSysUserFault, err))
		return u.failed(r, formats)
	}
	r.links = append(r.links, l)
	r.plan[PathUserFault].on = true
	return progs, nil
}

// failed is attach's result once the program failed to
// dispatch or attach: no event recorded by it, and an error where it was
// to record some that kc_tracepoint cannot then fill.
func (u *userPath) failed(r *Recorder, formats []*tracefs.Format) ([]string, error) {
	if u.rec && !u.tp {
		return nil, fmt.Errorf("%w: syscall events with user-space fields: %w (--syscalls tracepoint records them without paging memory in)", ErrNotSupported, r.plan[PathUserFault].why)
	}
	return make([]string, len(formats)), nil
}
