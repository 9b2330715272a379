package relayd

import (
	"encoding/binary"
	"fmt"

	"github.com/kconsume/kconsume/relayfmt"
)

// The wire format of lttng-relayd's control and data connections, as
// lttng-tools 2.11 to 2.13 speak it (src/common/sessiond-comm/relayd.h and
// sessiond-comm.h). Every integer is big-endian; the C structures are
// packed, so each size below is the plain sum of its fields.

// Protocol version this client speaks. relayd answers with its own; both
// sides then use the lower minor.
const (
	protoMajor = 2
	protoMinor = 13
	// minMinor is the first minor with trace chunks and the variable-length
	// create_session and add_stream commands this client sends.
	minMinor = 11
)

// Control commands (enum lttcomm_relayd_command).
const (
	cmdAddStream        = 1
	cmdCreateSession    = 2
	cmdVersion          = 5
	cmdSendMetadata     = 6
	cmdCloseStream      = 7
	cmdDataPending      = 8
	cmdSendIndex        = 13
	cmdStreamsSent      = 16
	cmdResetMetadata    = 17
	cmdRotateStreams    = 18
	cmdCreateTraceChunk = 19
	cmdCloseTraceChunk  = 20
)

// lttngOK is LTTNG_OK (include/lttng/lttng-error.h), the success code of
// every reply.
const lttngOK = 10

// Sizes of the fixed parts of the messages.
const (
	hdrSize                = 24 // lttcomm_relayd_hdr
	dataHdrSize            = 32 // lttcomm_relayd_data_hdr
	versionSize            = 8  // lttcomm_relayd_version
	createSessionSize      = 59 // lttcomm_relayd_create_session_2_11, names follow
	createSessionReplySize = 16 // lttcomm_relayd_create_session_reply_2_11, path follows
	addStreamSize          = 32 // lttcomm_relayd_add_stream_2_11, names follow
	statusStreamSize       = 12 // lttcomm_relayd_status_stream
	genericReplySize       = 4  // lttcomm_relayd_generic_reply
	metadataPayloadSize    = 12 // lttcomm_relayd_metadata_payload, text follows
	closeStreamSize        = 16 // lttcomm_relayd_close_stream
	dataPendingSize        = 16 // lttcomm_relayd_data_pending
	indexSize              = 80 // lttcomm_relayd_index with the 2.8+ fields (index 1.1)
	resetMetadataSize      = 16 // lttcomm_relayd_reset_metadata
	createChunkSize        = 20 // lttcomm_relayd_create_trace_chunk, no override name
	closeChunkSize         = 21 // lttcomm_relayd_close_trace_chunk
	closeChunkReplySize    = 8  // lttcomm_relayd_close_trace_chunk_reply, path follows
	// rotateStreamsSize is lttcomm_relayd_rotate_streams as an x86-64
	// peer lays it out, 7 bytes of padding after new_chunk_id's is_set,
	// which every relayd since 2.11 on x86-64 reads (2.13.2+ reads any
	// layout); a rotateEntrySize entry per stream follows.
	rotateStreamsSize = 20
	rotateEntrySize   = 16 // lttcomm_relayd_stream_rotation_position
)

// closeMoveToCompleted is LTTNG_TRACE_CHUNK_COMMAND_TYPE_MOVE_TO_COMPLETED
// (src/common/trace-chunk.h): relayd moves a closed chunk to
// archives/BEGIN-END-ID under the session directory.
const closeMoveToCompleted = 0

// Limits relayd enforces on what it receives (LTTNG_NAME_MAX,
// LTTNG_HOST_NAME_MAX, LTTNG_PATH_MAX), the terminating NUL included.
const (
	maxNameLen = 255
	maxHostLen = 64
	maxPathLen = 4096
)

var be = binary.BigEndian

// putHeader encodes the command header: circuit id (unused, 0), the size
// of the payload that follows, the command, and its version (0).
func putHeader(b []byte, cmd uint32, size uint64) {
	_ = b[hdrSize-1]
	be.PutUint64(b[0:], 0)
	be.PutUint64(b[8:], size)
	be.PutUint32(b[16:], cmd)
	be.PutUint32(b[20:], 0)
}

// dataHeader precedes each packet on the data connection.
type dataHeader struct {
	Stream  uint64 // handle relayd gave the stream
	Seq     uint64 // network sequence number, per stream, from 0
	Size    uint32 // bytes that follow
	Padding uint32 // zero bytes relayd appends after them
}

func (h *dataHeader) put(b []byte) {
	_ = b[dataHdrSize-1]
	be.PutUint64(b[0:], 0)
	be.PutUint64(b[8:], h.Stream)
	be.PutUint64(b[16:], h.Seq)
	be.PutUint32(b[24:], h.Size)
	be.PutUint32(b[28:], h.Padding)
}

// createSession is the 2.11 session creation: three NUL-terminated names
// follow the fixed part.
type createSession struct {
	Name, Host, BasePath string
	LiveTimer            uint32 // microseconds; 0: not a live session
	UUID                 [16]byte
	ID                   uint64 // the session's id on the client side
	Created              uint64 // seconds since the epoch
}

func (m *createSession) marshal() []byte {
	b := make([]byte, createSessionSize, createSessionSize+len(m.Name)+len(m.Host)+len(m.BasePath)+3)
	be.PutUint32(b[0:], uint32(len(m.Name)+1))
	be.PutUint32(b[4:], uint32(len(m.Host)+1))
	be.PutUint32(b[8:], uint32(len(m.BasePath)+1))
	be.PutUint32(b[12:], m.LiveTimer)
	b[16] = 0 // snapshot
	b[17] = 0 // the name does not already hold the creation time
	copy(b[18:34], m.UUID[:])
	be.PutUint64(b[34:], m.ID)
	be.PutUint64(b[42:], m.Created)
	// b[50:59]: current_chunk_id, an optional (is_set byte, packed u64),
	// left unset: the chunk is created by its own command.
	b = append(b, m.Name...)
	b = append(b, 0)
	b = append(b, m.Host...)
	b = append(b, 0)
	b = append(b, m.BasePath...)
	return append(b, 0)
}

// addStream is the 2.11 stream creation: the channel name (relayd's file
// name for the stream) and the path under the trace chunk follow.
type addStream struct {
	Channel, Path string
	Chunk         uint64
}

func (m *addStream) marshal() []byte {
	b := make([]byte, addStreamSize, addStreamSize+len(m.Channel)+len(m.Path)+2)
	be.PutUint32(b[0:], uint32(len(m.Channel)+1))
	be.PutUint32(b[4:], uint32(len(m.Path)+1))
	be.PutUint64(b[8:], 0)  // tracefile_size: one file per stream
	be.PutUint64(b[16:], 0) // tracefile_count
	be.PutUint64(b[24:], m.Chunk)
	b = append(b, m.Channel...)
	b = append(b, 0)
	b = append(b, m.Path...)
	return append(b, 0)
}

// Index describes one packet to relayd, which writes it to the stream's
// index file and serves it to live viewers. A beacon (PacketSize 0) says
// that a stream has nothing up to TimestampEnd.
type Index struct {
	Stream           uint64 // relayd's handle
	Seq              uint64 // the packet's network sequence number
	PacketSize       uint64 // bits
	ContentSize      uint64 // bits
	TimestampBegin   uint64
	TimestampEnd     uint64
	EventsDiscarded  uint64
	StreamID         uint64 // the CTF stream class id
	StreamInstanceID uint64
	PacketSeqNum     uint64
}

func (x *Index) put(b []byte) {
	_ = b[indexSize-1]
	for i, v := range [...]uint64{x.Stream, x.Seq, x.PacketSize, x.ContentSize, x.TimestampBegin,
		x.TimestampEnd, x.EventsDiscarded, x.StreamID, x.StreamInstanceID, x.PacketSeqNum} {
		be.PutUint64(b[8*i:], v)
	}
}

// two64 encodes two uint64, the shape of close_stream, data_pending and
// reset_metadata.
func two64(a, b uint64) []byte {
	p := make([]byte, 16)
	be.PutUint64(p, a)
	be.PutUint64(p[8:], b)
	return p
}

// createChunk encodes a trace chunk creation without an override name:
// relayd then writes the first chunk straight into the session directory.
func createChunk(id, created uint64) []byte {
	b := make([]byte, createChunkSize)
	be.PutUint64(b[0:], id)
	be.PutUint64(b[8:], created)
	be.PutUint32(b[16:], 0)
	return b
}

// StreamPosition is where one stream switches to a new trace chunk: its
// first packet there is the one whose CTF packet_seq_num is At.
type StreamPosition struct {
	Stream, At uint64
}

// rotateStreams encodes ROTATE_STREAMS into chunk (none when !into).
func rotateStreams(chunk uint64, into bool, pos []StreamPosition) []byte {
	b := make([]byte, rotateStreamsSize+rotateEntrySize*len(pos))
	be.PutUint32(b[0:], uint32(len(pos)))
	if into {
		b[4] = 1
		be.PutUint64(b[12:], chunk)
	}
	for i, p := range pos {
		o := rotateStreamsSize + i*rotateEntrySize
		be.PutUint64(b[o:], p.Stream)
		be.PutUint64(b[o+8:], p.At)
	}
	return b
}

// closeChunk encodes CLOSE_TRACE_CHUNK with close command cmd.
func closeChunk(id, closed uint64, cmd uint32) []byte {
	b := make([]byte, closeChunkSize)
	be.PutUint64(b[0:], id)
	be.PutUint64(b[8:], closed)
	b[16] = 1
	be.PutUint32(b[17:], cmd)
	return b
}

// replyError says what a reply code other than LTTNG_OK means.
func replyError(what string, code uint32) error {
	return fmt.Errorf("%s: relayd replied error code %d (see lttng-relayd's log)", what, code)
}

// indexOf reads a packet's header into its index and splits the packet
// into what goes on the wire and the zero padding relayd appends itself.
// It fails if the header is unreadable or disagrees with the packet's
// length.
func indexOf(packet []byte) (x Index, data []byte, padding uint32, err error) {
	h, err := relayfmt.ParsePacketHeader(packet)
	if err != nil {
		return x, nil, 0, err
	}
	if h.PacketSize != 8*uint64(len(packet)) || h.ContentSize > h.PacketSize || h.ContentSize < 8*relayfmt.PacketHeaderSize || len(packet) > 1<<31 {
		return x, nil, 0, fmt.Errorf("packet of %d bytes: header says packet_size %d bits, content_size %d bits", len(packet), h.PacketSize, h.ContentSize)
	}
	x = Index{
		PacketSize:       h.PacketSize,
		ContentSize:      h.ContentSize,
		TimestampBegin:   h.TimestampBegin,
		TimestampEnd:     h.TimestampEnd,
		EventsDiscarded:  h.EventsDiscarded,
		StreamID:         uint64(h.StreamID),
		StreamInstanceID: h.StreamInstanceID,
		PacketSeqNum:     h.SeqNum,
	}
	content := (h.ContentSize + 7) / 8
	data = packet
	// relayd writes the padding as zeros: send only the content when the
	// rest is zero, so the file relayd writes is byte for byte the same.
	if rest := packet[content:]; allZero(rest) {
		data, padding = packet[:content], uint32(len(rest))
	}
	return x, data, padding, nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if be.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
