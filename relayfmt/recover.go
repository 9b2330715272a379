package relayfmt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// RecoverResult says what Recover did to one stream file.
type RecoverResult struct {
	File    string
	Size    int64 // bytes before
	Kept    int64 // bytes after
	Packets int   // whole packets kept
	// Reason is why the file was cut; empty when it was kept whole.
	Reason string
}

// Cut reports whether Recover shortened the file.
func (r RecoverResult) Cut() bool { return r.Kept != r.Size }

// Recover cuts every stream file of the trace in dir back to its last
// whole valid sub-buffer: magic and uuid right, packet_size equal to the
// channel's sub-buffer size, content_size within it, the packet inside the
// file, timestamps in order, every event decodable. It removes a leftover
// temporary metadata file and the room a recorder kept for its last
// packets (ReserveFile). babeltrace2 rejects a whole trace for one cut
// packet; after Recover it reads what was whole. It fails if the metadata
// is unreadable (it is written atomically, so a crash leaves the old one).
func Recover(dir string) ([]RecoverResult, error) {
	t, err := Open(dir)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	dir = t.Dir
	for _, leftover := range []string{metadataTemp, ReserveFile} {
		if err := os.Remove(filepath.Join(dir, leftover)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("recover: %w", err)
		}
	}
	var res []RecoverResult
	for _, name := range t.Streams {
		r, err := recoverStream(t.Meta, filepath.Join(dir, name))
		if err != nil {
			return res, fmt.Errorf("recover: %w", err)
		}
		res = append(res, r)
	}
	return res, nil
}

func recoverStream(meta *Metadata, path string) (RecoverResult, error) {
	s, err := OpenStream(meta, path)
	if err != nil {
		return RecoverResult{}, err
	}
	defer s.Close()
	r := RecoverResult{File: filepath.Base(path), Size: s.size}
	want := uint64(meta.SubbufSize) * 8
	for s.Next() {
		if h, off := s.Packet(); h.PacketSize != want {
			s.fail(off, "packet size %d bits, the channel's sub-buffers are %d", h.PacketSize, want)
			break
		}
	}
	r.Kept, r.Packets = s.GoodSize(), s.Packets()
	if s.Err() != nil {
		r.Reason = s.Err().Error()
	}
	if r.Kept == r.Size {
		return r, nil
	}
	if err := os.Truncate(path, r.Kept); err != nil {
		return r, fmt.Errorf("cut %s to %d bytes: %w", path, r.Kept, err)
	}
	return r, nil
}
