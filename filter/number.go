package filter

import "errors"

var (
	errInval = errors.New("invalid number")
	errRange = errors.New("number out of range")
)

// fixupRadix mirrors _parse_integer_fixup_radix (lib/kstrtox.c) for base
// 0: "0x" followed by a hex digit is hex, a leading 0 octal, else decimal.
// It returns the base and s without its "0x".
func fixupRadix(s string) (int, string) {
	base := 10
	if at(s, 0) == '0' {
		base = 8
		if at(s, 1)|0x20 == 'x' && isXDigit(at(s, 2)) {
			return 16, s[2:]
		}
	}
	return base, s
}

// kstrtoull returns s read as lib/kstrtox.c's kstrtoull(s, 0) reads it:
// an optional '+', then decimal, 0x hex or 0 octal digits and nothing
// else. It fails with errInval on a bad digit or no digits, and errRange
// past 64 bits.
func kstrtoull(s string) (uint64, error) {
	if at(s, 0) == '+' {
		s = s[1:]
	}
	return parseUnsigned(s)
}

// parseUnsigned is _kstrtoull: kstrtoull without the '+'.
func parseUnsigned(s string) (uint64, error) {
	base, s := fixupRadix(s)
	var res uint64
	overflow := false
	n := 0
	for ; n < len(s); n++ {
		c := s[n]
		var v uint64
		switch lc := c | 0x20; {
		case isDigit(c):
			v = uint64(c - '0')
		case lc >= 'a' && lc <= 'f':
			v = uint64(lc-'a') + 10
		default:
			v = 99
		}
		if v >= uint64(base) {
			break
		}
		hi := res * uint64(base)
		if res != 0 && hi/uint64(base) != res || hi+v < hi {
			overflow, res = true, ^uint64(0)
			continue
		}
		res = hi + v
	}
	switch {
	case overflow:
		return 0, errRange
	case n == 0:
		return 0, errInval
	}
	rest := s[n:]
	if at(rest, 0) == '\n' {
		rest = rest[1:]
	}
	if rest != "" {
		return 0, errInval
	}
	return res, nil
}

// kstrtoll returns s read as kstrtoll(s, 0): a '-' then an unsigned
// number whose negation fits an int64, or kstrtoull's reading when that
// fits an int64. It fails as kstrtoull does, and with errRange outside
// int64.
func kstrtoll(s string) (int64, error) {
	if at(s, 0) == '-' {
		u, err := parseUnsigned(s[1:])
		if err != nil {
			return 0, err
		}
		if int64(-u) > 0 {
			return 0, errRange
		}
		return int64(-u), nil
	}
	u, err := kstrtoull(s)
	if err != nil {
		return 0, err
	}
	if int64(u) < 0 {
		return 0, errRange
	}
	return int64(u), nil
}
