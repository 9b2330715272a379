package relayd

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kconsume/kconsume/relayfmt"
)

// Rotation over relayd's protocol (ROTATION.md): the sink is a
// relayfmt.Rotator.

// CloseChunk closes the current trace chunk on relayd (relayfmt.Rotator),
// as lttng-sessiond rotates a session: once relayd has every packet sent
// (data pending), it creates the next chunk, switches every stream to it
// after its last packet and the metadata stream at once, and closes the
// old chunk, which relayd moves to the session's archives/ directory
// (BEGIN-END-ID/kernel, LTTng's layout). The channel then sends the next
// chunk's metadata whole. Without next the streams switch to no chunk,
// so that the last one is archived too once Close closes them. It fails,
// stopping the sink, when relayd is lost or refuses, or still misses
// packets after the session's timeout; a live session refuses, as
// lttng-sessiond does: its viewers cannot follow a chunk's new UUID.
func (s *Sink) CloseChunk(ch relayfmt.Chunk, next bool) error {
	s.lmu.Lock() // no live beacon meanwhile
	defer s.lmu.Unlock()
	s.mmu.Lock()
	defer s.mmu.Unlock()
	if s.cfg.Session.LiveTimer != 0 {
		return errors.New("relayd: a live session cannot rotate")
	}
	s.mu.Lock()
	c, failed, meta := s.c, s.err, s.meta
	streams := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		streams = append(streams, st)
	}
	s.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("relayd %s: %w", s.cfg.URL, failed)
	}
	slices.SortFunc(streams, func(a, b *stream) int { return int(a.handle - b.handle) })
	// relayd switches a stream after a packet it has of the old chunk;
	// one that has none would put its next packet, the new chunk's, in
	// the old chunk's files. Such a stream ends the old chunk with an
	// empty packet, as lttng-consumerd flushes one into every stream.
	if err := s.closeEmpty(c, streams, ch.End); err != nil {
		s.fail(c, err)
		return fmt.Errorf("relayd %s: %w", s.cfg.URL, err)
	}
	if err := s.rotate(c, streams, meta, next); err != nil {
		s.fail(c, err)
		return fmt.Errorf("relayd %s: %w", s.cfg.URL, err)
	}
	// The metadata stream is empty in the new chunk, and the text to
	// come is under the new chunk's UUID.
	s.metaText, s.metaUUID = nil, nil
	for _, st := range streams {
		// A chunk's first packet may begin before the old chunk's
		// end (relayfmt.Channel.Rotate), in files of its own that no
		// live viewer reads on from the old ones.
		st.mu.Lock()
		st.floor, st.inChunk = 0, false
		st.mu.Unlock()
	}
	return nil
}

// closeEmpty sends an empty packet stamped at, under the current chunk's
// metadata, for each of streams that sent none in the current chunk.
// The caller holds s.mmu.
func (s *Sink) closeEmpty(c *Client, streams []*stream, at uint64) error {
	var m *relayfmt.Metadata
	for _, st := range streams {
		st.mu.Lock()
		err := func() error {
			if st.inChunk {
				return nil
			}
			if m == nil {
				var err error
				if m, err = relayfmt.ParseMetadata(s.metaText); err != nil {
					return fmt.Errorf("the chunk's metadata: %w", err)
				}
			}
			return s.sendEmpty(c, st, m, max(at, st.floor))
		}()
		st.mu.Unlock()
		if err != nil {
			return fmt.Errorf("stream %s: empty packet closing the chunk: %w", st.name, err)
		}
	}
	return nil
}

// rotate moves streams and the metadata stream meta to the next trace
// chunk of c (none without next) and closes the current one.
func (s *Sink) rotate(c *Client, streams []*stream, meta uint64, next bool) error {
	// Our chunks number their packets from 1 again, so relayd would take
	// any packet of the old chunk it has yet to flush for the switch:
	// the old chunk's tail would land in the new one's files.
	if err := s.drain(c, streams); err != nil {
		return err
	}
	old := c.Chunk()
	var id uint64
	if next {
		var err error
		if id, err = c.CreateTraceChunk(time.Now()); err != nil {
			return err
		}
	}
	pos := make([]StreamPosition, 0, len(streams)+1)
	for _, st := range streams {
		st.mu.Lock()
		// The packet after the last one relayd has, which it has
		// flushed: the switch happens there at once.
		pos = append(pos, StreamPosition{Stream: st.handle, At: st.seqNum + 1})
		st.mu.Unlock()
	}
	pos = append(pos, StreamPosition{Stream: meta})
	if err := c.RotateStreams(id, next, pos); err != nil {
		return err
	}
	if _, err := c.CloseTraceChunk(old, time.Now()); err != nil {
		return err
	}
	return nil
}
