package relayd

import (
	"bytes"
	"testing"

	"github.com/kconsume/kconsume/relayfmt"
)

// TestWireSizes checks each fixed size against the fields of its packed C
// structure in lttng-tools 2.13 (src/common/sessiond-comm/relayd.h), and
// that the encoders produce exactly that many bytes before their names.
func TestWireSizes(t *testing.T) {
	sum := func(f ...int) int {
		n := 0
		for _, v := range f {
			n += v
		}
		return n
	}
	const u8, u32, u64, uuid, optU64 = 1, 4, 8, 16, 1 + 8
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"lttcomm_relayd_hdr", hdrSize, sum(u64, u64, u32, u32)},
		{"lttcomm_relayd_data_hdr", dataHdrSize, sum(u64, u64, u64, u32, u32)},
		{"lttcomm_relayd_version", versionSize, sum(u32, u32)},
		{"lttcomm_relayd_create_session_2_11", createSessionSize, sum(u32, u32, u32, u32, u8, u8, uuid, u64, u64, optU64)},
		{"lttcomm_relayd_create_session_reply_2_11", createSessionReplySize, sum(u64, u32, u32)},
		{"lttcomm_relayd_add_stream_2_11", addStreamSize, sum(u32, u32, u64, u64, u64)},
		{"lttcomm_relayd_status_stream", statusStreamSize, sum(u64, u32)},
		{"lttcomm_relayd_generic_reply", genericReplySize, u32},
		{"lttcomm_relayd_metadata_payload", metadataPayloadSize, sum(u64, u32)},
		{"lttcomm_relayd_close_stream", closeStreamSize, sum(u64, u64)},
		{"lttcomm_relayd_data_pending", dataPendingSize, sum(u64, u64)},
		{"lttcomm_relayd_index", indexSize, 10 * u64},
		{"lttcomm_relayd_reset_metadata", resetMetadataSize, sum(u64, u64)},
		{"lttcomm_relayd_create_trace_chunk", createChunkSize, sum(u64, u64, u32)},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, c.got, c.want)
		}
	}
	cs := (&createSession{Name: "s", Host: "h", BasePath: ""}).marshal()
	if len(cs) != createSessionSize+2+2+1 || !bytes.Equal(cs[createSessionSize:], []byte("s\x00h\x00\x00")) {
		t.Errorf("create_session: % x", cs)
	}
	as := (&addStream{Channel: "trace0", Path: "kernel", Chunk: 7}).marshal()
	if len(as) != addStreamSize+7+7 || be.Uint64(as[24:]) != 7 || be.Uint32(as[0:]) != 7 {
		t.Errorf("add_stream: % x", as)
	}
	if n := len(two64(1, 2)); n != closeStreamSize {
		t.Errorf("two64: %d bytes", n)
	}
	if n := len(createChunk(1, 2)); n != createChunkSize {
		t.Errorf("createChunk: %d bytes", n)
	}
}

// TestWireBigEndian checks the byte order of the headers.
func TestWireBigEndian(t *testing.T) {
	var h [hdrSize]byte
	putHeader(h[:], cmdSendIndex, 80)
	want := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 80, 0, 0, 0, 13, 0, 0, 0, 0}
	if !bytes.Equal(h[:], want) {
		t.Errorf("header % x, want % x", h, want)
	}
	var d [dataHdrSize]byte
	(&dataHeader{Stream: 3, Seq: 4, Size: 5, Padding: 6}).put(d[:])
	if d[15] != 3 || d[23] != 4 || d[27] != 5 || d[31] != 6 {
		t.Errorf("data header % x", d)
	}
	var x [indexSize]byte
	(&Index{Stream: 1, PacketSeqNum: 10}).put(x[:])
	if x[7] != 1 || x[79] != 10 {
		t.Errorf("index % x", x)
	}
}

// TestIndexOf reads a packet's index and splits off zero padding, and
// refuses packets whose header disagrees with their length.
func TestIndexOf(t *testing.T) {
	pkt := make([]byte, 4096)
	h := relayfmt.PacketHeader{StreamInstanceID: 3, TimestampBegin: 100, TimestampEnd: 200,
		ContentSize: 94 * 8, PacketSize: 4096 * 8, SeqNum: 9, EventsDiscarded: 2, CPUID: 3}
	relayfmt.PutPacketHeader(pkt, &h)
	for i := relayfmt.PacketHeaderSize; i < 94; i++ {
		pkt[i] = 0xAA
	}
	x, data, pad, err := indexOf(pkt)
	if err != nil {
		t.Fatal(err)
	}
	want := Index{PacketSize: 4096 * 8, ContentSize: 94 * 8, TimestampBegin: 100, TimestampEnd: 200,
		EventsDiscarded: 2, StreamInstanceID: 3, PacketSeqNum: 9}
	if x != want || len(data) != 94 || pad != 4096-94 {
		t.Fatalf("index %+v, %d bytes + %d padding", x, len(data), pad)
	}
	pkt[4000] = 1
	if _, data, pad, _ = indexOf(pkt); len(data) != 4096 || pad != 0 {
		t.Fatalf("padding not zero: %d bytes + %d padding, want the whole packet", len(data), pad)
	}
	for name, b := range map[string][]byte{
		"short":     pkt[:50],
		"cut":       pkt[:2048],
		"bad magic": append([]byte{0}, pkt[1:]...),
		"content > size": func() []byte {
			q := append([]byte(nil), pkt...)
			h := h
			h.ContentSize = 4097 * 8
			relayfmt.PutPacketHeader(q, &h)
			return q
		}(),
	} {
		if _, _, _, err := indexOf(b); err == nil {
			t.Errorf("%s packet: no error", name)
		}
	}
}
