package recorder

// Path names one of the recorder's optional ways of recording: each is an
// optimisation or a newer kernel's feature, and a kernel or a
// configuration without it records the same events another way.
type Path int

const (
	PathUserFault Path = iota // kc_sys_user_fault pages syscall events' user memory in (sysuser.go)
	PathPackets               // the writers fill CTF packets in kc_area (packet.go)
	PathOwnRings              // the writers use kc_area rings, not BPF ring buffers (area.go)
	PathFentry                // syscall events on fentry/fexit programs (syscall.go)
	PathRawSys                // syscall events on the raw syscall programs (syscall.go)
	PathBTF                   // events built from tracepoint arguments, tp_btf (btfevent.go)
	numPaths
)

// optPath is one optional path of the recorder: whether it takes it, and
// why not. on is set once the load kept the path (PathUserFault: once its
// program attached) and cleared when a fallback or a failed attach drops
// it. why is nil where the recorder takes the path for every event that
// could, or where the path does not apply (no event needs it); a path
// that is on may still say why some events do not take it (a syscall
// function the kernel's BTF lacks, a BTF program the kernel refuses).
type optPath struct {
	on  bool
	why error
}

// Plan is the recorder's optional paths, by pathID. Decided at load
// (Load, the fallbacks), it changes after only where the kernel
// refuses an attach.
type Plan [numPaths]optPath

// decided is a path decided before the load: on unless why says not.
func decided(why error) optPath { return optPath{on: why == nil, why: why} }

// off turns path id off, saying why.
func (p *Plan) off(id Path, why error) { p[id] = optPath{why: why} }

// fallback is a step of the load's retries: when the kernel refuses the
// recorder, the first path still in the spec is dropped, newest first,
// and the load tried again (fallbacks).
type fallback struct {
	path Path
	// in reports whether the spec still holds the path.
	in func(l *loading) bool
	// asked, when set, returns the error to fail with instead: the
	// user asked for the path by name.
	asked func(l *loading, err error) error
	// drop takes the path out of the spec and its variables.
	drop func(l *loading) error
}
