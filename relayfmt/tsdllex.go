package relayfmt

import (
	"fmt"
	"strings"
)

// tokKind is the kind of a TSDL token.
type tokKind uint8

const (
	tkEOF tokKind = iota
	tkIdent
	tkNumber
	tkString
	tkPunct
)

// token is one token of TSDL text and the line it is on.
type token struct {
	kind tokKind
	text string
	line int
}

// lexer splits TSDL text into tokens, skipping blanks and comments and
// counting lines for error messages.
type lexer struct {
	src  []byte
	pos  int
	line int
}

func (l *lexer) scan() (token, error) {
	for l.pos < len(l.src) {
		c := l.src[l.pos]
		switch {
		case c == '\n':
			l.line++
			l.pos++
		case c == ' ' || c == '\t' || c == '\r':
			l.pos++
		case c == '/' && l.pos+1 < len(l.src) && l.src[l.pos+1] == '*':
			end := strings.Index(string(l.src[l.pos+2:]), "*/")
			if end < 0 {
				return token{}, fmt.Errorf("line %d: unterminated comment", l.line)
			}
			l.line += strings.Count(string(l.src[l.pos:l.pos+2+end]), "\n")
			l.pos += end + 4
		case c == '/' && l.pos+1 < len(l.src) && l.src[l.pos+1] == '/':
			for l.pos < len(l.src) && l.src[l.pos] != '\n' {
				l.pos++
			}
		default:
			return l.token()
		}
	}
	return token{kind: tkEOF, line: l.line}, nil
}

func (l *lexer) token() (token, error) {
	start, c := l.pos, l.src[l.pos]
	switch {
	case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		for l.pos < len(l.src) && isIdentByte(l.src[l.pos]) {
			l.pos++
		}
		return token{tkIdent, string(l.src[start:l.pos]), l.line}, nil
	case c >= '0' && c <= '9' || c == '-':
		l.pos++
		for l.pos < len(l.src) && (isIdentByte(l.src[l.pos])) {
			l.pos++
		}
		return token{tkNumber, string(l.src[start:l.pos]), l.line}, nil
	case c == '"':
		l.pos++
		var sb strings.Builder
		for l.pos < len(l.src) {
			ch := l.src[l.pos]
			l.pos++
			switch ch {
			case '"':
				return token{tkString, sb.String(), l.line}, nil
			case '\n':
				return token{}, fmt.Errorf("line %d: newline in string", l.line)
			case '\\':
				if l.pos >= len(l.src) {
					return token{}, fmt.Errorf("line %d: unterminated string", l.line)
				}
				sb.WriteByte(l.src[l.pos])
				l.pos++
			default:
				sb.WriteByte(ch)
			}
		}
		return token{}, fmt.Errorf("line %d: unterminated string", l.line)
	case c == ':' && l.pos+1 < len(l.src) && l.src[l.pos+1] == '=':
		l.pos += 2
		return token{tkPunct, ":=", l.line}, nil
	case c == '.' && l.pos+2 < len(l.src) && l.src[l.pos+1] == '.' && l.src[l.pos+2] == '.':
		l.pos += 3
		return token{tkPunct, "...", l.line}, nil
	case strings.IndexByte("{}[]()<>;=:,.", c) >= 0:
		l.pos++
		return token{tkPunct, string(c), l.line}, nil
	}
	return token{}, fmt.Errorf("line %d: unexpected character %q", l.line, c)
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
