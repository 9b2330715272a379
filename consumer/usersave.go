package consumer

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The user symbols (UserSymbols) are saved while the recording runs, not
// only at its end, so that a recorder killed mid-run (SIGKILL, the OOM
// killer, a lost machine) leaves a trace whose user call chains still
// resolve up to a few seconds before it died. A save is due when
// something changed: the kernel reported a mapping, fork or exec (the
// side-band records), or the rings had data and a process may have
// begun to record user call chains (the drainer's nudge). An idle
// machine changes nothing and sees no save.

// userSavePeriod is the least time between two saves, and the delay from
// the first change to the save that takes it: a burst of new processes
// is saved once.
const userSavePeriod = 5 * time.Second

// userSaver saves the session's user symbols into its directory while
// the recording runs.
type userSaver struct {
	s     *Session
	nudge chan struct{} // the drainer's: the rings had data
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	// last is what the last save held: the side-band changes applied
	// and the number of processes with user call chains.
	lastChanges uint64
	lastProcs   int
	// pruned counts the processes forgotten (userMaps.prune).
	pruned atomic.Int64
}

// startUserSaver starts saving s's user symbols as they change; nil when
// the session follows no mappings or has no directory.
func startUserSaver(s *Session) *userSaver {
	if s.umaps == nil || s.cfg.Dir == "" {
		return nil
	}
	v := &userSaver{s: s, nudge: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go v.loop()
	return v
}

// poke asks for a save check without blocking: the drainer calls it
// after a pass that drained data, at most once a userSavePeriod.
func (v *userSaver) poke() {
	select {
	case v.nudge <- struct{}{}:
	default:
	}
}

// halt stops the saver and waits for it; it may be called again.
func (v *userSaver) halt() {
	v.once.Do(func() { close(v.stop) })
	<-v.done
}

// loop waits for a change, lets changes gather for userSavePeriod, and
// saves when the mappings or the processes with user call chains differ
// from the last save.
func (v *userSaver) loop() {
	defer close(v.done)
	u := v.s.umaps
	for {
		select {
		case <-u.changed:
		case <-v.nudge:
		case <-v.stop:
			return
		}
		select {
		case <-time.After(userSavePeriod):
		case <-v.stop:
			return
		}
		v.save()
	}
}

// save writes the user symbols when they differ from the last save's. A
// save that fails leaves the file as it was: the one at Close says why.
func (v *userSaver) save() {
	u := v.s.umaps
	changes := u.changes.Load()
	// The processes that exited without a user call chain go first: a
	// recording of days would otherwise keep every process it saw.
	n, procs, err := u.prune(v.s.userStackProcs)
	if err != nil {
		return
	}
	v.pruned.Add(int64(n))
	// The set only grows (userStackProcs): its size tells a new one.
	if len(procs) == 0 || changes == v.lastChanges && len(procs) == v.lastProcs {
		return
	}
	if writeUserSymbols(v.s.cfg.Dir, u.snapshot(procs)) == nil {
		v.lastChanges, v.lastProcs = changes, len(procs)
	}
}

// userStackProcs returns every process whose user call chains the
// recording holds: those the recorder's map holds now and those it held
// at earlier reads, which it may since have let go (its least recently
// used first, recorder.UserStackProcs). It fails when the map cannot be
// read.
func (s *Session) userStackProcs() ([]int32, error) {
	procs, err := s.rec.UserStackProcs()
	s.ustackMu.Lock()
	defer s.ustackMu.Unlock()
	if s.ustackSeen == nil {
		s.ustackSeen = map[int32]bool{}
	}
	for _, p := range procs {
		s.ustackSeen[p] = true
	}
	out := make([]int32, 0, len(s.ustackSeen))
	for p := range s.ustackSeen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, err
}
