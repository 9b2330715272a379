package relayfmt

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDirSinkCutsPartialWrite(t *testing.T) {
	// A real short write: RLIMIT_FSIZE is per process, so use a file that
	// cannot grow instead: a packet written to a read-only descriptor fails
	// whole, and the stream refuses further packets.
	dir := t.TempDir()
	s, err := NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	pkt := make([]byte, 4096)
	if err := s.WritePacket("trace0", pkt); err != nil {
		t.Fatal(err)
	}
	sf := s.files["trace0"]
	ro, err := os.Open(filepath.Join(dir, "trace0"))
	if err != nil {
		t.Fatal(err)
	}
	sf.f.Close()
	sf.f = ro
	if err := s.WritePacket("trace0", pkt); err == nil {
		t.Fatal("write to a read-only file succeeded")
	}
	if err := s.WritePacket("trace0", pkt); err == nil {
		t.Fatal("stream took a packet after a failure")
	}
	if fi, _ := os.Stat(filepath.Join(dir, "trace0")); fi.Size() != 4096 {
		t.Fatalf("size %d after failed write", fi.Size())
	}
	if err := s.WritePacket("../escape", pkt); err == nil {
		t.Fatal("a stream name with a path separator was accepted")
	}
	s.Close()
}
