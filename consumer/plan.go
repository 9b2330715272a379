package consumer

// pathID names one of the recorder's optional ways of recording: each is an
// optimisation or a newer kernel's feature, and a kernel or a
// configuration without it records the same events another way.
type pathID int

const (
	pathUserFault pathID = iota // kc_sys_user_fault pages syscall events' user memory in (sysuser.go)
	pathPackets                 // the writers fill CTF packets in kc_area (packet.go)
	pathOwnRings                // the writers use kc_area rings, not BPF ring buffers (area.go)
	pathFentry                  // syscall events on fentry/fexit programs (syscall.go)
	pathRawSys                  // syscall events on the raw syscall programs (syscall.go)
	pathBTF                     // events built from tracepoint arguments, tp_btf (btfevent.go)
	numPaths
)

// plan says, for each optional path, why the recorder does not take it:
// nil where it takes it or where it does not apply (no event needs it).
// Decided at load (loadRecorder, the fallbacks), it changes after only
// where the kernel refuses an attach.
type plan [numPaths]error

// fallback is a step of the load's retries: when the kernel refuses the
// recorder, the first path still in the spec is dropped, newest first,
// and the load tried again (fallbacks).
type fallback struct {
	path pathID
	// in reports whether the spec still holds the path.
	in func(r *recorder, l *loading) bool
	// asked, when set, returns the error to fail with instead: the
	// user asked for the path by name.
	asked func(r *recorder, err error) error
	// drop takes the path out of the spec and its variables.
	drop func(r *recorder, l *loading) error
}
