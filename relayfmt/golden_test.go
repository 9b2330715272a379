package relayfmt

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the generator")

// goldenDir is a small trace written by writeGolden.
const goldenDir = "testdata/golden/basic"

// writeGolden writes a deterministic trace: fixed UUID, seeded events,
// Overwrite mode with room for everything so no sink timing is involved,
// and a reported loss so the trace shows a discarded range.
func writeGolden(t *testing.T) string {
	cfg := Config{SubbufSize: 4096, NSubbufs: 64, CPUs: 2, Mode: Overwrite,
		UUID: [16]byte{0x6b, 0x63, 0x6f, 0x6e, 0x73, 0x75, 0x6d, 0x65, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 1},
		Env:  map[string]string{"hostname": "golden"}}
	g := newGen(t, cfg, nil)
	g.defineClasses(35)
	g.burst(300, 60)
	if err := g.c.Discard(1, 3); err != nil {
		t.Fatal(err)
	}
	g.burst(100, 0)
	g.close()
	return g.dir
}

func TestGolden(t *testing.T) {
	dir := writeGolden(t)
	if *update {
		if err := os.RemoveAll(goldenDir); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(goldenDir, os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"metadata", "trace0", "trace1"} {
		want, err := os.ReadFile(filepath.Join(goldenDir, name))
		if err != nil {
			t.Fatalf("%v (go test ./relayfmt -run TestGolden -update writes it)", err)
		}
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the writer's output changed (%d bytes, golden %d); if on purpose, bump FormatVersion if readers are affected and run with -update", name, len(got), len(want))
		}
	}
	agree(t, goldenDir)
}

func TestMetadataRoundTrip(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 8192, NSubbufs: 3, Global: true, Env: map[string]string{"hostname": "h", "kernel_release": "6.1.0"},
		Clock: Clock{Name: "boot", Description: "CLOCK_BOOTTIME", Offset: -1_500_000_000}}, nil)
	g.defineClasses(len(shapes))
	m := g.c.Metadata()
	text := m.TSDL()
	back, err := ParseMetadata(text)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if !bytes.Equal(back.TSDL(), text) {
		t.Fatalf("metadata does not round-trip:\n%s\n---\n%s", text, back.TSDL())
	}
	if back.Clock != m.Clock || back.SubbufSize != 8192 || back.NSubbufs != 3 || !back.Global || back.Env["kernel_release"] != "6.1.0" {
		t.Fatalf("parsed %+v", back)
	}
	g.close()
}

func TestParseMetadataErrors(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 4096, NSubbufs: 2, CPUs: 1}, nil)
	g.defineClasses(4)
	m := g.c.Metadata()
	good := string(m.TSDL())
	g.close()
	for _, tc := range []struct{ name, from, to string }{
		{"no signature", "/* CTF 1.8 */", "/* CTF 2 */"},
		{"big endian", "byte_order = le;", "byte_order = be;"},
		{"other format", "kconsume_format = 1;", "kconsume_format = 9;"},
		{"bad geometry", "nr_sub = 2;", "nr_sub = 1;"},
		{"header layout", "uint32_t stream_id;", "uint64_t stream_id;"},
		{"context layout", "uint64_t events_discarded;", "uint32_t events_discarded;"},
		{"unknown type", "int32_t _prev_pid", "foo_t _prev_pid"},
		{"unterminated", "};\n", "}"},
		{"duplicate id", "id = 1;", "id = 0;"},
		{"bad uuid", "uuid = \"", "uuid = \"x"},
	} {
		text := bytes.Replace([]byte(good), []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(text, []byte(good)) {
			t.Fatalf("%s: %q not in the metadata", tc.name, tc.from)
		}
		if _, err := ParseMetadata(text); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

// TestMetadataRoundTripTracer: another tracer's name and integer env
// entries (what profile lttng writes) read back as they were written.
func TestMetadataRoundTripTracer(t *testing.T) {
	g := newGen(t, Config{SubbufSize: 8192, NSubbufs: 2, CPUs: 1, Env: map[string]string{"hostname": "h"}}, nil)
	g.defineClasses(2)
	m := g.c.Metadata()
	m.Tracer = "lttng-modules"
	m.EnvInt = map[string]int64{"tracer_major": 2, "tracer_minor": 13, "hostname": 7}
	text := m.TSDL()
	for _, want := range []string{"tracer_name = \"lttng-modules\";", "tracer_major = 2;", "tracer_minor = 13;", "hostname = \"h\";"} {
		if !bytes.Contains(text, []byte(want)) {
			t.Errorf("metadata lacks %q:\n%s", want, text)
		}
	}
	if bytes.Contains(text, []byte("hostname = 7")) {
		t.Errorf("an integer entry shadowed by a string one was written:\n%s", text)
	}
	back, err := ParseMetadata(text)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if back.Tracer != "lttng-modules" || back.EnvInt["tracer_minor"] != 13 || back.Env["hostname"] != "h" {
		t.Fatalf("parsed tracer %q, env %v %v", back.Tracer, back.Env, back.EnvInt)
	}
	g.close()
}
