package relayfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/internal/testenv"
)

// genEvent is one event a test wrote and the channel accepted.
type genEvent struct {
	cpu     int
	ts      uint64
	id      uint32
	payload []byte
}

// gen writes random, valid events into a channel and remembers what the
// channel accepted, so tests can compare what readers return.
type gen struct {
	t       testing.TB
	c       *Channel
	dir     string
	rng     *rand.Rand
	classes []*EventClass
	ts      []uint64
	shared  bool // one clock for all CPUs (global mode: one stream)
	written []genEvent
}

func newGen(t testing.TB, cfg Config, wrap func(Sink) Sink) *gen {
	t.Helper()
	return newGenIn(t, t.TempDir(), cfg, wrap)
}

// newGenIn is newGen writing into dir.
func newGenIn(t testing.TB, dir string, cfg Config, wrap func(Sink) Sink) *gen {
	t.Helper()
	ds, err := NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	var sink Sink = ds
	if wrap != nil {
		sink = wrap(ds)
	}
	if cfg.Clock.Name == "" {
		cfg.Clock = Clock{Name: "monotonic", Description: "CLOCK_MONOTONIC", Offset: 1_700_000_000_123_456_789}
	}
	c, err := NewChannel(cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	ncpu := max(cfg.CPUs, 1)
	if cfg.Global {
		ncpu = 3
	}
	g := &gen{t: t, c: c, dir: dir, rng: rand.New(rand.NewPCG(1, uint64(len(t.Name())))), ts: make([]uint64, ncpu)}
	for i := range g.ts {
		g.ts[i] = 1_000_000 + uint64(i)
	}
	g.shared = cfg.Global
	return g
}

// shapes are the field lists the generator picks event classes from.
var shapes = [][]Field{
	{CharArrayField("prev_comm", 16), ScalarField("prev_pid", PidT), ScalarField("prev_prio", Int), ScalarField("prev_state", S64),
		CharArrayField("next_comm", 16), ScalarField("next_pid", PidT), ScalarField("next_prio", Int)},
	{ScalarField("id", S64), ArrayField("args", U64, 6)},
	{StringField("filename"), ScalarField("flags", UInt), ScalarField("mode", U16)},
	{ScalarField("len", U32), SequenceField("data", U8, "len"), ScalarField("cnt", U16), SequenceField("vals", S32, "cnt")},
	{ScalarField("n", U8), {Name: "name", Kind: Sequence, Elem: U8, LengthField: "n", Text: true}, StringField("msg"), ArrayField("small", S8, 3)},
	{},
	{ScalarField("a", U8), ScalarField("b", S8), ScalarField("c", U16), ScalarField("d", S16), ScalarField("e", U32), ScalarField("f", S32),
		ScalarField("g", U64), ScalarField("h", S64)},
}

// defineClasses adds n event classes cycling through shapes.
func (g *gen) defineClasses(n int) {
	g.t.Helper()
	for i := range n {
		name := fmt.Sprintf("sys%d:event_%d", i%4, i)
		if i == 0 {
			name = "sched:sched_switch"
		}
		c, err := g.c.AddEventClass(name, shapes[i%len(shapes)])
		if err != nil {
			g.t.Fatal(err)
		}
		g.classes = append(g.classes, c)
	}
}

// text returns n random bytes other than NUL. Tests compared with
// babeltrace2 never write empty text: babeltrace2 2.0.4 prints the previous
// event's value for an empty string field (fixed upstream after 2.0.4,
// efficios/babeltrace review 4528); our reader returns "".
func (g *gen) text(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + g.rng.IntN(255)) // any byte but NUL, escapes included
	}
	return b
}

func (g *gen) payload(c *EventClass) []byte {
	var p []byte
	counts := map[string]uint64{}
	for _, f := range c.Fields {
		sz := f.Elem.Size()
		switch f.Kind {
		case Scalar:
			v := g.rng.Uint64()
			if g.rng.IntN(4) == 0 {
				v = uint64(g.rng.IntN(5))
			}
			if f.Name == "len" || f.Name == "cnt" {
				v = uint64(g.rng.IntN(6))
			}
			if f.Name == "n" { // length of a text sequence: never empty (see text)
				v = uint64(1 + g.rng.IntN(5))
			}
			counts[f.Name] = v & (1<<(8*sz) - 1)
			p = binary.LittleEndian.AppendUint64(p, v)[:len(p)+sz]
		case Array:
			if f.Text {
				p = append(p, make([]byte, f.Len)...)
				copy(p[len(p)-f.Len:], g.text(1+g.rng.IntN(f.Len)))
				break
			}
			for range f.Len {
				p = binary.LittleEndian.AppendUint64(p, g.rng.Uint64())[:len(p)+sz]
			}
		case String:
			p = append(append(p, g.text(1+g.rng.IntN(20))...), 0)
		case Sequence:
			n := int(counts[f.LengthField])
			if f.Text {
				p = append(p, g.text(n)...)
				break
			}
			for range n {
				p = binary.LittleEndian.AppendUint64(p, g.rng.Uint64())[:len(p)+sz]
			}
		}
	}
	return p
}

// write writes one random event on cpu dt ticks after its last one and
// reports the channel's answer.
func (g *gen) write(cpu int, dt uint64) error {
	c := g.classes[g.rng.IntN(len(g.classes))]
	clk := cpu
	if g.shared {
		clk = 0
	}
	g.ts[clk] += dt
	ev := genEvent{cpu: cpu, ts: g.ts[clk], id: c.ID, payload: g.payload(c)}
	err := g.c.Write(cpu, ev.ts, ev.id, ev.payload)
	if err == nil {
		g.written = append(g.written, ev)
	} else if !errors.Is(err, ErrDropped) && !errors.Is(err, ErrTooLarge) {
		g.t.Fatalf("write: %v", err)
	}
	return err
}

// burst writes n events on random CPUs; every gapEvery-th event comes
// after a pause longer than a compact timestamp can express.
func (g *gen) burst(n, gapEvery int) {
	for i := range n {
		dt := uint64(1 + g.rng.IntN(5000))
		if gapEvery > 0 && i%gapEvery == gapEvery-1 {
			dt = 1<<CompactTimestampBits + uint64(g.rng.IntN(1<<29))
		}
		g.write(g.rng.IntN(len(g.ts)), dt)
	}
}

func (g *gen) close() {
	g.t.Helper()
	if err := g.c.Close(); err != nil {
		g.t.Fatal(err)
	}
}

// openMerged opens the trace in dir and a merger over its streams, closed
// when the test ends.
func openMerged(t testing.TB, dir string) (*Trace, *Merger) {
	t.Helper()
	tr, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tr.Merge()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return tr, m
}

// readAll reads the trace with our reader: events per CPU and notices.
func readAll(t testing.TB, dir string) (map[int][]genEvent, []Item) {
	t.Helper()
	_, m := openMerged(t, dir)
	evs := map[int][]genEvent{}
	var notices []Item
	var last uint64
	for m.Next() {
		it := m.Item()
		if it.Time < last {
			t.Fatalf("merge went back in time: %d after %d", it.Time, last)
		}
		last = it.Time
		if it.Kind != EventItem {
			notices = append(notices, *it)
			continue
		}
		evs[int(it.CPU)] = append(evs[int(it.CPU)], genEvent{cpu: int(it.CPU), ts: it.Time, id: it.Class.ID, payload: slices.Clone(it.Payload)})
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
	return evs, notices
}

func byCPU(evs []genEvent) map[int][]genEvent {
	m := map[int][]genEvent{}
	for _, e := range evs {
		m[e.cpu] = append(m[e.cpu], e)
	}
	return m
}

func sameEvent(a, b genEvent) bool {
	return a.cpu == b.cpu && a.ts == b.ts && a.id == b.id && string(a.payload) == string(b.payload)
}

// runBT2 returns babeltrace2's event lines and its discard warnings in the
// form noticeLine uses.
func runBT2(t testing.TB, dir string) (lines, notices []string) {
	t.Helper()
	lines, discards := testenv.RunBT2(t, dir)
	for _, d := range discards {
		notices = append(notices, fmt.Sprintf("%d %s [%s,%s] %s", d.Count, d.Kind, d.Begin, d.End, d.Stream))
	}
	return lines, notices
}

// noticeLine formats a notice as runBT2 reads babeltrace2's warning: the
// range as UTC time of day (babeltrace2 --clock-gmt), clock offset added.
func noticeLine(meta *Metadata, it *Item) string {
	kind := "events"
	if it.Kind == DiscardedPackets {
		kind = "packets"
	}
	tod := func(cycles uint64) string {
		ns := meta.Clock.Offset + int64(cycles)
		return time.Unix(0, ns).UTC().Format("15:04:05.000000000")
	}
	return fmt.Sprintf("%d %s [%s,%s] %s", it.Count, kind, tod(it.Begin), tod(it.End), it.Stream)
}

// ourLines formats the merged trace as babeltrace2 --clock-cycles
// --no-delta prints it.
func ourLines(t testing.TB, dir string) (lines, notices []string) {
	t.Helper()
	tr, m := openMerged(t, dir)
	var err error
	var vals []Value
	for m.Next() {
		it := m.Item()
		if it.Kind != EventItem {
			notices = append(notices, noticeLine(tr.Meta, it))
			continue
		}
		if vals, err = it.Fields(vals); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, formatBT2(tr.Meta, it, vals))
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
	return lines, notices
}

func formatBT2(meta *Metadata, it *Item, vals []Value) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%020d] ", it.Time)
	if h, ok := meta.Env["hostname"]; ok {
		b.WriteString(h + " ")
	}
	// babeltrace2 prints the packet context, the stream's event
	// context, the event's own and the payload, each in braces.
	sc := len(meta.StreamContext)
	if meta.Global {
		fmt.Fprintf(&b, "%s: { cpu_id = 0 }, { cpu = %d", it.Class.Name, it.CPU)
		if sc > 0 {
			b.WriteString(", ")
			writeValues(&b, vals[:sc])
		}
		b.WriteString(" }, ")
	} else {
		fmt.Fprintf(&b, "%s: { cpu_id = %d }, ", it.Class.Name, it.CPU)
		if sc > 0 {
			b.WriteString("{ ")
			writeValues(&b, vals[:sc])
			b.WriteString(" }, ")
		}
	}
	if it.Class.Context > sc {
		b.WriteString("{ ")
		writeValues(&b, vals[sc:it.Class.Context])
		b.WriteString(" }, ")
	}
	vals = vals[it.Class.Context:]
	if len(vals) == 0 {
		b.WriteString("{ }")
		return b.String()
	}
	b.WriteString("{ ")
	writeValues(&b, vals)
	b.WriteString(" }")
	return b.String()
}

// writeValues writes vals as babeltrace2 prints a struct's fields.
func writeValues(b *strings.Builder, vals []Value) {
	for i, v := range vals {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(v.Field.Name + " = ")
		f := v.Field
		switch {
		case f.Kind == String || f.Text:
			bt2Quote(b, v.Text())
		case f.Kind == Scalar:
			writeInt(b, v, 0)
		default:
			if v.Len() == 0 {
				b.WriteString("[ ]")
				break
			}
			b.WriteString("[ ")
			for j := range v.Len() {
				if j > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(b, "[%d] = ", j)
				writeInt(b, v, j)
			}
			b.WriteString(" ]")
		}
	}
}

func writeInt(b *strings.Builder, v Value, i int) {
	if v.Field.Hex {
		fmt.Fprintf(b, "0x%X", v.Uint(i))
		return
	}
	if v.Field.Elem.Signed() {
		fmt.Fprintf(b, "%d", v.Int(i))
	} else {
		fmt.Fprintf(b, "%d", v.Uint(i))
	}
}

// bt2Quote quotes text as babeltrace2's pretty printer does.
func bt2Quote(b *strings.Builder, s []byte) {
	b.WriteByte('"')
	for _, c := range s {
		switch c {
		case '\a':
			b.WriteString(`\a`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\v':
			b.WriteString(`\v`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		case 0x1b:
			b.WriteString(`\e`)
		case '"', '\'', '?', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			if c < 0x20 || c == 0x7f {
				fmt.Fprintf(b, `\x%02x`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}

// agree checks that babeltrace2 and our reader print the same events and
// the same discard notices.
func agree(t *testing.T, dir string) (lines int) {
	t.Helper()
	ours, ourN := ourLines(t, dir)
	theirs, theirN := runBT2(t, dir)
	if len(ours) != len(theirs) {
		t.Errorf("babeltrace2 printed %d events, our reader %d", len(theirs), len(ours))
	}
	for i := range min(len(ours), len(theirs)) {
		if ours[i] != theirs[i] {
			t.Fatalf("event %d differs:\nbabeltrace2: %s\nours:        %s", i, theirs[i], ours[i])
		}
	}
	slices.Sort(ourN)
	slices.Sort(theirN)
	if !slices.Equal(ourN, theirN) {
		t.Errorf("discard notices differ:\nbabeltrace2: %q\nours:        %q", theirN, ourN)
	}
	return len(ours)
}
