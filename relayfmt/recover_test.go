package relayfmt

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
)

func TestRecover(t *testing.T) {
	const sub = 4096
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string) // returns nothing; cuts or spoils
		cutIn  string                         // the file Recover must cut
		keep   int64                          // bytes it must keep
	}{
		{"cut mid-packet", func(t *testing.T, dir string) {
			truncate(t, filepath.Join(dir, "trace1"), 5*sub+1000)
		}, "trace1", 5 * sub},
		{"garbage packet", func(t *testing.T, dir string) {
			appendBytes(t, filepath.Join(dir, "trace0"), make([]byte, sub))
		}, "trace0", -1},
		{"cut header", func(t *testing.T, dir string) {
			truncate(t, filepath.Join(dir, "trace0"), 3*sub+40)
		}, "trace0", 3 * sub},
		{"bad event id", func(t *testing.T, dir string) {
			// Spoil the first event header of packet 4: id 29 is unknown.
			editFile(t, filepath.Join(dir, "trace1"), func(b []byte) []byte {
				w := binary.LittleEndian.Uint32(b[4*sub+PacketHeaderSize:])
				binary.LittleEndian.PutUint32(b[4*sub+PacketHeaderSize:], w&^31|29)
				return b
			})
		}, "trace1", 4 * sub},
		{"foreign packet size", func(t *testing.T, dir string) {
			editFile(t, filepath.Join(dir, "trace0"), func(b []byte) []byte {
				binary.LittleEndian.PutUint64(b[2*sub+offPacketSize:], 2*sub*8)
				return append(b, make([]byte, sub)...)
			})
		}, "trace0", 2 * sub},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Overwrite mode with room for everything: the files do not
			// depend on how fast the sink ran.
			g := newGen(t, Config{SubbufSize: sub, NSubbufs: 64, CPUs: 2, Mode: Overwrite}, nil)
			g.defineClasses(7)
			g.burst(1500, 0)
			g.close()
			before := fileSizes(t, g.dir)
			if tt.keep < 0 {
				tt.keep = before[tt.cutIn]
			}
			tt.damage(t, g.dir)
			if err := exec.Command(testenv.BT2(t), g.dir).Run(); err == nil {
				t.Fatal("babeltrace2 read the damaged trace: the damage is not realistic")
			}
			// A crash between writing and renaming the metadata leaves this.
			if err := os.WriteFile(filepath.Join(g.dir, metadataTemp), []byte("/* CTF 1.8"), 0o640); err != nil {
				t.Fatal(err)
			}
			res, err := Recover(g.dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				switch {
				case r.File == tt.cutIn && (r.Kept != tt.keep || r.Reason == ""):
					t.Errorf("%s: kept %d bytes (reason %q), want %d", r.File, r.Kept, r.Reason, tt.keep)
				case r.File != tt.cutIn && r.Cut():
					t.Errorf("%s was cut (%s), only %s is damaged", r.File, r.Reason, tt.cutIn)
				}
			}
			if _, err := os.Stat(filepath.Join(g.dir, metadataTemp)); !os.IsNotExist(err) {
				t.Error("recover left the temporary metadata file")
			}
			got, _ := readAll(t, g.dir)
			// What survives is, per CPU, a prefix of what was written.
			want := byCPU(g.written)
			for cpu, evs := range got {
				for i, e := range evs {
					if !sameEvent(e, want[cpu][i]) {
						t.Fatalf("cpu %d event %d changed by recover", cpu, i)
					}
				}
			}
			agree(t, g.dir)
			if res2, err := Recover(g.dir); err != nil || res2[0].Cut() || res2[1].Cut() {
				t.Errorf("a second recover changed something: %+v, %v", res2, err)
			}
		})
	}
}

func TestRecoverNeedsMetadata(t *testing.T) {
	if _, err := Recover(t.TempDir()); err == nil {
		t.Fatal("recover of a directory without metadata succeeded")
	}
}

// editFile replaces path's content with edit's result.
func editFile(t *testing.T, path string, edit func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, edit(b), 0o640); err != nil {
		t.Fatal(err)
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

func appendBytes(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

func fileSizes(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	m := map[string]int64{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = fi.Size()
	}
	return m
}
