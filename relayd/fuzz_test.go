package relayd

import (
	"testing"

	"github.com/kconsume/kconsume/relayfmt"
)

// FuzzIndexOf: any bytes handed to the sink as a packet give an index or
// an error, never a panic, and an index only for a packet whose header
// agrees with its length.
func FuzzIndexOf(f *testing.F) {
	pkt := make([]byte, 4096)
	relayfmt.PutPacketHeader(pkt, &relayfmt.PacketHeader{ContentSize: 100 * 8, PacketSize: 4096 * 8})
	f.Add(pkt)
	f.Add(pkt[:100])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		x, data, pad, err := indexOf(b)
		if err != nil {
			return
		}
		if x.PacketSize != 8*uint64(len(b)) || uint64(len(data))+uint64(pad) != uint64(len(b)) || x.ContentSize > x.PacketSize {
			t.Fatalf("index %+v, %d bytes + %d padding for a %d-byte packet", x, len(data), pad, len(b))
		}
	})
}

// FuzzParseURL: any string gives a URL with a host and two distinct
// ports in range, or an error.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"net://h", "net://h:1:2", "net6://[::1]:5342", "net://", "tcp://x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURL(s)
		if err != nil {
			return
		}
		if u.Host == "" || u.Control < 1 || u.Control > 65535 || u.Data < 1 || u.Data > 65535 || u.Control == u.Data {
			t.Fatalf("ParseURL(%q) = %+v", s, u)
		}
	})
}
