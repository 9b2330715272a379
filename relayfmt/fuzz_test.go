package relayfmt

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// goldenMeta returns the golden trace's metadata and its stream files.
func goldenFiles(f *testing.F) (meta []byte, streams [][]byte) {
	meta, err := os.ReadFile(filepath.Join(goldenDir, "metadata"))
	if err != nil {
		f.Fatal(err)
	}
	for _, n := range []string{"trace0", "trace1"} {
		b, err := os.ReadFile(filepath.Join(goldenDir, n))
		if err != nil {
			f.Fatal(err)
		}
		streams = append(streams, b)
	}
	return meta, streams
}

// readStream runs a StreamReader over b to its end, decoding every field,
// and returns the reader.
func readStream(meta *Metadata, b []byte) *StreamReader {
	s := NewStreamReader(meta, "fuzz", bytes.NewReader(b), int64(len(b)))
	var vals []Value
	for s.Next() {
		if it := s.Item(); it.Kind == EventItem {
			vals, _ = it.Fields(vals)
			for _, v := range vals {
				_ = AppendValue(nil, v)
			}
		}
	}
	return s
}

func FuzzStreamReader(f *testing.F) {
	metaText, streams := goldenFiles(f)
	meta, err := ParseMetadata(metaText)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range streams {
		f.Add(s)
		f.Add(s[:len(s)/2+17])
		f.Add(s[:PacketHeaderSize+9])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := readStream(meta, b)
		if s.GoodSize() > int64(len(b)) {
			t.Fatalf("good size %d past the end %d", s.GoodSize(), len(b))
		}
	})
}

func FuzzParseMetadata(f *testing.F) {
	metaText, _ := goldenFiles(f)
	f.Add(metaText)
	f.Add(metaText[:len(metaText)/3])
	f.Add([]byte("/* CTF 1.8 */ typealias integer { size = 8; align = 8; } := a; trace { packet.header := struct { a x[a]; }; };"))
	f.Fuzz(func(t *testing.T, text []byte) {
		m, err := ParseMetadata(text)
		if err != nil {
			return
		}
		// What parses must write back to text that parses the same.
		again, err := ParseMetadata(m.TSDL())
		if err != nil {
			t.Fatalf("rewritten metadata does not parse: %v", err)
		}
		if !bytes.Equal(again.TSDL(), m.TSDL()) {
			t.Fatal("metadata is not stable through a rewrite")
		}
	})
}

func FuzzRecover(f *testing.F) {
	metaText, streams := goldenFiles(f)
	for _, s := range streams {
		f.Add(s, uint16(100), byte(0))
		f.Add(s, uint16(5000), byte(0xff))
	}
	f.Fuzz(func(t *testing.T, stream []byte, at uint16, val byte) {
		if int(at) < len(stream) {
			stream = bytes.Clone(stream)
			stream[at] ^= val
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, MetadataFile), metaText, 0o640); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "trace0")
		if err := os.WriteFile(path, stream, 0o640); err != nil {
			t.Fatal(err)
		}
		res, err := Recover(dir)
		if err != nil {
			t.Fatal(err)
		}
		kept, _ := os.ReadFile(path)
		if int64(len(kept)) != res[0].Kept || len(kept)%4096 != 0 {
			t.Fatalf("recover kept %d bytes, reported %d", len(kept), res[0].Kept)
		}
		// What Recover keeps reads to the end without error.
		meta, _ := ParseMetadata(metaText)
		if s := readStream(meta, kept); s.Err() != nil {
			t.Fatalf("recovered stream does not read: %v", s.Err())
		}
	})
}
