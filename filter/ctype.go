package filter

// The kernel's character classes (lib/ctype.c) are Latin-1, not ASCII:
// 0xa0 is a space and most of 0xc0-0xff are letters, so a filter byte
// is classified as the kernel classifies it, not as Go's unicode does.

// isSpace reports the kernel's isspace: \t \n \v \f \r, space and 0xa0.
func isSpace(c byte) bool {
	return c == ' ' || c >= '\t' && c <= '\r' || c == 0xa0
}

// isDigit reports the kernel's isdigit: 0-9 only.
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isAlnum reports the kernel's isalnum: ASCII letters and digits and the
// Latin-1 letters 0xc0-0xff except 0xd7 and 0xf7.
func isAlnum(c byte) bool {
	switch {
	case isDigit(c), c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		return true
	case c >= 0xc0:
		return c != 0xd7 && c != 0xf7
	}
	return false
}

// isXDigit reports the kernel's isxdigit.
func isXDigit(c byte) bool {
	return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// at returns s[i], or 0 past the end: the kernel reads a NUL-terminated
// string, and Go code mirroring it reads the terminator as 0.
func at(s string, i int) byte {
	if i < 0 || i >= len(s) {
		return 0
	}
	return s[i]
}
