package relayd

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/kconsume/kconsume/relayfmt"
)

// Tee writes a channel to a local directory and streams it to relayd.
// The local copy decides: its errors are the Tee's errors, and it is
// written at the speed of the disk, whatever the network does. Each
// packet is written locally first; a goroutine per stream then reads it
// back from the local file and sends it to relayd, so a relayd that
// stalls or hangs (each exchange waits up to the session's timeout)
// holds up no local write: relayd falls behind (Behind) and catches up,
// or the Sink counts what it could not send (Sink.Stats). The zero value
// with Dir and Remote set is ready.
//
// With a local copy written in chunks (chunks.Sink) and a remote Sink
// that rotates too, the Tee rotates both (CloseChunk): relayd gets every
// packet of a chunk before its rotation, and the next chunk's from the
// local copy's next files.
type Tee struct {
	Dir    LocalCopy     // the local copy
	Remote relayfmt.Sink // a *Sink, which counts what it could not send

	mu      sync.Mutex
	cond    sync.Cond // signalled when a sender goes idle
	senders map[string]*sender
	closed  bool
	wg      sync.WaitGroup
	// sendersWG counts the senders' goroutines alone (CloseChunk).
	sendersWG sync.WaitGroup

	// The metadata relayd is to have: the latest text and its
	// generation; the generation relayd has (under mmu).
	meta     []byte
	metaGen  uint64
	mmu      sync.Mutex
	metaSent uint64
	metaErr  error
}

// LocalCopy is a Tee's local sink, whose stream files the Tee reads back
// by their path: a relayfmt.DirSink, or a chunks.Sink.
type LocalCopy interface {
	relayfmt.Sink
	// Path returns the file stream name is written to now.
	Path(name string) string
	WriteFinal(name string, packets ...[]byte) error
	Reserve(names []string, packetSize int) error
}

// sender sends one stream's packets to relayd, read back from the local
// copy in the order they were written.
type sender struct {
	name  string
	f     *os.File // the local stream file, read side
	off   int64    // offset of the next packet to send
	queue []queued // packets written locally, not yet sent or counted
	busy  bool     // sending one now
	done  bool     // no more packets will come
	buf   []byte
}

type queued struct {
	size int
	meta uint64 // the metadata generation the packet needs
}

func (t *Tee) init() {
	if t.senders == nil {
		t.senders = map[string]*sender{}
		t.cond.L = &t.mu
	}
}

// Local reports true: a channel writes the Tee from its writer, as it
// writes a local directory (relayfmt.LocalSink); sending to relayd is
// the Tee's goroutines' work.
func (t *Tee) Local() bool { return true }

// WriteMetadata writes text locally and has it sent to relayd, at once
// from a goroutine, and before any packet written after it; it returns
// the local error only.
func (t *Tee) WriteMetadata(text []byte) error {
	if err := t.Dir.WriteMetadata(text); err != nil {
		return err
	}
	t.mu.Lock()
	t.meta = append([]byte(nil), text...)
	t.metaGen++
	gen := t.metaGen
	t.wg.Add(1)
	t.mu.Unlock()
	// Sent at once, not only before the next packet: relayd's session
	// is readable, and a live viewer can start, before any packet.
	go func() {
		defer t.wg.Done()
		t.syncMeta(gen)
	}()
	return nil
}

// syncMeta sends relayd the latest metadata when it has an older one
// than generation gen. relayd's failures are the Sink's to count.
func (t *Tee) syncMeta(gen uint64) {
	t.mmu.Lock()
	defer t.mmu.Unlock()
	if t.metaSent >= gen {
		return
	}
	t.mu.Lock()
	text, latest := t.meta, t.metaGen
	t.mu.Unlock()
	t.metaErr = t.Remote.WriteMetadata(text)
	t.metaSent = latest
}

// WritePacket writes packet locally and queues it for relayd; it returns
// the local error only, and never waits on relayd.
func (t *Tee) WritePacket(name string, packet []byte) error {
	if err := t.Dir.WritePacket(name, packet); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	s := t.senders[name]
	if s == nil {
		f, err := os.Open(t.Dir.Path(name))
		if err != nil {
			// Written, but unreadable: the Sink refuses an empty
			// packet and counts it as not sent.
			_ = t.Remote.WritePacket(name, nil)
			return nil
		}
		s = &sender{name: name, f: f}
		t.senders[name] = s
		t.wg.Add(1)
		t.sendersWG.Add(1)
		go t.send(s)
	}
	s.queue = append(s.queue, queued{size: len(packet), meta: t.metaGen})
	t.cond.Broadcast()
	return nil
}

// send is a stream's sender goroutine: it sends the queued packets in
// order until Close.
func (t *Tee) send(s *sender) {
	defer t.wg.Done()
	defer t.sendersWG.Done()
	defer s.f.Close()
	t.mu.Lock()
	for {
		for len(s.queue) == 0 && !s.done {
			t.cond.Wait()
		}
		if len(s.queue) == 0 {
			t.mu.Unlock()
			return
		}
		q := s.queue[0]
		s.busy = true
		t.mu.Unlock()
		t.syncMeta(q.meta)
		if cap(s.buf) < q.size {
			s.buf = make([]byte, q.size)
		}
		p := s.buf[:q.size]
		if _, err := s.f.ReadAt(p, s.off); err != nil {
			p = nil // the Sink refuses it and counts it as not sent
		}
		_ = t.Remote.WritePacket(s.name, p)
		s.off += int64(q.size)
		t.mu.Lock()
		s.queue = s.queue[1:]
		s.busy = false
		t.cond.Broadcast()
	}
}

// Behind returns how many packets written locally relayd has not been
// sent yet (nor counted as not sent).
func (t *Tee) Behind() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n uint64
	for _, s := range t.senders {
		n += uint64(len(s.queue))
	}
	return n
}

// Sync waits until every packet written so far and the latest metadata
// went to relayd (sent, or counted as not sent), so that a live beacon
// after it comes after them. It returns ctx's error when relayd is
// still behind then.
func (t *Tee) Sync(ctx context.Context) error {
	t.mu.Lock()
	gen := t.metaGen
	t.mu.Unlock()
	t.syncMeta(gen)
	stop := context.AfterFunc(ctx, func() {
		t.mu.Lock()
		t.cond.Broadcast()
		t.mu.Unlock()
	})
	defer stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	for {
		behind := false
		for _, s := range t.senders {
			if len(s.queue) > 0 {
				behind = true
			}
		}
		if !behind {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("relayd is behind: %w", err)
		}
		t.cond.Wait()
	}
}

// WriteFinal ends stream name of the local copy with packets after its
// failure (relayfmt.FinalSink); relayd is not told: the local copy
// decides. It returns the local sink's error.
func (t *Tee) WriteFinal(name string, packets ...[]byte) error {
	return t.Dir.WriteFinal(name, packets...)
}

// Reserve sets room aside in the local copy (relayfmt.Reserver) and
// returns its error.
func (t *Tee) Reserve(names []string, packetSize int) error {
	return t.Dir.Reserve(names, packetSize)
}

// Rotates reports whether the Tee writes chunks: its local copy and
// relayd's Sink both do (relayfmt.CanRotate).
func (t *Tee) Rotates() bool {
	return relayfmt.CanRotate(t.Dir) && relayfmt.CanRotate(t.Remote)
}

// CloseChunk closes the current chunk c on relayd, then in the local copy
// (relayfmt.Rotator), and with next begins the next on both. relayd
// rotates what it has: the Tee first waits until every packet written
// so far went to relayd (sent, or counted as not sent), which holds the
// channel's writer for as long as relayd takes, up to its timeout a
// packet, as relayd's Sink alone does. The senders, which read the
// closed chunk's files, end; the next chunk's packets start new ones on
// the next chunk's files. relayd's failure is its Sink's to count; the
// error returned is the local copy's.
func (t *Tee) CloseChunk(c relayfmt.Chunk, next bool) error {
	local, ok := t.Dir.(relayfmt.Rotator)
	remote, rok := t.Remote.(relayfmt.Rotator)
	if !ok || !rok {
		return relayfmt.ErrNoRotate
	}
	_ = t.Sync(context.Background())
	_ = remote.CloseChunk(c, next)
	t.mu.Lock()
	t.init()
	old := t.senders
	t.senders = map[string]*sender{}
	for _, s := range old {
		s.done = true
	}
	t.cond.Broadcast()
	t.mu.Unlock()
	// Their queues are empty (Sync): they end at once, and close the
	// closed chunk's files before the local copy moves them.
	t.sendersWG.Wait()
	return local.CloseChunk(c, next)
}

// Close closes the local copy, lets the senders send (or count) every
// packet written, and closes the remote Sink. It returns the local error
// only: the remote Sink's Stats say what relayd missed.
func (t *Tee) Close() error {
	err := t.Dir.Close()
	t.mu.Lock()
	t.init()
	if t.closed {
		t.mu.Unlock()
		return err
	}
	t.closed = true
	for _, s := range t.senders {
		s.done = true
	}
	t.cond.Broadcast()
	gen := t.metaGen
	t.mu.Unlock()
	t.wg.Wait()
	t.syncMeta(gen)
	_ = t.Remote.Close()
	return err
}
