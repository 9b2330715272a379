package tracefs

import "testing"

// FuzzParseFormat: any bytes give a format or an error, never a panic, and
// a parsed format's fields lie inside the record limit without overlap.
func FuzzParseFormat(f *testing.F) {
	f.Add([]byte(sampleSwitch))
	f.Add([]byte("name: e\nID: 1\nformat:\n\tfield:__data_loc char[] s;\toffset:8;\tsize:4;\tsigned:0;\n"))
	f.Add([]byte("name: e\nID: 2\nformat:\n\tfield:char c[TASK_COMM_LEN];\toffset:8;\tsize:16;\tsigned:0;\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fm, err := ParseFormat("s", data)
		if err != nil {
			return
		}
		end := 0
		for _, fl := range fm.All() {
			if fl.Offset < end || fl.Offset+fl.Size > MaxRecordSize {
				t.Fatalf("field %+v overlaps or runs past the limit", fl)
			}
			end = fl.Offset + fl.Size
			if fl.ArrayLen > 0 && fl.Size%fl.ArrayLen != 0 {
				t.Fatalf("field %+v: size not a multiple of its length", fl)
			}
		}
	})
}
