package recorder

import (
	"testing"

	"github.com/kconsume/kconsume/consumer/layout"
	"github.com/kconsume/kconsume/consumer/probe"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// TestMirrorsC: every constant the recorder mirrors of the BPF sources
// equals the C define, wherever in bpf/ it is declared: the event
// header's sizes, packet mode's steps, the program placeholders the
// loader patches, the flags and returns both sides share, and the
// limits both sides assume. A define missing from bpf/ fails too.
func TestMirrorsC(t *testing.T) {
	testenv.CheckMirrors(t, "../../bpf", map[string]uint64{
		"KC_PKT_HDR":            relayfmt.PacketHeaderSize,
		"KC_PKT_COMMIT":         PktCommit,
		"KC_EVH_COMPACT":        relayfmt.CompactHeaderSize,
		"KC_EVH_EXT":            relayfmt.ExtendedHeaderSize,
		"KC_EVH_MAX_ID":         relayfmt.MaxCompactID,
		"KC_EVH_TS_BITS":        relayfmt.CompactTimestampBits,
		"KC_MAX_OPS":            maxPktOps,
		"KC_OP_COPY":            pktOpCopy,
		"KC_OP_STRING":          pktOpString,
		"KC_OP_SEQ":             pktOpSeq,
		"KC_MAX_DYN":            layout.MaxDyn,
		"KC_DYN_REL":            layout.DynRel,
		"KC_CUT":                layout.RingCut,
		"KC_KEY_PLACEHOLDER":    keyPlaceholder,
		"KC_SIZE_PLACEHOLDER":   sizePlaceholder,
		"KC_NR_PLACEHOLDER":     nrPlaceholder,
		"KC_FILTER_PLACEHOLDER": filterPlaceholder,
		"KC_TRIG_PLACEHOLDER":   trigPlaceholder,
		"KC_TRIG_SNAPSHOT":      uint64(TriggerSnapshot),
		"KC_TRIG_STOP":          uint64(TriggerStop),
		"KC_TRIG_START":         uint64(TriggerStart),
		"KC_TRIG_ROTATE":        uint64(TriggerRotate),
		"KC_SMALL_MAX":          smallMax,
		"KC_SAMPLED_MAX":        sampledMax,
		"KC_ARM_FILL":           armFill,
		"KC_ARM_DATA":           armData,
		"KC_SYS_MAX":            sysMax,
		"KC_SYS_USER_CNT":       sysUserCnt,
		"KC_SYS_USER_MAX":       sysUserMax,
		"KC_TP_RECORD":          tpRecord,
		"KC_TP_WAKING":          tpWaking,
		"KC_TP_SWITCH":          tpSwitch,
		"KC_TP_SYSUSER":         tpSysUser,
		"KC_TP_FILTERED":        tpFiltered,
		"KC_SYS_REC":            sysRecLen,
		"KC_PID_WORDS":          pidWords,
		"KC_INJECT_OK":          injectOK,
		"KC_INJECT_OFF":         injectOff,
		"KC_INJECT_LOST":        injectLost,
		"KC_STACK_MAX":          layout.MaxStack,
		"KC_STACK_KERNEL":       stackKernel,
		"KC_STACK_USER":         stackUser,
		"KC_STACK_AT_LIMIT":     stackAtLimit,
		"KC_PROBE_FIXED":        probeFixedMax,
		"KC_PU_STR":             probeUserString,
		"KC_PROBE_ARGS":         probe.MaxArgs,
		"KC_PROBE_DEREFS":       probe.MaxDerefs,
		"KC_PB_REG":             uint64(probe.Reg),
		"KC_PB_STACK":           uint64(probe.Stack),
		"KC_PB_RETVAL":          uint64(probe.Retval),
		"KC_PB_COMM":            uint64(probe.Comm),
		"KC_PB_IMM":             uint64(probe.Imm),
		"KC_PB_MEM":             uint64(probe.Mem),
		"KC_PB_FARG":            uint64(probe.FuncArg),
	})
}
