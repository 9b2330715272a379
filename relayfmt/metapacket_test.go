package relayfmt

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPacketizedMetadataTrace gives the golden trace packetized metadata,
// cut into packets in the middle of its declarations: babeltrace2 and our
// reader still agree on every event, and our reader finds the same
// metadata in it.
func TestPacketizedMetadataTrace(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(goldenDir)); err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(goldenDir, MetadataFile))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Open(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	packets := PacketizeMetadata(text, plain.Meta.UUID)
	if n := (len(packets) - len(text)) / metadataHeaderSize; len(text) > MetadataPacketText && n < 2 {
		t.Fatalf("%d bytes of text in %d packets", len(text), n)
	}
	if err := os.WriteFile(filepath.Join(dir, MetadataFile), packets, 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tr.Meta.TSDL(), plain.Meta.TSDL()) {
		t.Error("packetized metadata reads as other metadata than its text")
	}
	if n := agree(t, dir); n == 0 {
		t.Fatal("no event read")
	}
	// Packets carrying another UUID than the trace's are refused.
	other := PacketizeMetadata(text, NewUUID())
	if err := os.WriteFile(filepath.Join(dir, MetadataFile), other, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "uuid") {
		t.Errorf("packets of another uuid: %v, want a uuid error", err)
	}
}

func TestUnpacketizeMetadataErrors(t *testing.T) {
	uuid := NewUUID()
	good := PacketizeMetadata([]byte("/* CTF 1.8 */\n"+strings.Repeat("x", 5000)), uuid)
	text, got, err := UnpacketizeMetadata(good)
	if err != nil || got != uuid || len(text) != 5014 {
		t.Fatalf("round trip: %d bytes, uuid %x (%v)", len(text), got, err)
	}
	second := 4096 // the first packet is full
	set := func(off int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	setByte := func(off int, v byte) []byte {
		b := bytes.Clone(good)
		b[off] = v
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"plain text", []byte("/* CTF 1.8 */"), "magic"},
		{"truncated packet", good[:len(good)-1], "truncated"},
		{"truncated header", good[:second+10], "shorter than its header"},
		{"bad second magic", set(second, 1), "bad magic"},
		{"uuid changes", setByte(second+4, good[second+4]^1), "uuid"},
		{"checksum", set(20, 7), "checksum"},
		{"compressed", setByte(32, 1), "compressed"},
		{"version", setByte(36, 9), "CTF 1.9"},
		{"content below header", set(24, 8*10), "content of 80 bits"},
		{"content over packet", set(24, 8*5000), "content of 40000 bits"},
		{"odd bits", set(28, 8*4096+1), "whole bytes"},
	} {
		if _, _, err := UnpacketizeMetadata(c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	// Big-endian packets, as a big-endian tracer writes them, read too.
	be := bytes.Clone(good[:second])
	for _, off := range []int{0, 20, 24, 28} {
		binary.BigEndian.PutUint32(be[off:], binary.LittleEndian.Uint32(good[off:]))
	}
	if text, _, err := UnpacketizeMetadata(be); err != nil || len(text) != MetadataPacketText {
		t.Errorf("big-endian packet: %d bytes (%v)", len(text), err)
	}
	if b := PacketizeMetadata(nil, uuid); len(b) != 0 {
		t.Errorf("no text gave %d bytes of packets", len(b))
	}
}

func FuzzUnpacketizeMetadata(f *testing.F) {
	metaText, _ := goldenFiles(f)
	f.Add(PacketizeMetadata(metaText, NewUUID()))
	f.Add(PacketizeMetadata([]byte("/* CTF 1.8 */"), [16]byte{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		text, uuid, err := UnpacketizeMetadata(b)
		if err != nil {
			return
		}
		again, u2, err := UnpacketizeMetadata(PacketizeMetadata(text, uuid))
		if len(text) > 0 && (err != nil || u2 != uuid || !bytes.Equal(again, text)) {
			t.Fatalf("repacketized text does not read back: %v", err)
		}
	})
}
