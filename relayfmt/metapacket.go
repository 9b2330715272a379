package relayfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// The packetized form of CTF 1.8 metadata (the spec's "Metadata" section,
// as lttng-modules and lttng-ust write it): each packet is a packed
// 37-byte header then TSDL text, then padding up to packet_size.
const (
	metadataMagic      = 0x75d11d57
	metadataHeaderSize = 37 // magic 4, uuid 16, checksum 4, content_size 4, packet_size 4, five 1-byte fields
	// MetadataPacketText is the most TSDL text PacketizeMetadata puts in
	// one packet: 4 KiB packets, the size LTTng's metadata channel uses.
	MetadataPacketText = 4096 - metadataHeaderSize
)

// IsPacketizedMetadata reports whether b begins with a metadata packet
// header's magic, in either byte order.
func IsPacketizedMetadata(b []byte) bool {
	if len(b) < 4 {
		return false
	}
	return binary.LittleEndian.Uint32(b) == metadataMagic || binary.BigEndian.Uint32(b) == metadataMagic
}

// PacketizeMetadata returns text cut into little-endian metadata packets
// of at most MetadataPacketText bytes of text each, every header carrying
// uuid, CTF 1.8 and no padding. Each packet begins where the one before
// ends, so any run of whole packets decodes on its own: that is what lets
// a live viewer take metadata that grows while it reads, where plain text
// needs its "/* CTF 1.8" signature at the start of every piece it is
// given (babeltrace2's ctf_metadata_decoder_append_content). Empty text
// gives no packet.
func PacketizeMetadata(text []byte, uuid [16]byte) []byte {
	n := (len(text) + MetadataPacketText - 1) / MetadataPacketText
	out := make([]byte, 0, len(text)+n*metadataHeaderSize)
	for len(text) > 0 {
		chunk := text[:min(len(text), MetadataPacketText)]
		text = text[len(chunk):]
		bits := uint32(metadataHeaderSize+len(chunk)) * 8
		out = binary.LittleEndian.AppendUint32(out, metadataMagic)
		out = append(out, uuid[:]...)
		out = binary.LittleEndian.AppendUint32(out, 0) // checksum: none
		out = binary.LittleEndian.AppendUint32(out, bits)
		out = binary.LittleEndian.AppendUint32(out, bits)
		// compression, encryption and checksum schemes: none; CTF 1.8.
		out = append(out, 0, 0, 0, 1, 8)
		out = append(out, chunk...)
	}
	return out
}

// UnpacketizeMetadata returns the TSDL text of a run of metadata packets
// and the UUID their headers carry. It fails, naming the packet's offset,
// on a truncated packet, a content size below the header's or above the
// packet's, a version other than 1.8, compression, encryption or a
// checksum (which CTF readers do not support either), packets that
// disagree on the UUID or the byte order, or text over MaxMetadataSize.
func UnpacketizeMetadata(b []byte) (text []byte, uuid [16]byte, err error) {
	if !IsPacketizedMetadata(b) {
		return nil, uuid, errors.New("metadata: no metadata packet magic")
	}
	var bo binary.ByteOrder = binary.LittleEndian
	if binary.LittleEndian.Uint32(b) != metadataMagic {
		bo = binary.BigEndian
	}
	var out bytes.Buffer
	for off := 0; off < len(b); {
		p := b[off:]
		if len(p) < metadataHeaderSize {
			return nil, uuid, fmt.Errorf("metadata packet at %d: %d bytes, shorter than its header", off, len(p))
		}
		if bo.Uint32(p) != metadataMagic {
			return nil, uuid, fmt.Errorf("metadata packet at %d: bad magic %#x", off, bo.Uint32(p))
		}
		var u [16]byte
		copy(u[:], p[4:20])
		if off == 0 {
			uuid = u
		} else if u != uuid {
			return nil, uuid, fmt.Errorf("metadata packet at %d: uuid differs from the first packet's", off)
		}
		checksum, content, size := bo.Uint32(p[20:]), bo.Uint32(p[24:]), bo.Uint32(p[28:])
		comp, enc, sum, major, minor := p[32], p[33], p[34], p[35], p[36]
		switch {
		case comp != 0 || enc != 0:
			return nil, uuid, fmt.Errorf("metadata packet at %d: compressed or encrypted (schemes %d, %d), which CTF readers do not support", off, comp, enc)
		case sum != 0 || checksum != 0:
			return nil, uuid, fmt.Errorf("metadata packet at %d: checksummed (scheme %d), which CTF readers do not support", off, sum)
		case major != 1 || minor != 8:
			return nil, uuid, fmt.Errorf("metadata packet at %d: CTF %d.%d, want 1.8", off, major, minor)
		case content%8 != 0 || size%8 != 0:
			return nil, uuid, fmt.Errorf("metadata packet at %d: sizes of %d and %d bits are not whole bytes", off, content, size)
		case content/8 < metadataHeaderSize || content > size:
			return nil, uuid, fmt.Errorf("metadata packet at %d: content of %d bits in a %d-bit packet with a %d-byte header", off, content, size, metadataHeaderSize)
		case uint64(size/8) > uint64(len(p)):
			return nil, uuid, fmt.Errorf("metadata packet at %d: %d bytes, truncated to %d", off, size/8, len(p))
		}
		if out.Len()+int(content/8)-metadataHeaderSize > MaxMetadataSize {
			return nil, uuid, fmt.Errorf("metadata: text over the limit of %d bytes", MaxMetadataSize)
		}
		out.Write(p[metadataHeaderSize : content/8])
		off += int(size / 8)
	}
	return out.Bytes(), uuid, nil
}
