package filter

import (
	"bytes"
	"strings"
)

// parseRegex classifies a ~ pattern as filter_parse_regex
// (kernel/trace/trace_events_filter.c) does, returning the text to
// match, its kind, and not when the pattern started with '!'. A pattern
// starting with a digit (after the '!') is matched whole (MATCH_INDEX,
// matched as MATCH_FULL); a leading '*' makes MatchEnd, a trailing one
// MatchFront, both MatchMiddle; a '*' elsewhere or any '?', '[' or '\'
// makes a MatchGlob of the whole pattern, leading '*' included.
func parseRegex(pat string) (string, MatchKind, bool) {
	not := false
	if strings.HasPrefix(pat, "!") {
		not, pat = true, pat[1:]
	}
	if isDigit(at(pat, 0)) {
		return pat, MatchFull, not
	}
	kind := MatchFull
	search := pat
	for i := 0; i < len(pat); i++ {
		switch c := pat[i]; {
		case c == '*' && i == 0:
			kind = MatchEnd
		case c == '*' && i == len(pat)-1:
			if kind == MatchEnd {
				kind = MatchMiddle
			} else {
				kind = MatchFront
			}
			search = pat[:i]
		case c == '*', c == '[', c == '?', c == '\\':
			return pat, MatchGlob, not
		}
	}
	if pat != "" && pat[0] == '*' {
		search = search[1:]
	}
	return search, kind, not
}

// matchString returns whether str matches p's pattern, as the kernel's
// regex_match_* callbacks do over str bounded by n bytes (the field's
// length, with its NUL; 0 for a string known only by its NUL). str holds
// the bytes the record has from the string's start; the kernel's reads
// past them are taken as NUL.
func matchString(p *Pred, str []byte, n int) bool {
	pat := p.Pattern
	switch p.Match {
	case MatchFull:
		if n == 0 {
			return cstrncmp(str, pat, -1)
		}
		return n >= len(pat) && cstrncmp(str, pat, n)
	case MatchFront:
		if n != 0 && n < len(pat) {
			return false
		}
		return cstrncmp(str, pat, len(pat))
	case MatchMiddle:
		if n == 0 {
			return strings.Contains(cstring(str), pat)
		}
		// strnstr: memcmp over the first n bytes, NULs and all.
		return bytes.Contains(window(str, n), []byte(pat))
	case MatchEnd:
		// regex_match_end takes the string to be n-1 bytes long: on a
		// fixed array that is the array's end, not the string's.
		l := n - 1
		return l >= len(pat) && string(window(str, l)[l-len(pat):]) == pat
	case MatchGlob:
		return globMatch(pat, str, n)
	}
	return false
}

// window returns str's first n bytes, NUL-padded where str is shorter.
func window(str []byte, n int) []byte {
	if len(str) >= n {
		return str[:n]
	}
	w := make([]byte, n)
	copy(w, str)
	return w
}

// cstring returns str up to its first NUL.
func cstring(str []byte) string {
	if i := bytes.IndexByte(str, 0); i >= 0 {
		return string(str[:i])
	}
	return string(str)
}

// cstrncmp reports whether strncmp(str, pat, n) == 0, pat being a C
// string (NUL after its end) and n < 0 meaning strcmp.
func cstrncmp(str []byte, pat string, n int) bool {
	for k := 0; n < 0 || k < n; k++ {
		a, b := byteAt(str, k), at(pat, k)
		if a != b {
			return false
		}
		if a == 0 {
			return true
		}
	}
	return true
}

// byteAt returns str[k], or 0 past its end.
func byteAt(str []byte, k int) byte {
	if k < len(str) {
		return str[k]
	}
	return 0
}

// globMatch reports whether str, ending at its first NUL or after n
// bytes (n > 0; 0 means the empty string, as glob_match_len(pat, str, 0)
// has it), matches pat as lib/glob.c's glob_match_str matches: * any run,
// ? any byte, [a-z] and [!a-z] classes (a ']' first is literal), \ quotes
// the next byte; a malformed class is a literal '['.
func globMatch(pat string, str []byte, n int) bool {
	s := window(str, n)
	if i := bytes.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	backPat, backStr := -1, -1
	pi, si := 0, 0
	for {
		c, d := byteAt(s, si), at(pat, pi)
		pi++
		si++
		switch d {
		case '?':
			if c == 0 {
				return false
			}
			continue
		case '*':
			if at(pat, pi) == 0 {
				return true
			}
			si--
			backPat, backStr = pi, si
			continue
		case '[':
			if c == 0 {
				return false
			}
			if end, match, ok := globClass(pat, pi, c); ok {
				if match {
					pi = end
					continue
				}
				goto backtrack
			}
		case '\\':
			d = at(pat, pi)
			pi++
		}
		if c == d {
			if d == 0 {
				return true
			}
			continue
		}
	backtrack:
		if c == 0 || backPat < 0 {
			return false
		}
		pi = backPat
		backStr++
		si = backStr
	}
}

// globClass matches byte c against the class that starts at pat[pi]
// (after its '['). It returns the offset past the class and whether c
// is in it; ok is false for a malformed class (no closing ']' before the
// pattern's end), which glob_match takes as a literal '['.
func globClass(pat string, pi int, c byte) (end int, match, ok bool) {
	inverted := at(pat, pi) == '!'
	cl := pi
	if inverted {
		cl++
	}
	a := at(pat, cl)
	cl++
	for {
		b := a
		if a == 0 {
			return 0, false, false
		}
		if at(pat, cl) == '-' && at(pat, cl+1) != ']' {
			b = at(pat, cl+1)
			if b == 0 {
				return 0, false, false
			}
			cl += 2
		}
		if a <= c && c <= b {
			match = true
		}
		a = at(pat, cl)
		cl++
		if a == ']' {
			break
		}
	}
	return cl, match != inverted, true
}
