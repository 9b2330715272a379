package relayfmt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Sink receives finished packets and the metadata of a channel.
type Sink interface {
	// WriteMetadata replaces the trace's metadata with text atomically:
	// a reader sees the old or the new text, never a mix.
	WriteMetadata(text []byte) error
	// WritePacket appends one whole packet to the stream file name
	// ("trace0", or "trace" in global mode). Calls for one name come from
	// one goroutine at a time, in order; different names may be written
	// concurrently. On error no part of the packet may remain.
	WritePacket(name string, packet []byte) error
	// Close flushes and releases everything.
	Close() error
}

// LocalSink is a Sink that can say its WritePacket returns once the
// page cache holds the packet, waiting on no network or peer. A
// NoOverwrite channel writes finished sub-buffers to a local sink from
// its writer (Channel.Commit), as LTTng's consumer daemon writes from
// the thread that read the sub-buffer, instead of waking a goroutine per
// buffer: under a saturating load those wakeups cost more than the
// writes. Sinks that wrap another forward their inner sink's answer.
type LocalSink interface {
	Sink
	// Local reports whether WritePacket never waits on more than local
	// storage.
	Local() bool
}

// IsLocal reports whether sink is a LocalSink that says it is local: a
// sink that wraps another answers Local with it.
func IsLocal(sink Sink) bool {
	l, ok := sink.(LocalSink)
	return ok && l.Local()
}

// FinalSink is a Sink that can end a stream it failed to write (a full
// disk) with one last packet, so that the events it never took are
// reported as discarded at their place: the channel writes then, at
// Close, an empty packet whose events_discarded counts them. Sinks that
// wrap another forward to their inner sink.
type FinalSink interface {
	// WriteFinal appends packets, whole, to stream name after its last
	// whole packet, whatever failed before; it may use room the sink set
	// aside for it. It returns why it could not.
	WriteFinal(name string, packets ...[]byte) error
}

// Reserver is a Sink that sets room aside, when the channel starts, for
// the last packets of its streams (FinalSink), so that a full disk
// leaves room to count what it lost. Sinks that wrap another forward to
// their inner sink.
type Reserver interface {
	// Reserve sets room aside for the last packets, of packetSize
	// bytes, of streams names, and fails when there is none.
	Reserve(names []string, packetSize int) error
}

// Reserve calls sink's Reserve when it is a Reserver, and returns nil
// when it is not.
func Reserve(sink Sink, names []string, packetSize int) error {
	if r, ok := sink.(Reserver); ok {
		return r.Reserve(names, packetSize)
	}
	return nil
}

// WriteFinal gives packets to sink's WriteFinal when it is a FinalSink;
// it returns an error saying so when it is not.
func WriteFinal(sink Sink, name string, packets ...[]byte) error {
	f, ok := sink.(FinalSink)
	if !ok {
		return fmt.Errorf("stream %s: the sink takes no last packet after a failure", name)
	}
	return f.WriteFinal(name, packets...)
}

// MetadataWriter is a Sink that takes the metadata as a structure rather
// than as text: a sink that rewrites it (profile.Sink names classes in
// another tracer's dialect) then needs no parse. The channel passes its
// metadata to WriteMetadataOf when its sink has it, and must not be
// changed or kept beyond the call.
type MetadataWriter interface {
	WriteMetadataOf(m *Metadata) error
}

// writeMetadata gives m to sink, as a structure when it takes one.
func writeMetadata(sink Sink, m *Metadata) error {
	if w, ok := sink.(MetadataWriter); ok {
		return w.WriteMetadataOf(m)
	}
	return sink.WriteMetadata(m.TSDL())
}

// MetadataFile is the metadata's file name in a trace directory.
const MetadataFile = "metadata"

// metadataTemp is a dot-file, which CTF readers ignore.
const metadataTemp = ".metadata.tmp"

// ReserveFile is the dot-file in which a DirSink keeps room, allocated
// when the channel starts (Reserver), for the last packets (FinalSink) of
// a stream whose write failed on a full disk. It is removed at Close; `kconsume
// recover` removes one a killed recorder left.
const ReserveFile = ".reserve"

// reservePackets is the room set aside per stream, in packets: an empty
// first packet and the last one (Channel's writeFinal).
const reservePackets = 2

// DirSink writes a trace directory: metadata plus one file per stream.
// Stream files are created when their first packet arrives, never
// preallocated, and only ever hold whole packets. It is safe for the
// concurrent use the Sink interface describes.
type DirSink struct {
	dir string

	mu      sync.Mutex
	files   map[string]*streamFile
	reserve *os.File         // ReserveFile
	held    int64            // bytes held in it
	share   map[string]int64 // each stream's part of them
}

type streamFile struct {
	f    *os.File
	size int64 // bytes of whole packets written
	err  error // sticky: after a failure the stream takes no more packets
}

// NewDirSink returns a sink writing into dir, which must exist.
func NewDirSink(dir string) (*DirSink, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("trace directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("trace directory %s: not a directory", dir)
	}
	return &DirSink{dir: dir, files: map[string]*streamFile{}}, nil
}

// WriteMetadata writes text to a temporary dot-file, syncs it and renames it
// over the metadata file.
func (s *DirSink) WriteMetadata(text []byte) error {
	tmp := filepath.Join(s.dir, metadataTemp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("write metadata: %w", err)
	}
	_, err = f.Write(text)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, MetadataFile))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write metadata: %w", err)
	}
	return nil
}

// WritePacket appends packet to the stream file name. If the write fails
// (a full disk), the file is cut back to its last whole packet and the
// stream takes no further packets; the error says which file and why.
func (s *DirSink) WritePacket(name string, packet []byte) error {
	s.mu.Lock()
	sf := s.files[name]
	if sf == nil {
		sf = &streamFile{}
		if name == "" || strings.ContainsRune(name, '/') || strings.HasPrefix(name, ".") {
			sf.err = fmt.Errorf("stream file name %q: must be a plain file name", name)
		} else {
			sf.f, sf.err = os.OpenFile(filepath.Join(s.dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
			if sf.err != nil {
				sf.err = fmt.Errorf("create stream file: %w", sf.err)
			}
		}
		s.files[name] = sf
	}
	s.mu.Unlock()
	if sf.err != nil {
		return sf.err
	}
	n, err := sf.f.WriteAt(packet, sf.size)
	if err != nil || n != len(packet) {
		if err == nil {
			err = errors.New("short write")
		}
		if terr := sf.f.Truncate(sf.size); terr != nil {
			err = errors.Join(err, fmt.Errorf("cut back to %d bytes: %w", sf.size, terr))
		}
		sf.err = fmt.Errorf("write %s at offset %d: %w", sf.f.Name(), sf.size, err)
		return sf.err
	}
	sf.size += int64(n)
	return nil
}

// Reserve sets room aside on the disk, in ReserveFile, for an empty
// first packet and a last packet of packetSize bytes for each stream
// names, which WriteFinal frees and writes. It fails when the disk has
// no such room.
func (s *DirSink) Reserve(names []string, packetSize int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := reservePackets * int64(packetSize)
	if err := s.hold(n * int64(len(names))); err != nil {
		return err
	}
	if s.share == nil {
		s.share = map[string]int64{}
	}
	for _, name := range names {
		s.share[name] += n
	}
	return nil
}

// hold grows the reserve file by n bytes, allocated now; the caller
// holds s.mu. It fails when the disk has no such room.
func (s *DirSink) hold(n int64) error {
	if s.reserve == nil {
		f, err := os.OpenFile(filepath.Join(s.dir, ReserveFile), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
		if err != nil {
			return fmt.Errorf("room for a last packet: %w", err)
		}
		s.reserve = f
	}
	if err := allocate(s.reserve, s.held, n); err != nil {
		return fmt.Errorf("room for a last packet: %w", err)
	}
	s.held += n
	return nil
}

// allocate gives f disk blocks for its n bytes from off: fallocate(2),
// again when a signal interrupted it (the Go runtime's preemption signal
// does, on a large range), or zeros written where the file system has no
// fallocate (EOPNOTSUPP: NFS before 4.2, some FUSE file systems). It
// fails when the disk has no such room.
func allocate(f *os.File, off, n int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), 0, off, n)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS):
			zeros := make([]byte, min(n, 1<<20))
			for done := int64(0); done < n; {
				k := min(n-done, int64(len(zeros)))
				if _, err := f.WriteAt(zeros[:k], off+done); err != nil {
					return err
				}
				done += k
			}
			return nil
		default:
			return err
		}
	}
}

// WriteFinal frees the room set aside for stream name and appends packets
// after its last whole packet, even after a failed write. It fails when
// the stream was never created or the packets do not fit.
func (s *DirSink) WriteFinal(name string, packets ...[]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.share[name]; n > 0 && s.reserve != nil {
		// Given back to the file system, whose free room the writes
		// below then take.
		if err := s.reserve.Truncate(s.held - n); err == nil {
			s.held -= n
			delete(s.share, name)
		}
	}
	sf := s.files[name]
	if sf == nil || sf.f == nil {
		if name == "" || strings.ContainsRune(name, '/') || strings.HasPrefix(name, ".") {
			return fmt.Errorf("stream file name %q: must be a plain file name", name)
		}
		f, err := os.OpenFile(filepath.Join(s.dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
		if err != nil {
			return fmt.Errorf("create stream file: %w", err)
		}
		sf = &streamFile{f: f}
		s.files[name] = sf
	}
	for _, p := range packets {
		n, err := sf.f.WriteAt(p, sf.size)
		if err != nil || n != len(p) {
			if err == nil {
				err = errors.New("short write")
			}
			_ = sf.f.Truncate(sf.size)
			return fmt.Errorf("write %s at offset %d: %w", sf.f.Name(), sf.size, err)
		}
		sf.size += int64(n)
	}
	return nil
}

// Local reports true: the stream files are this machine's.
func (*DirSink) Local() bool { return true }

// Path returns the path of stream file name in the sink's directory.
func (s *DirSink) Path(name string) string { return filepath.Join(s.dir, name) }

// Close syncs and closes every stream file. It returns the first error of
// any stream, including earlier write failures.
func (s *DirSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, sf := range s.files {
		if sf.f == nil {
			continue
		}
		errs = append(errs, sf.err)
		if err := sf.f.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("sync %s: %w", sf.f.Name(), err))
		}
		if err := sf.f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", sf.f.Name(), err))
		}
		sf.f = nil
	}
	if s.reserve != nil {
		_ = s.reserve.Close()
		if err := os.Remove(s.reserve.Name()); err != nil {
			errs = append(errs, fmt.Errorf("remove the reserve: %w", err))
		}
		s.reserve = nil
	}
	return errors.Join(errs...)
}

// DiscardSink takes packets and metadata and keeps nothing; it counts
// packets. It measures the writer alone.
type DiscardSink struct {
	mu      sync.Mutex
	Packets int
}

// WriteMetadata does nothing.
func (*DiscardSink) WriteMetadata([]byte) error { return nil }

// Local reports true: it keeps nothing, at once.
func (*DiscardSink) Local() bool { return true }

// WritePacket counts the packet.
func (d *DiscardSink) WritePacket(string, []byte) error {
	d.mu.Lock()
	d.Packets++
	d.mu.Unlock()
	return nil
}

// Close does nothing.
func (*DiscardSink) Close() error { return nil }
