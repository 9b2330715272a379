package consumer

import (
	"errors"
	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/relayfmt"
)

// The session's side of call chains and contexts (docs/stacks.md): the
// stream's event context under ContextsInStream, the symbol files, and
// the counts the summary reports.

// streamContext returns the fields of cfg's contexts and their bytes
// when they go into the stream's event context (ContextsInStream), else
// none.
func streamContext(cfg Config) ([]relayfmt.Field, int) {
	if !cfg.ContextsInStream {
		return nil, 0
	}
	ctxs, err := layout.ParseContexts(cfg.Contexts)
	if err != nil || len(ctxs) == 0 {
		return nil, 0 // Check refused bad names already
	}
	var fields []relayfmt.Field
	n := 0
	for _, c := range ctxs {
		fields = append(fields, c.Field)
		n += c.Size()
	}
	return fields, n
}

// saveUserSymbols writes the user symbols (UserSymbols) of the processes
// whose user call chains the trace holds.
func (s *Session) saveUserSymbols() error {
	procs, err := s.userStackProcs()
	if err != nil {
		return err
	}
	f := s.umaps.finish(procs)
	s.mapsLost = s.umaps.lost.Load()
	s.symsUnread, s.symsUnheld = s.umaps.unread, s.umaps.unheld
	return writeUserSymbols(s.cfg.Dir, f)
}

// UserFilesUnread returns, after Close, how many files mapped by the
// processes of the user call chains gave no symbols (unread: gone, or
// not ELF, when their symbols were read), and how many files were not
// held open because maxHeld were (unheld: their symbols are read from
// their path, which may be gone).
func (s *Session) UserFilesUnread() (unread, unheld int) { return s.symsUnread, s.symsUnheld }

// MappingsLost returns how many of the kernel's mmap, fork and exec
// records it dropped while user call chains were recorded: frames of
// those processes may stay unnamed.
func (s *Session) MappingsLost() uint64 { return s.mapsLost }

// SymbolsErr returns why the trace lacks the kernel's symbols
// (KernelSymbols) when it records kernel call chains, or nil.
func (s *Session) SymbolsErr() error { return s.symErr }

// StackCounts returns the call chains recorded cut at their depth and
// those recorded empty (recorder.StackCounts), so far, or after Close
// those at Close; zero when no event records any, or while Close is
// under way. It reads the counters on the drainer's goroutine, as
// Stats does, so that it may run beside Close. It fails when the
// counters cannot be read.
func (s *Session) StackCounts() (recorder.StackCounts, error) {
	if c := s.finalStacks.Load(); c != nil {
		return *c, nil
	}
	var out recorder.StackCounts
	err := s.dr.do(func() error {
		if s.rec == nil || !s.rec.Loaded() {
			return nil
		}
		var err error
		out, err = s.rec.StackCounts()
		return err
	})
	if errors.Is(err, ErrClosed) {
		if c := s.finalStacks.Load(); c != nil {
			return *c, nil
		}
		return recorder.StackCounts{}, nil
	}
	return out, err
}
