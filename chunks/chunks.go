// Package chunks writes a trace in chunks laid out as LTTng lays out a
// rotated session (lttng-concepts(7), "Trace chunk archive naming"): the
// current chunk is written where the trace would be, ROOT/TRACE, and each
// closed one is moved, whole, to ROOT/archives/BEGIN-END-ID/TRACE, BEGIN
// and END its local start and end time in the form YYYYmmddTHHMMSS±HHMM
// and ID its index from 0. A closed chunk is a complete trace that
// readers take alone. Under a budget of chunks or bytes the oldest closed
// chunks are deleted first, and what they held is counted.
package chunks

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"github.com/kconsume/kconsume/relayfmt"
)

// ArchivesDir is the directory of the closed chunks in a session's.
const ArchivesDir = relayfmt.ChunksDir

// timeForm is LTTng's form of a chunk's times.
const timeForm = "20060102T150405-0700"

// Config says where a Sink writes and what it keeps.
type Config struct {
	// Root is the session directory; it must exist.
	Root string
	// Trace is the trace's directory under Root and under each closed
	// chunk: "" for Root itself, "kernel" for a trace laid out as an
	// LTTng session. It must exist.
	Trace string
	// Carry names files of the trace directory, beside the metadata and
	// the streams, that belong to every chunk (the symbols of call
	// chains): each closed chunk gets a copy of those that exist.
	Carry []string
	// MaxChunks, when set, is the most chunks kept, the current one
	// included; MaxSize, when set, the most bytes the closed chunks may
	// take beside the current one's ChunkSize (0: none). The oldest
	// closed chunks are deleted first, never the newest.
	MaxChunks int
	MaxSize   uint64
	ChunkSize uint64
}

// Stats counts a Sink's chunks.
type Stats struct {
	// Closed counts the chunks closed; Kept those still on disk, of
	// KeptBytes.
	Closed, Kept int
	KeptBytes    uint64
	// Deleted counts the closed chunks deleted under the budget, and
	// DeletedBytes, DeletedEvents and DeletedDiscarded what they held:
	// their bytes, their events and the events they reported lost.
	Deleted                                       int
	DeletedBytes, DeletedEvents, DeletedDiscarded uint64
	// Last is the directory of the newest closed chunk still kept, or
	// empty.
	Last string
}

// Sink is a relayfmt.Sink, relayfmt.Rotator, FinalSink and Reserver
// that writes the current chunk through a relayfmt.DirSink and archives
// closed ones. It is safe for the concurrent use relayfmt.Sink
// describes; CloseChunk needs every stream quiescent, as Channel.Rotate
// has them.
type Sink struct {
	cfg Config

	mu      sync.Mutex
	cur     *relayfmt.DirSink
	streams map[string]bool // the current chunk's stream files
	// What Reserve was asked for, asked again of each chunk.
	resNames []string
	resSize  int
	kept     []archived
	stats    Stats
}

// archived is a closed chunk on disk.
type archived struct {
	dir               string
	bytes             uint64
	events, discarded uint64
}

// New returns a sink writing the current chunk into cfg.Root/cfg.Trace.
// It fails when that directory does not exist, or for a budget that
// keeps no closed chunk.
func New(cfg Config) (*Sink, error) {
	if cfg.MaxChunks < 0 || cfg.MaxChunks == 1 {
		return nil, fmt.Errorf("chunks: at most %d chunks keeps no closed one: want 2 or more", cfg.MaxChunks)
	}
	if cfg.MaxSize != 0 && cfg.MaxSize < cfg.ChunkSize*2 {
		return nil, fmt.Errorf("chunks: at most %d bytes keeps no closed chunk of %d beside the current one: want %d or more", cfg.MaxSize, cfg.ChunkSize, cfg.ChunkSize*2)
	}
	d, err := relayfmt.NewDirSink(filepath.Join(cfg.Root, cfg.Trace))
	if err != nil {
		return nil, fmt.Errorf("chunks: %w", err)
	}
	return &Sink{cfg: cfg, cur: d, streams: map[string]bool{}}, nil
}

func (s *Sink) current() (*relayfmt.DirSink, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil, errors.New("chunks: no current chunk: the trace is closed")
	}
	return s.cur, nil
}

// Path returns the path of stream file name in the chunk being written,
// in the trace's directory.
func (s *Sink) Path(name string) string {
	return filepath.Join(s.cfg.Root, s.cfg.Trace, name)
}

// WriteMetadata writes the current chunk's metadata.
func (s *Sink) WriteMetadata(text []byte) error {
	d, err := s.current()
	if err != nil {
		return err
	}
	return d.WriteMetadata(text)
}

// WritePacket appends packet to the current chunk's stream file name.
func (s *Sink) WritePacket(name string, packet []byte) error {
	s.mu.Lock()
	d := s.cur
	if d != nil && !s.streams[name] {
		s.streams[name] = true
	}
	s.mu.Unlock()
	if d == nil {
		return errors.New("chunks: no current chunk: the trace is closed")
	}
	return d.WritePacket(name, packet)
}

// WriteFinal appends the last packets of a failed stream to the current
// chunk (relayfmt.FinalSink).
func (s *Sink) WriteFinal(name string, packets ...[]byte) error {
	s.mu.Lock()
	d := s.cur
	if d != nil {
		s.streams[name] = true
	}
	s.mu.Unlock()
	if d == nil {
		return errors.New("chunks: no current chunk: the trace is closed")
	}
	return d.WriteFinal(name, packets...)
}

// Reserve sets room aside in the current chunk for the last packets of
// streams names (relayfmt.Reserver), and again in each chunk that
// follows.
func (s *Sink) Reserve(names []string, packetSize int) error {
	d, err := s.current()
	if err != nil {
		return err
	}
	if err := d.Reserve(names, packetSize); err != nil {
		return err
	}
	s.mu.Lock()
	s.resNames, s.resSize = append(s.resNames, names...), packetSize
	s.mu.Unlock()
	return nil
}

// Local reports true: the chunks are on this machine's disk.
func (*Sink) Local() bool { return true }

// CloseChunk closes the current chunk, c: its files are synced and moved,
// with a copy of the Carry files, to a closed chunk's directory, which
// appears whole; then the budget deletes the oldest closed chunks it no
// longer holds. With next set the next chunk begins in the trace
// directory, with room set aside for its streams' last packets as
// before. It fails when a file cannot be synced or moved (the chunk then
// stays where it was), or when no room can be set aside.
func (s *Sink) CloseChunk(c relayfmt.Chunk, next bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return errors.New("chunks: no current chunk: the trace is closed")
	}
	closeErr := s.cur.Close()
	s.cur = nil
	a, err := s.archive(c)
	if err != nil {
		return errors.Join(closeErr, err)
	}
	s.kept = append(s.kept, a)
	s.stats.Closed++
	s.trim(next)
	if !next {
		return closeErr
	}
	d, err := relayfmt.NewDirSink(filepath.Join(s.cfg.Root, s.cfg.Trace))
	if err != nil {
		return errors.Join(closeErr, fmt.Errorf("chunk %d: %w", c.Index+1, err))
	}
	s.cur = d
	s.streams = map[string]bool{}
	if len(s.resNames) > 0 {
		if err := d.Reserve(s.resNames, s.resSize); err != nil {
			return errors.Join(closeErr, fmt.Errorf("chunk %d: %w", c.Index+1, err))
		}
	}
	return closeErr
}

// archive moves the current chunk's files into the closed chunk c's
// directory, built beside it under a dot-name and renamed into place
// once whole, and returns it.
func (s *Sink) archive(c relayfmt.Chunk) (archived, error) {
	name := fmt.Sprintf("%s-%s-%d", c.BeginTime.Format(timeForm), c.EndTime.Format(timeForm), c.Index)
	archives := filepath.Join(s.cfg.Root, ArchivesDir)
	tmp := filepath.Join(archives, "."+name+".tmp")
	final := filepath.Join(archives, name)
	dst := filepath.Join(tmp, s.cfg.Trace)
	if err := os.MkdirAll(dst, 0o750); err != nil {
		return archived{}, fmt.Errorf("closing chunk %d: %w", c.Index, err)
	}
	src := filepath.Join(s.cfg.Root, s.cfg.Trace)
	files := append([]string{relayfmt.MetadataFile}, sortedKeys(s.streams)...)
	var moved []string
	undo := func(err error) (archived, error) {
		for _, f := range moved {
			_ = os.Rename(filepath.Join(dst, f), filepath.Join(src, f))
		}
		_ = os.RemoveAll(tmp)
		return archived{}, fmt.Errorf("closing chunk %d: %w", c.Index, err)
	}
	for _, f := range files {
		if err := os.Rename(filepath.Join(src, f), filepath.Join(dst, f)); err != nil {
			if errors.Is(err, os.ErrNotExist) && f != relayfmt.MetadataFile {
				continue
			}
			return undo(err)
		}
		moved = append(moved, f)
	}
	for _, f := range s.cfg.Carry {
		if err := copyFile(filepath.Join(src, f), filepath.Join(dst, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return undo(err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return undo(err)
	}
	a := archived{dir: final, events: c.Events, discarded: c.Discarded}
	a.bytes, _ = dirBytes(final)
	return a, nil
}

// trim deletes the oldest closed chunks beyond the budget, never the
// newest; with current set, a chunk is being written beside them.
func (s *Sink) trim(current bool) {
	over := func() bool {
		n := len(s.kept)
		if n <= 1 {
			return false
		}
		if current {
			n++
		}
		if s.cfg.MaxChunks > 0 && n > s.cfg.MaxChunks {
			return true
		}
		if s.cfg.MaxSize == 0 {
			return false
		}
		var bytes uint64
		for _, a := range s.kept {
			bytes += a.bytes
		}
		if current {
			bytes += s.cfg.ChunkSize
		}
		return bytes > s.cfg.MaxSize
	}
	for over() {
		a := s.kept[0]
		if err := os.RemoveAll(a.dir); err != nil {
			// Kept, and counted as kept: the budget is tried again
			// at the next chunk.
			return
		}
		s.kept = slices.Delete(s.kept, 0, 1)
		s.stats.Deleted++
		s.stats.DeletedBytes += a.bytes
		s.stats.DeletedEvents += a.events
		s.stats.DeletedDiscarded += a.discarded
	}
}

// Stats returns the sink's counts so far.
func (s *Sink) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Kept = len(s.kept)
	for _, a := range s.kept {
		st.KeptBytes += a.bytes
	}
	if len(s.kept) > 0 {
		st.Last = s.kept[len(s.kept)-1].dir
	}
	return st
}

// Close syncs and closes the current chunk's files, if a chunk is open,
// and returns the first error of any of its streams.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil
	}
	err := s.cur.Close()
	s.cur = nil
	return err
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// copyFile copies src to dst, a new file.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// dirBytes returns the size of the regular files under dir.
func dirBytes(dir string) (uint64, error) {
	var n uint64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += uint64(fi.Size())
		}
		return nil
	})
	return n, err
}
