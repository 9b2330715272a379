package filter

import (
	"encoding/binary"
	"fmt"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// cpumask is a value for a data_loc cpumask field: the bytes of its
// bitmap.
type cpumask []byte

// makeRecord returns a record of format f with the fields of vals set:
// integers (any Go integer) in the field's size, strings in char arrays
// (NUL-padded) or appended for data_loc/rel_loc fields with their NUL,
// cpumask bytes appended as they are; the others zero.
func makeRecord(f *tracefs.Format, vals map[string]any) []byte {
	rec := make([]byte, f.FixedSize())
	for _, fl := range f.All() {
		v, ok := vals[fl.Name]
		if !ok {
			continue
		}
		switch v := v.(type) {
		case string:
			if fl.Loc == tracefs.Inline {
				copy(rec[fl.Offset:fl.Offset+fl.Size], v)
				continue
			}
			rec = appendDyn(rec, fl, append([]byte(v), 0))
		case cpumask:
			rec = appendDyn(rec, fl, v)
		default:
			putInt(rec[fl.Offset:fl.Offset+fl.Size], toUint(v))
		}
	}
	return rec
}

// appendDyn appends data for a data_loc or rel_loc field and sets its
// location word.
func appendDyn(rec []byte, fl tracefs.Field, data []byte) []byte {
	off := len(rec)
	if fl.Loc == tracefs.RelLoc {
		off -= fl.Offset + 4
	}
	binary.LittleEndian.PutUint32(rec[fl.Offset:], uint32(len(data))<<16|uint32(off))
	return append(rec, data...)
}

func putInt(b []byte, v uint64) {
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
}

func toUint(v any) uint64 {
	switch v := v.(type) {
	case int:
		return uint64(v)
	case int64:
		return uint64(v)
	case uint64:
		return v
	case int32:
		return uint64(v)
	case uint32:
		return uint64(v)
	}
	panic(fmt.Sprintf("value %T", v))
}
