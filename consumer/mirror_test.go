package consumer

import (
	"testing"

	"github.com/kconsume/kconsume/consumer/recorder"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestMirrorsC: the constants the readers of the rings mirror of the BPF
// sources equal the C defines: the packet header's offsets the
// packet-mode writers fill and the drainer reads, and the record header
// of kconsume's own rings (recorder.TestMirrorsC checks the
// recorder's).
func TestMirrorsC(t *testing.T) {
	testenv.CheckMirrors(t, "../bpf", map[string]uint64{
		"KC_PKT_BEGIN":   pktBegin,
		"KC_PKT_END":     pktEnd,
		"KC_PKT_CONTENT": pktContent,
		"KC_PKT_COMMIT":  recorder.PktCommit,
		"KC_PKT_HDR":     relayfmt.PacketHeaderSize,
		"KC_AREA_HDR":    rbHdrLen,
		"KC_AREA_DISC":   rbDisc,
	})
}
