package relayd

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds connecting and every exchange with relayd.
const DefaultTimeout = 10 * time.Second

// Session says which session to create on relayd.
type Session struct {
	// Host and Name place the trace under relayd's output directory:
	// HOST/NAME-YYYYMMDD-HHMMSS/ (relayd's --group-output-by-host layout).
	// Neither may hold a '/'.
	Host, Name string
	// BasePath, when set, replaces NAME-YYYYMMDD-HHMMSS in that path.
	BasePath string
	// LiveTimer, when not 0, makes the session live: relayd serves it to
	// lttng-live viewers, who expect an index or a beacon per stream about
	// this often.
	LiveTimer time.Duration
	// Timeout bounds connecting and each exchange (DefaultTimeout if 0).
	Timeout time.Duration
}

// Client is one session on a relay daemon: a control connection for
// commands and a data connection for packets. It is safe for concurrent
// use; commands are serialized on the control connection and packets on
// the data connection.
type Client struct {
	url     URL
	timeout time.Duration
	minor   uint32
	chunk   uint64

	// SessionID is relayd's id for the session; OutputPath is the
	// session's directory relative to relayd's output directory.
	SessionID  uint64
	OutputPath string

	cmu  sync.Mutex
	ctrl net.Conn
	cbuf []byte
	// owed counts the index commands sent whose replies are not read
	// yet (SendIndex); they are read, in order, before any other reply.
	owed int

	dmu  sync.Mutex
	data net.Conn
	dhdr [dataHdrSize]byte

	closeOnce sync.Once
	closeErr  error
}

// Dial connects to relayd at u, checks the protocol version, creates the
// session and its trace chunk, and opens the data connection. It fails,
// saying which step and why, when relayd is unreachable, speaks a protocol
// older than 2.11, or refuses the session (relayd's log says why).
func Dial(ctx context.Context, u URL, s Session) (*Client, error) {
	if s.Name == "" || strings.ContainsRune(s.Name, '/') || len(s.Name)+1 > maxNameLen {
		return nil, fmt.Errorf("relayd session name %q: want 1 to %d bytes without '/'", s.Name, maxNameLen-1)
	}
	if s.Host == "" || strings.ContainsRune(s.Host, '/') || len(s.Host)+1 > maxHostLen {
		return nil, fmt.Errorf("relayd host name %q: want 1 to %d bytes without '/'", s.Host, maxHostLen-1)
	}
	live := s.LiveTimer.Microseconds()
	if s.LiveTimer < 0 || live > 1<<32-1 {
		return nil, fmt.Errorf("relayd live timer %v: out of range", s.LiveTimer)
	}
	c := &Client{url: u, timeout: s.Timeout}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	d := net.Dialer{Timeout: c.timeout}
	var err error
	if c.ctrl, err = d.DialContext(ctx, "tcp", u.ControlAddr()); err != nil {
		return nil, fmt.Errorf("relayd %s: connect to control port: %w", u, err)
	}
	fail := func(err error) (*Client, error) {
		c.Close()
		return nil, fmt.Errorf("relayd %s: %w", u, err)
	}
	if err := c.version(); err != nil {
		return fail(err)
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	now := uint64(time.Now().Unix())
	if err := c.createSession(&createSession{Name: s.Name, Host: s.Host, BasePath: s.BasePath, LiveTimer: uint32(live), UUID: id, ID: 1, Created: now}); err != nil {
		return fail(err)
	}
	// One chunk for the whole session, id 0: the session is never
	// rotated.
	if err := c.command(cmdCreateTraceChunk, createChunk(c.chunk, now), nil, 0); err != nil {
		return fail(fmt.Errorf("create trace chunk: %w", err))
	}
	if c.data, err = d.DialContext(ctx, "tcp", u.DataAddr()); err != nil {
		return fail(fmt.Errorf("connect to data port: %w", err))
	}
	return c, nil
}

// URL returns the relay daemon's address.
func (c *Client) URL() URL { return c.url }

// exchange sends one command with payload and reads n bytes of reply into
// c.cbuf[:n] (n may be 0 for commands relayd does not answer). The caller
// holds c.cmu.
func (c *Client) exchange(cmd uint32, payload []byte, n int) ([]byte, error) {
	if err := c.ctrl.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		return nil, err
	}
	if err := c.settle(0); err != nil {
		return nil, err
	}
	if err := c.write(cmd, payload); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	return c.reply(n)
}

// write sends cmd's header and its payload, the parts one after the
// other, on the control connection. The caller holds c.cmu and has set
// the deadline.
func (c *Client) write(cmd uint32, parts ...[]byte) error {
	var hdr [hdrSize]byte
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	putHeader(hdr[:], cmd, uint64(size))
	bufs := append(net.Buffers{hdr[:]}, parts...)
	_, err := bufs.WriteTo(c.ctrl)
	return err
}

// settle reads the replies owed to index commands until at most keep are
// left. It fails on a network error or the first index relayd refused.
// The caller holds c.cmu.
func (c *Client) settle(keep int) error {
	if c.owed > keep {
		c.quickAck()
	}
	for c.owed > keep {
		r, err := c.reply(genericReplySize)
		if err != nil {
			return fmt.Errorf("send index: %w", err)
		}
		c.owed--
		if code := be.Uint32(r); code != lttngOK {
			return fmt.Errorf("send index: %w", replyError("command", code))
		}
	}
	return nil
}

// reply reads n bytes of reply into c.cbuf[:n]. The caller holds c.cmu.
func (c *Client) reply(n int) ([]byte, error) {
	if cap(c.cbuf) < n {
		c.cbuf = make([]byte, n)
	}
	r := c.cbuf[:n]
	if _, err := io.ReadFull(c.ctrl, r); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("relayd closed the connection: %w", err)
		}
		return nil, fmt.Errorf("receive reply: %w", err)
	}
	return r, nil
}

// command sends cmd and, for replyLen > 0, checks the reply's leading
// LTTNG_OK status. It returns the reply (valid until the next command).
func (c *Client) command(cmd uint32, payload []byte, reply []byte, replyLen int) error {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	return c.commandLocked(cmd, payload, reply, replyLen)
}

func (c *Client) commandLocked(cmd uint32, payload []byte, reply []byte, replyLen int) error {
	n := replyLen
	if n == 0 {
		n = genericReplySize
	}
	r, err := c.exchange(cmd, payload, n)
	if err != nil {
		return err
	}
	copy(reply, r)
	if replyLen == 0 {
		if code := be.Uint32(r); code != lttngOK {
			return replyError("command", code)
		}
	}
	return nil
}

// version agrees on the protocol: relayd and client keep the lower minor.
func (c *Client) version() error {
	var p [versionSize]byte
	be.PutUint32(p[0:], protoMajor)
	be.PutUint32(p[4:], protoMinor)
	var r [versionSize]byte
	if err := c.command(cmdVersion, p[:], r[:], versionSize); err != nil {
		return fmt.Errorf("version check: %w", err)
	}
	major, minor := be.Uint32(r[0:]), be.Uint32(r[4:])
	if major != protoMajor || minor < minMinor {
		return fmt.Errorf("version check: relayd speaks protocol %d.%d; kconsume needs 2.%d or newer (lttng-tools 2.11+)", major, minor, minMinor)
	}
	c.minor = min(minor, protoMinor)
	return nil
}

func (c *Client) createSession(m *createSession) error {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	r, err := c.exchange(cmdCreateSession, m.marshal(), createSessionReplySize)
	if err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	c.SessionID = be.Uint64(r[0:])
	code := be.Uint32(r[8:])
	plen := be.Uint32(r[12:])
	if plen >= maxPathLen {
		return fmt.Errorf("create session: reply announces a %d-byte path", plen)
	}
	path := make([]byte, plen)
	if _, err := io.ReadFull(c.ctrl, path); err != nil {
		return fmt.Errorf("create session: receive output path: %w", err)
	}
	if code != lttngOK {
		return replyError(fmt.Sprintf("create session %q of host %q", m.Name, m.Host), code)
	}
	c.OutputPath = strings.TrimRight(string(path), "\x00")
	return nil
}

// AddStream creates a stream in the session's trace chunk: relayd writes
// it to PATH/NAME under the session directory, and a stream named
// "metadata" is the trace's metadata. It returns relayd's handle for the
// stream.
func (c *Client) AddStream(name, path string) (uint64, error) {
	m := addStream{Channel: name, Path: path, Chunk: c.chunk}
	var r [statusStreamSize]byte
	if err := c.command(cmdAddStream, m.marshal(), r[:], statusStreamSize); err != nil {
		return 0, fmt.Errorf("add stream %s: %w", name, err)
	}
	if code := be.Uint32(r[8:]); code != lttngOK {
		return 0, replyError("add stream "+name, code)
	}
	return be.Uint64(r[0:]), nil
}

// StreamsSent tells relayd that the streams added so far are complete,
// which publishes them to live viewers.
func (c *Client) StreamsSent() error {
	if err := c.command(cmdStreamsSent, nil, nil, 0); err != nil {
		return fmt.Errorf("streams sent: %w", err)
	}
	return nil
}

// SendMetadata appends text, plain or in metadata packets, to the
// metadata stream. relayd does not answer; a failure shows in the next
// command.
func (c *Client) SendMetadata(stream uint64, text []byte) error {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	var p [metadataPayloadSize]byte
	be.PutUint64(p[0:], stream)
	be.PutUint32(p[8:], 0) // no padding
	if err := c.ctrl.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		return fmt.Errorf("send metadata: %w", err)
	}
	if err := c.write(cmdSendMetadata, p[:], text); err != nil {
		return fmt.Errorf("send metadata: %w", err)
	}
	return nil
}

// ResetMetadata empties the metadata stream before new text is sent
// (relayd refuses it for live sessions); version counts the resets.
func (c *Client) ResetMetadata(stream, version uint64) error {
	if err := c.command(cmdResetMetadata, two64(stream, version), nil, 0); err != nil {
		return fmt.Errorf("reset metadata: %w", err)
	}
	return nil
}

// SendPacket sends one packet of a stream on the data connection: data,
// then padding zero bytes that relayd adds itself. seq numbers a stream's
// packets from 0.
func (c *Client) SendPacket(stream, seq uint64, data []byte, padding uint32) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	h := dataHeader{Stream: stream, Seq: seq, Size: uint32(len(data)), Padding: padding}
	h.put(c.dhdr[:])
	if err := c.data.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return fmt.Errorf("send packet: %w", err)
	}
	bufs := net.Buffers{c.dhdr[:], data}
	if _, err := bufs.WriteTo(c.data); err != nil {
		return fmt.Errorf("send packet: %w", err)
	}
	return nil
}

// indexWindow is how many index commands may await relayd's reply.
// relayd 2.13's reply to an index came once it had taken the packet's
// data: 330 to 450 µs after a 1 MiB packet (BENCHMARKS.md, issue 56),
// as long as the send, during which the next packet would stay off the
// wire.
const indexWindow = 8

// SendIndex sends a packet's index (or a live beacon). It does not wait
// for relayd's reply unless indexWindow indexes already await theirs;
// the replies are read in order before any later command's, and an index
// relayd refused fails that later call (SendIndex, or any command).
func (c *Client) SendIndex(x *Index) error {
	var p [indexSize]byte
	x.put(p[:])
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if err := c.ctrl.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		return fmt.Errorf("send index: %w", err)
	}
	if err := c.write(cmdSendIndex, p[:]); err != nil {
		return fmt.Errorf("send index: %w", err)
	}
	c.owed++
	return c.settle(indexWindow)
}

// CloseStream says that lastSeq was the stream's last packet (^0 when it
// had none); relayd closes its files once it has them all.
func (c *Client) CloseStream(stream, lastSeq uint64) error {
	if err := c.command(cmdCloseStream, two64(stream, lastSeq), nil, 0); err != nil {
		return fmt.Errorf("close stream: %w", err)
	}
	return nil
}

// Chunk returns the id of the session's current trace chunk.
func (c *Client) Chunk() uint64 { return c.chunk }

// CreateTraceChunk creates the session's next trace chunk, the current
// one's id plus one, created at t; ADD_STREAM and ROTATE_STREAMS name it
// from then on. It returns the new id. relayd refuses it while the
// previous chunk is not closed.
func (c *Client) CreateTraceChunk(t time.Time) (uint64, error) {
	id := c.chunk + 1
	if err := c.command(cmdCreateTraceChunk, createChunk(id, uint64(t.Unix())), nil, 0); err != nil {
		return 0, fmt.Errorf("create trace chunk %d: %w", id, err)
	}
	c.chunk = id
	return id, nil
}

// RotateStreams switches streams to trace chunk chunk, each at its
// position (the metadata stream switches at once, whatever its position:
// its text must then be sent again from the start); with into unset they
// switch to no chunk, and may take no more packets. relayd replies before
// the switch, which happens once it has the packets before the
// positions.
func (c *Client) RotateStreams(chunk uint64, into bool, pos []StreamPosition) error {
	if err := c.command(cmdRotateStreams, rotateStreams(chunk, into, pos), nil, 0); err != nil {
		return fmt.Errorf("rotate streams: %w", err)
	}
	return nil
}

// CloseTraceChunk closes trace chunk id at t: relayd moves it to the
// session's archives/ directory once its last stream has left it. It
// returns the path relayd replied, relative to its output directory
// (the session's directory for the first chunk closed).
func (c *Client) CloseTraceChunk(id uint64, t time.Time) (string, error) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	r, err := c.exchange(cmdCloseTraceChunk, closeChunk(id, uint64(t.Unix()), closeMoveToCompleted), closeChunkReplySize)
	if err != nil {
		return "", fmt.Errorf("close trace chunk %d: %w", id, err)
	}
	code, plen := be.Uint32(r[0:]), be.Uint32(r[4:])
	if plen >= maxPathLen {
		return "", fmt.Errorf("close trace chunk %d: reply announces a %d-byte path", id, plen)
	}
	path := make([]byte, plen)
	if _, err := io.ReadFull(c.ctrl, path); err != nil {
		return "", fmt.Errorf("close trace chunk %d: receive path: %w", id, err)
	}
	if code != lttngOK {
		return "", replyError(fmt.Sprintf("close trace chunk %d", id), code)
	}
	return strings.TrimRight(string(path), "\x00"), nil
}

// DataPending reports whether relayd still misses data or indexes of a
// stream up to lastSeq.
func (c *Client) DataPending(stream, lastSeq uint64) (bool, error) {
	var r [genericReplySize]byte
	if err := c.command(cmdDataPending, two64(stream, lastSeq), r[:], genericReplySize); err != nil {
		return false, fmt.Errorf("data pending: %w", err)
	}
	return be.Uint32(r[:]) != 0, nil
}

// Close closes both connections at once, even while another goroutine
// waits on one (it then fails); relayd closes the session's streams once
// their data has arrived. Later calls return the first call's result.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		if c.ctrl != nil {
			errs = append(errs, c.ctrl.Close())
		}
		if c.data != nil {
			errs = append(errs, c.data.Close())
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// quickAck acknowledges at once what relayd sent on the control
// connection.
func (c *Client) quickAck() {
	tc, ok := c.ctrl.(*net.TCPConn)
	if !ok {
		return
	}
	if rc, err := tc.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1)
		})
	}
}
