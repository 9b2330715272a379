package relayfmt

import "strconv"

// AppendValue appends v in text form to dst: integers in decimal, text and
// strings Go-quoted, arrays and sequences as [a, b, c].
func AppendValue(dst []byte, v Value) []byte {
	f := v.Field
	switch {
	case f.Kind == String || f.Text:
		return strconv.AppendQuote(dst, string(v.Text()))
	case f.Kind == Scalar:
		return appendElem(dst, v, 0)
	}
	dst = append(dst, '[')
	for i := range v.Len() {
		if i > 0 {
			dst = append(dst, ", "...)
		}
		dst = appendElem(dst, v, i)
	}
	return append(dst, ']')
}

func appendElem(dst []byte, v Value, i int) []byte {
	if v.Field.Hex {
		return strconv.AppendUint(append(dst, "0x"...), v.Uint(i), 16)
	}
	if v.Field.Elem.Signed() {
		return strconv.AppendInt(dst, v.Int(i), 10)
	}
	return strconv.AppendUint(dst, v.Uint(i), 10)
}
