package consumer

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/layout"

	"github.com/kconsume/kconsume/relayfmt"
)

// cDefine is a `#define KC_NAME value` of the BPF sources whose value is
// a number or a bit, (1U << N).
var cDefine = regexp.MustCompile(`(?m)^#define\s+(KC_[A-Z0-9_]+)\s+(?:(0x[0-9a-fA-F]+|[0-9]+)(?:U|ULL|u)?\b|\(1U?\s*<<\s*([0-9]+)\))`)

// TestMirrorsC: every constant the Go side mirrors of the BPF sources
// equals the C define, wherever in bpf/ it is declared: the packet
// header's offsets the packet-mode writers fill, the event header's
// sizes, the program placeholders the loader patches, and the limits
// both sides assume. A define missing from bpf/ fails too.
func TestMirrorsC(t *testing.T) {
	defs := map[string]uint64{}
	where := map[string]string{}
	err := filepath.WalkDir("../bpf", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".h") || strings.HasSuffix(path, ".c")) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range cDefine.FindAllStringSubmatch(string(b), -1) {
			num, shift := m[2], m[3]
			v, err := strconv.ParseUint(num+shift, 0, 64)
			if err != nil {
				t.Fatalf("%s: %s: %v", path, m[0], err)
			}
			if shift != "" {
				v = 1 << v
			}
			if old, ok := defs[m[1]]; ok && old != v {
				t.Errorf("%s is %d in %s and %d in %s", m[1], old, where[m[1]], v, path)
			}
			defs[m[1]], where[m[1]] = v, path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mirrors := map[string]uint64{
		"KC_PKT_HDR":          relayfmt.PacketHeaderSize,
		"KC_PKT_BEGIN":        pktBegin,
		"KC_PKT_END":          pktEnd,
		"KC_PKT_CONTENT":      pktContent,
		"KC_PKT_COMMIT":       pktCommit,
		"KC_EVH_COMPACT":      relayfmt.CompactHeaderSize,
		"KC_EVH_EXT":          relayfmt.ExtendedHeaderSize,
		"KC_EVH_MAX_ID":       relayfmt.MaxCompactID,
		"KC_EVH_TS_BITS":      relayfmt.CompactTimestampBits,
		"KC_MAX_OPS":          maxPktOps,
		"KC_OP_COPY":          pktOpCopy,
		"KC_OP_STRING":        pktOpString,
		"KC_OP_SEQ":           pktOpSeq,
		"KC_MAX_DYN":          layout.MaxDyn,
		"KC_DYN_REL":          layout.DynRel,
		"KC_KEY_PLACEHOLDER":  keyPlaceholder,
		"KC_SIZE_PLACEHOLDER": sizePlaceholder,
		"KC_NR_PLACEHOLDER":   nrPlaceholder,
		"KC_SMALL_MAX":        smallMax,
		"KC_SAMPLED_MAX":      sampledMax,
		"KC_ARM_FILL":         armFill,
		"KC_ARM_DATA":         armData,
		"KC_SYS_MAX":          sysMax,
		"KC_SYS_USER_CNT":     sysUserCnt,
		"KC_SYS_USER_MAX":     sysUserMax,
		"KC_TP_RECORD":        tpRecord,
		"KC_TP_WAKING":        tpWaking,
		"KC_TP_SWITCH":        tpSwitch,
		"KC_TP_SYSUSER":       tpSysUser,
		"KC_AREA_HDR":         rbHdrLen,
		"KC_AREA_DISC":        rbDisc,
		"KC_CUT":              layout.RingCut,
		"KC_PID_WORDS":        pidWords,
		"KC_INJECT_OK":        injectOK,
		"KC_INJECT_OFF":       injectOff,
		"KC_INJECT_LOST":      injectLost,
	}
	for name, want := range mirrors {
		got, ok := defs[name]
		switch {
		case !ok:
			t.Errorf("%s: no #define in bpf/ (the Go side mirrors %d)", name, want)
		case got != want:
			t.Errorf("%s is %d in %s, the Go side has %d", name, got, where[name], want)
		}
	}
}
