package relayfmt

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"maps"
	"slices"
)

// FormatVersion is written to the metadata's env block as kconsume_format;
// a reader refuses versions it does not know.
const FormatVersion = 1

// Clock describes the clock the timestamps count.
type Clock struct {
	// Name is a TSDL identifier: "monotonic", "boot", "tai".
	Name        string
	Description string
	// Freq is the clock's frequency in Hz; 0 means 1e9 (nanoseconds).
	Freq uint64
	// Offset is the clock's zero as nanoseconds since the Unix epoch, so
	// tools can print wall time. Split into offset_s and offset in TSDL.
	Offset int64
}

// Metadata is what the TSDL metadata file of a trace says: the trace UUID,
// the clock, the channel geometry and the event classes.
type Metadata struct {
	UUID  [16]byte
	Clock Clock
	// Global is true for a channel with one buffer for all CPUs: the stream
	// is "trace" and every event carries the CPU in its context.
	Global bool
	// SubbufSize and NSubbufs are the channel's geometry (env sub_size and
	// nr_sub); every packet's packet_size is SubbufSize.
	SubbufSize int
	NSubbufs   int
	// Env holds extra env entries (hostname, kernel release...). Keys must
	// be identifiers; values are written as strings.
	Env map[string]string
	// EnvInt holds extra integer env entries (LTTng's tracer_major...),
	// written unquoted; a key also in Env is left out.
	EnvInt map[string]int64
	// Tracer is the env's tracer_name; empty means "kconsume". A trace
	// written in another tracer's dialect (profile lttng) names it here.
	Tracer string
	// StreamContext holds the fields every event of the stream carries
	// after its header (and, in global mode, its CPU), the stream's
	// event context as LTTng writes its contexts: fixed-size fields,
	// which each class also holds as its first fields (Field.Context).
	StreamContext []Field
	// Classes is indexed by event id.
	Classes []*EventClass
}

// NewUUID returns a random (version 4) UUID.
func NewUUID() [16]byte {
	var u [16]byte
	_, _ = rand.Read(u[:]) // never fails on Linux (crypto/rand doc)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

func formatUUID(u [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Class returns the class with the given id, or nil.
func (m *Metadata) Class(id uint32) *EventClass {
	if uint64(id) < uint64(len(m.Classes)) {
		return m.Classes[id]
	}
	return nil
}

// ClassByName returns the class with the given name, or nil.
func (m *Metadata) ClassByName(name string) *EventClass {
	for _, c := range m.Classes {
		if c != nil && c.Name == name {
			return c
		}
	}
	return nil
}

// tracer returns the env's tracer_name.
func (m *Metadata) tracer() string {
	if m.Tracer == "" {
		return "kconsume"
	}
	return m.Tracer
}

func (c Clock) freq() uint64 {
	if c.Freq == 0 {
		return 1e9
	}
	return c.Freq
}

// TSDL returns the CTF 1.8 metadata text. The packet header, packet context
// and event header structures must match format.go.
func (m *Metadata) TSDL() []byte {
	var b bytes.Buffer
	m.writeTraceEnv(&b)
	m.writeClockStream(&b)
	m.writeEvents(&b)
	return b.Bytes()
}

// writeTraceEnv writes the integer aliases, the trace block (the packet
// header of format.go) and the env block.
func (m *Metadata) writeTraceEnv(b *bytes.Buffer) {
	b.WriteString("/* CTF 1.8 */\n\n")
	for _, t := range []IntType{U8, U16, U32, U64, S8, S16, S32, S64} {
		fmt.Fprintf(b, "typealias integer { size = %d; align = 8; signed = %t; } := %s;\n", t.Size()*8, t.Signed(), ctype(t))
	}
	b.WriteString("typealias integer { size = 5; align = 1; signed = false; } := uint5_t;\n\n")
	fmt.Fprintf(b, `trace {
	major = 1;
	minor = 8;
	uuid = "%s";
	byte_order = le;
	packet.header := struct {
		uint32_t magic;
		uint8_t uuid[16];
		uint32_t stream_id;
		uint64_t stream_instance_id;
	} align(8);
};

env {
	domain = "kernel";
	tracer_name = %s;
	kconsume_format = %d;
	sub_size = %d;
	nr_sub = %d;
	global = %d;
`, formatUUID(m.UUID), tsdlQuote(m.tracer()), FormatVersion, m.SubbufSize, m.NSubbufs, b2i(m.Global))
	for _, k := range sortedKeys(m.Env) {
		fmt.Fprintf(b, "\t%s = %s;\n", k, tsdlQuote(m.Env[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(m.EnvInt)) {
		if _, dup := m.Env[k]; !dup {
			fmt.Fprintf(b, "\t%s = %d;\n", k, m.EnvInt[k])
		}
	}
	b.WriteString("};\n")
}

// writeClockStream writes the clock block, the clock-mapped integers and
// the stream block with the packet context and event header of
// format.go.
func (m *Metadata) writeClockStream(b *bytes.Buffer) {
	clk := m.Clock.Name
	freq := m.Clock.freq()
	offS, offNs := m.Clock.Offset/1e9, m.Clock.Offset%1e9
	if offNs < 0 {
		offS, offNs = offS-1, offNs+1e9
	}
	fmt.Fprintf(b, `
clock {
	name = %s;
	description = %s;
	freq = %d;
	precision = 1;
	offset_s = %d;
	offset = %d;
	absolute = FALSE;
};

typealias integer { size = 27; align = 1; signed = false; map = clock.%s.value; } := uint27_clock_t;
typealias integer { size = 64; align = 8; signed = false; map = clock.%s.value; } := uint64_clock_t;

struct packet_context {
	uint64_clock_t timestamp_begin;
	uint64_clock_t timestamp_end;
	uint64_t content_size;
	uint64_t packet_size;
	uint64_t packet_seq_num;
	uint64_t events_discarded;
	uint32_t cpu_id;
} align(8);

struct event_header_compact {
	enum : uint5_t { compact = 0 ... 30, extended = 31 } id;
	variant <id> {
		struct {
			uint27_clock_t timestamp;
		} compact;
		struct {
			uint32_t id;
			uint64_clock_t timestamp;
		} extended;
	} v;
} align(8);

stream {
	id = 0;
	event.header := struct event_header_compact;
	packet.context := struct packet_context;
`, clk, tsdlQuote(m.Clock.Description), freq, offS, mulDiv(uint64(offNs), freq, 1e9, false), clk, clk)
	if m.Global || len(m.StreamContext) > 0 {
		b.WriteString("\tevent.context := struct {\n")
		if m.Global {
			b.WriteString("\t\tuint32_t _cpu;\n")
		}
		for _, f := range m.StreamContext {
			b.WriteString("\t\t")
			writeField(b, &f)
			b.WriteString(";\n")
		}
		b.WriteString("\t} align(8);\n")
	}
	b.WriteString("};\n")
}

// writeEvents writes one event block per class.
func (m *Metadata) writeEvents(b *bytes.Buffer) {
	for _, c := range m.Classes {
		if c == nil {
			continue
		}
		fmt.Fprintf(b, "\nevent {\n\tname = %s;\n\tid = %d;\n\tstream_id = 0;\n", tsdlQuote(c.Name), c.ID)
		// A class's first fields are the stream's event context, which
		// the stream block declares.
		sc := min(len(m.StreamContext), c.Context)
		if c.Context > sc {
			b.WriteString("\tcontext := struct {\n")
			for _, f := range c.Fields[sc:c.Context] {
				b.WriteString("\t\t")
				writeField(b, &f)
				b.WriteString(";\n")
			}
			b.WriteString("\t};\n")
		}
		b.WriteString("\tfields := struct {\n")
		for _, f := range c.Fields[c.Context:] {
			b.WriteString("\t\t")
			writeField(b, &f)
			b.WriteString(";\n")
		}
		b.WriteString("\t};\n};\n")
	}
}

// writeField writes one field declaration. Names get a leading underscore,
// which CTF readers strip, so a field may be named like a TSDL keyword.
func writeField(b *bytes.Buffer, f *Field) {
	elem := ctype(f.Elem)
	if f.Hex && !f.Text {
		elem = fmt.Sprintf("integer { size = %d; align = 8; signed = %t; base = 16; }", f.Elem.Size()*8, f.Elem.Signed())
	}
	if f.Text {
		elem = "integer { size = 8; align = 8; signed = false; encoding = UTF8; }"
	}
	switch f.Kind {
	case Scalar:
		fmt.Fprintf(b, "%s _%s", elem, f.Name)
	case Array:
		fmt.Fprintf(b, "%s _%s[%d]", elem, f.Name, f.Len)
	case String:
		fmt.Fprintf(b, "string _%s", f.Name)
	case Sequence:
		fmt.Fprintf(b, "%s _%s[_%s]", elem, f.Name, f.LengthField)
	}
}

func ctype(t IntType) string {
	if t.Signed() {
		return fmt.Sprintf("int%d_t", t.Size()*8)
	}
	return fmt.Sprintf("uint%d_t", t.Size()*8)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// tsdlQuote writes s as a TSDL string literal. TSDL readers differ in the
// escapes they know (ours takes a backslash before any byte, babeltrace2 C
// escapes), so only printable ASCII without quotes or backslashes is
// written and other bytes become '?': what is written reads back the same
// everywhere.
func tsdlQuote(s string) string { return `"` + sanitize(s) + `"` }
