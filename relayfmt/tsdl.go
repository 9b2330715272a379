package relayfmt

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// MaxMetadataSize bounds the metadata a reader accepts.
const MaxMetadataSize = 16 << 20

// maxDepth bounds type nesting so hostile metadata cannot exhaust the stack.
const maxDepth = 16

// ParseMetadata parses CTF 1.8 TSDL text as kconsume writes it: the
// packet header, packet context and event header must have the layout of
// format.go, and event fields the types of types.go. It returns an error
// naming the line for anything else; it never panics.
func ParseMetadata(text []byte) (*Metadata, error) {
	if len(text) > MaxMetadataSize {
		return nil, fmt.Errorf("metadata: %d bytes, over the limit of %d", len(text), MaxMetadataSize)
	}
	if !strings.HasPrefix(string(text), "/* CTF 1.8") {
		return nil, errors.New("metadata: not CTF 1.8 plain-text metadata (no /* CTF 1.8 */ signature)")
	}
	p := &parser{lx: lexer{src: text, line: 1}, aliases: map[string]*tType{}, structs: map[string]*tType{}}
	p.next()
	m := &Metadata{}
	var seen seenBlocks
	for p.tok.kind != tkEOF && p.err == nil {
		switch kw := p.tok.text; {
		case p.tok.kind == tkIdent && kw == "typealias":
			p.next()
			t := p.parseType(0)
			p.expect(":=")
			name := p.parseTypeName()
			p.expect(";")
			if p.err == nil {
				p.aliases[name] = t
			}
		case p.tok.kind == tkIdent && kw == "struct":
			t := p.parseType(0)
			p.expect(";")
			if p.err == nil && t.name == "" {
				p.fail("anonymous struct at top level")
			}
		case p.tok.kind == tkIdent && (kw == "trace" || kw == "env" || kw == "clock" || kw == "stream" || kw == "event"):
			line := p.tok.line
			p.next()
			entries := p.parseBlock()
			if p.err != nil {
				break
			}
			if err := m.applyBlock(kw, entries, &seen); err != nil {
				return nil, fmt.Errorf("metadata: %s block at line %d: %w", kw, line, err)
			}
		default:
			p.fail(fmt.Sprintf("unexpected %q at top level", p.tok.text))
		}
	}
	if p.err != nil {
		return nil, p.err
	}
	switch {
	case !seen.trace:
		return nil, errors.New("metadata: no trace block")
	case !seen.env:
		return nil, errors.New("metadata: no env block: not a kconsume trace")
	case !seen.clock:
		return nil, errors.New("metadata: no clock block")
	case !seen.stream:
		return nil, errors.New("metadata: no stream block")
	}
	return m, nil
}

// seenBlocks records which of the blocks a trace has only once were read.
type seenBlocks struct{ trace, env, clock, stream bool }

// applyBlock applies the entries of a top-level block of kind kw to m
// and notes the block in seen. It fails for a second clock or stream
// block, or for entries the block's apply rejects.
func (m *Metadata) applyBlock(kw string, entries []entry, seen *seenBlocks) error {
	var err error
	switch kw {
	case "trace":
		seen.trace = true
		err = m.applyTrace(entries)
	case "env":
		seen.env = true
		err = m.applyEnv(entries)
	case "clock":
		if seen.clock {
			err = errors.New("more than one clock")
		}
		seen.clock = true
		err = errors.Join(err, m.applyClock(entries))
	case "stream":
		if seen.stream {
			err = errors.New("more than one stream class")
		}
		seen.stream = true
		err = errors.Join(err, m.applyStream(entries))
	case "event":
		err = m.applyEvent(entries)
	}
	return err
}

// lookup returns the entry of es with key key, and whether there is one.
func lookup(es []entry, key string) (entry, bool) {
	for _, e := range es {
		if e.key == key {
			return e, true
		}
	}
	return entry{}, false
}

func (m *Metadata) applyTrace(es []entry) error {
	if e, _ := lookup(es, "major"); e.val != "1" {
		return fmt.Errorf("CTF major version %q, want 1", e.val)
	}
	if e, _ := lookup(es, "byte_order"); e.val != "le" {
		return fmt.Errorf("byte_order %q, only le is supported", e.val)
	}
	e, _ := lookup(es, "uuid")
	u, err := parseUUID(e.val)
	if err != nil {
		return err
	}
	m.UUID = u
	e, ok := lookup(es, "packet.header")
	if !ok || e.typ == nil {
		return errors.New("no packet.header")
	}
	return checkLayout("packet.header", e.typ, []layoutField{
		{"magic", 32, 0}, {"uuid", 8, 16}, {"stream_id", 32, 0}, {"stream_instance_id", 64, 0}})
}

func (m *Metadata) applyEnv(es []entry) error {
	m.Env = map[string]string{}
	known := map[string]*int{"sub_size": &m.SubbufSize, "nr_sub": &m.NSubbufs}
	var format, global int = -1, 0
	for _, e := range es {
		switch e.key {
		case "domain":
		case "tracer_name":
			if e.val != "kconsume" {
				m.Tracer = e.val
			}
		case "kconsume_format":
			format = atoiOr(e.val, -1)
		case "global":
			global = atoiOr(e.val, -1)
		default:
			if p, ok := known[e.key]; ok {
				*p = atoiOr(e.val, -1)
				continue
			}
			switch e.kind {
			case tkString:
				m.Env[e.key] = e.val
			case tkNumber:
				v, err := strconv.ParseInt(e.val, 0, 64)
				if err != nil {
					return fmt.Errorf("env %s: %q is not a 64-bit integer", e.key, e.val)
				}
				if m.EnvInt == nil {
					m.EnvInt = map[string]int64{}
				}
				m.EnvInt[e.key] = v
			default:
				return fmt.Errorf("env %s: unexpected value %q", e.key, e.val)
			}
		}
	}
	if format != FormatVersion {
		return fmt.Errorf("kconsume_format %d: this reader knows version %d", format, FormatVersion)
	}
	if global != 0 && global != 1 {
		return fmt.Errorf("env global = %d, want 0 or 1", global)
	}
	m.Global = global == 1
	if err := CheckGeometry(m.SubbufSize, m.NSubbufs); err != nil {
		return fmt.Errorf("env: %w", err)
	}
	return nil
}

func (m *Metadata) applyClock(es []entry) error {
	c := &m.Clock
	e, _ := lookup(es, "name")
	if !IsIdent(e.val) {
		return fmt.Errorf("clock name %q is not an identifier", e.val)
	}
	c.Name = e.val
	if e, ok := lookup(es, "description"); ok {
		c.Description = e.val
	}
	freq, offS, off := uint64(1e9), int64(0), uint64(0)
	var err error
	if e, ok := lookup(es, "freq"); ok {
		if freq, err = strconv.ParseUint(e.val, 0, 64); err != nil || freq == 0 {
			return fmt.Errorf("clock freq %q invalid", e.val)
		}
	}
	if e, ok := lookup(es, "offset_s"); ok {
		if offS, err = strconv.ParseInt(e.val, 0, 64); err != nil || offS < -1<<33 || offS > 1<<33 {
			return fmt.Errorf("clock offset_s %q invalid", e.val)
		}
	}
	if e, ok := lookup(es, "offset"); ok {
		if off, err = strconv.ParseUint(e.val, 0, 64); err != nil || off >= freq {
			return fmt.Errorf("clock offset %q invalid", e.val)
		}
	}
	c.Freq = freq
	// Rounded up, so that the writer's rounding down gives the same
	// cycles back (exactly when freq <= 1 GHz, and stably after one
	// rewrite when the clock is finer than a nanosecond).
	c.Offset = offS*1e9 + int64(mulDiv(off, 1e9, freq, true))
	return nil
}

func (m *Metadata) applyStream(es []entry) error {
	if e, ok := lookup(es, "id"); ok && e.val != "0" {
		return fmt.Errorf("stream id %s, want 0", e.val)
	}
	e, ok := lookup(es, "packet.context")
	if !ok || e.typ == nil {
		return errors.New("no packet.context")
	}
	if err := checkLayout("packet.context", e.typ, []layoutField{
		{"timestamp_begin", 64, 0}, {"timestamp_end", 64, 0}, {"content_size", 64, 0}, {"packet_size", 64, 0},
		{"packet_seq_num", 64, 0}, {"events_discarded", 64, 0}, {"cpu_id", 32, 0}}); err != nil {
		return err
	}
	e, ok = lookup(es, "event.header")
	if !ok || e.typ == nil {
		return errors.New("no event.header")
	}
	h := e.typ
	if h.kind != ttStruct || len(h.fields) != 2 || h.fields[0].name != "id" || h.fields[0].typ.kind != ttEnum ||
		h.fields[0].typ.size != 5 || h.fields[1].typ.kind != ttVariant || len(h.fields[1].typ.fields) != 2 {
		return errors.New("event.header is not event_header_compact (5-bit id, compact/extended variant)")
	}
	if c := h.fields[1].typ.fields[0].typ; len(c.fields) != 1 || c.fields[0].typ.size != CompactTimestampBits {
		return errors.New("event.header: compact variant is not a 27-bit timestamp")
	}
	if err := checkLayout("event.header extended", h.fields[1].typ.fields[1].typ, []layoutField{{"id", 32, 0}, {"timestamp", 64, 0}}); err != nil {
		return err
	}
	e, ok = lookup(es, "event.context")
	if !ok {
		if m.Global {
			return errors.New("env global = 1, but no event.context with the CPU")
		}
		return nil
	}
	if e.typ == nil || e.typ.kind != ttStruct {
		return errors.New("event.context is not a struct")
	}
	fields := e.typ.fields
	if m.Global {
		if len(fields) == 0 {
			return errors.New("event.context: no _cpu, which env global = 1 needs first")
		}
		if err := checkLayout("event.context", &tType{kind: ttStruct, fields: fields[:1]}, []layoutField{{"_cpu", 32, 0}}); err != nil {
			return err
		}
		fields = fields[1:]
	}
	if len(m.Classes) > 0 && len(fields) > 0 {
		return errors.New("event.context: declared after event classes, which lack it")
	}
	for _, tf := range fields {
		f, err := convertField(tf)
		if err != nil {
			return fmt.Errorf("event.context: line %d: %w", tf.line, err)
		}
		if f.Kind != Scalar && f.Kind != Array {
			return fmt.Errorf("event.context: field %q: only fixed-size fields are supported", f.Name)
		}
		f.Context = true
		m.StreamContext = append(m.StreamContext, f)
	}
	return nil
}

func (m *Metadata) applyEvent(es []entry) error {
	e, _ := lookup(es, "name")
	name := e.val
	e, _ = lookup(es, "id")
	id := atoiOr(e.val, -1)
	if id < 0 || id > MaxEventID {
		return fmt.Errorf("event %q: id %q out of range 0..%d", name, e.val, MaxEventID)
	}
	if e, ok := lookup(es, "stream_id"); ok && e.val != "0" {
		return fmt.Errorf("event %q: stream_id %s, want 0", name, e.val)
	}
	// The stream's event context comes first (a copy: Fields are the
	// class's own).
	fields := append([]Field(nil), m.StreamContext...)
	for _, scope := range []string{"context", "fields"} {
		e, ok := lookup(es, scope)
		if !ok {
			continue
		}
		if e.typ == nil || e.typ.kind != ttStruct {
			return fmt.Errorf("event %q: %s is not a struct", name, scope)
		}
		for _, tf := range e.typ.fields {
			f, err := convertField(tf)
			if err != nil {
				return fmt.Errorf("event %q: line %d: %w", name, tf.line, err)
			}
			f.Context = scope == "context"
			fields = append(fields, f)
		}
	}
	c, err := NewEventClass(uint32(id), name, fields)
	if err != nil {
		return err
	}
	if m.Class(uint32(id)) != nil {
		return fmt.Errorf("event %q: id %d already used by %q", name, id, m.Class(uint32(id)).Name)
	}
	for len(m.Classes) <= id {
		m.Classes = append(m.Classes, nil)
	}
	m.Classes[id] = c
	return nil
}

// convertField maps a TSDL field declaration to a Field, stripping the one
// leading underscore CTF 1.8 readers strip.
func convertField(tf tField) (Field, error) {
	f := Field{Name: strings.TrimPrefix(tf.name, "_")}
	t := tf.typ
	switch t.kind {
	case ttString:
		if tf.arrLen > 0 || tf.seqLen != "" {
			return f, fmt.Errorf("field %q: arrays of strings are not supported", tf.name)
		}
		f.Kind = String
		return f, nil
	case ttInt:
	default:
		return f, fmt.Errorf("field %q: only integers and strings are supported", tf.name)
	}
	if t.align != 8 || t.size%8 != 0 || t.mapClock != "" {
		return f, fmt.Errorf("field %q: integers must be byte-aligned, whole bytes, unmapped", tf.name)
	}
	f.Elem = intType(t.size/8, t.signed)
	if f.Elem == 0 {
		return f, fmt.Errorf("field %q: integer size %d unsupported", tf.name, t.size)
	}
	f.Text = t.encoding != "" && t.encoding != "none"
	f.Hex = t.base16 && !f.Text
	switch {
	case tf.arrLen > 0:
		f.Kind, f.Len = Array, tf.arrLen
	case tf.seqLen != "":
		f.Kind, f.LengthField = Sequence, strings.TrimPrefix(tf.seqLen, "_")
	default:
		f.Kind = Scalar
		if f.Text {
			return f, fmt.Errorf("field %q: a single char is not supported", tf.name)
		}
	}
	return f, nil
}

func intType(size int, signed bool) IntType {
	for _, t := range []IntType{U8, U16, U32, U64, S8, S16, S32, S64} {
		if t.Size() == size && t.Signed() == signed {
			return t
		}
	}
	return 0
}

type layoutField struct {
	name string
	bits int
	arr  int
}

// checkLayout verifies that a header struct declares exactly the fields
// the fixed offsets of format.go assume.
func checkLayout(what string, t *tType, want []layoutField) error {
	if t == nil || t.kind != ttStruct || len(t.fields) != len(want) {
		return fmt.Errorf("%s: not the expected struct of %d fields", what, len(want))
	}
	for i, w := range want {
		f := t.fields[i]
		if f.name != w.name || f.typ.kind != ttInt && f.typ.kind != ttEnum || f.typ.size != w.bits || f.typ.align != 8 && f.typ.align != 1 || f.arrLen != w.arr || f.seqLen != "" {
			return fmt.Errorf("%s: field %d is %q, want %s of %d bits", what, i, f.name, w.name, w.bits)
		}
	}
	return nil
}

func parseUUID(s string) ([16]byte, error) {
	var u [16]byte
	h := strings.ReplaceAll(s, "-", "")
	if len(h) != 32 || len(s) != 36 {
		return u, fmt.Errorf("bad uuid %q", s)
	}
	for i := range u {
		v, err := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		if err != nil {
			return u, fmt.Errorf("bad uuid %q", s)
		}
		u[i] = byte(v)
	}
	return u, nil
}

// CheckGeometry fails, saying why, unless subbufSize is a multiple of the
// page size from MinSubbufSize to MaxSubbufSize and nSubbufs is within
// MinSubbufs..MaxSubbufs.
func CheckGeometry(subbufSize, nSubbufs int) error {
	switch {
	case subbufSize < MinSubbufSize || subbufSize > MaxSubbufSize:
		return fmt.Errorf("sub-buffer size %d out of range %d..%d", subbufSize, MinSubbufSize, MaxSubbufSize)
	case subbufSize%PageSize != 0:
		return fmt.Errorf("sub-buffer size %d is not a multiple of the page size %d", subbufSize, PageSize)
	case nSubbufs < MinSubbufs:
		return fmt.Errorf("%d sub-buffers: at least %d are needed, so one can be written while another is read (%d..%d)", nSubbufs, MinSubbufs, MinSubbufs, MaxSubbufs)
	case nSubbufs > MaxSubbufs:
		return fmt.Errorf("%d sub-buffers: at most %d (%d..%d)", nSubbufs, MaxSubbufs, MinSubbufs, MaxSubbufs)
	}
	return nil
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// mulDiv returns a*b/c rounded down, or up when ceil is set, computed in
// 128 bits. The quotient must fit in 64 bits.
func mulDiv(a, b, c uint64, ceil bool) uint64 {
	hi, lo := bits.Mul64(a, b)
	q, r := bits.Div64(hi, lo, c)
	if ceil && r != 0 {
		q++
	}
	return q
}
