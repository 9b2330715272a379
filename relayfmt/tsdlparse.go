package relayfmt

import (
	"fmt"
	"strconv"
	"strings"
)

// tTypeKind is the kind of a type the metadata declares.
type tTypeKind uint8

const (
	ttInt tTypeKind = iota + 1
	ttString
	ttStruct
	ttEnum
	ttVariant
)

// tType is a type as the metadata declares it, before it is checked
// against this format's layouts.
type tType struct {
	kind     tTypeKind
	name     string // struct name, if any
	size     int    // integer bits
	align    int    // bits
	signed   bool
	encoding string
	base16   bool // base = 16: shown in hexadecimal
	mapClock string
	fields   []tField // struct, variant
	base     *tType   // enum
	tag      string   // variant
}

// tField is a field of a struct or variant, an array or a sequence when
// arrLen or seqLen says so.
type tField struct {
	name   string
	typ    *tType
	arrLen int    // > 0 for an array
	seqLen string // non-empty for a sequence
	line   int
}

// entry is one line of a block: key = value, or key := type.
type entry struct {
	key  string
	val  string // for '=' entries
	kind tokKind
	typ  *tType // for ':=' entries
	line int
}

// parser reads TSDL blocks and type declarations from a lexer. It stops
// at the first error, which it keeps in err.
type parser struct {
	lx      lexer
	tok     token
	err     error
	aliases map[string]*tType
	structs map[string]*tType
}

func (p *parser) next() {
	if p.err != nil {
		p.tok = token{kind: tkEOF}
		return
	}
	t, err := p.lx.scan()
	if err != nil {
		p.err = fmt.Errorf("metadata: %w", err)
		t = token{kind: tkEOF}
	}
	p.tok = t
}

func (p *parser) fail(msg string) {
	if p.err == nil {
		p.err = fmt.Errorf("metadata: line %d: %s", p.tok.line, msg)
	}
	p.tok = token{kind: tkEOF}
}

func (p *parser) is(punct string) bool { return p.tok.kind == tkPunct && p.tok.text == punct }

func (p *parser) expect(punct string) {
	if !p.is(punct) {
		p.fail(fmt.Sprintf("expected %q, found %q", punct, p.tok.text))
		return
	}
	p.next()
}

func (p *parser) ident() string {
	if p.tok.kind != tkIdent {
		p.fail(fmt.Sprintf("expected an identifier, found %q", p.tok.text))
		return ""
	}
	s := p.tok.text
	p.next()
	return s
}

// parseTypeName reads a type alias name, which may be several words
// ("unsigned long").
func (p *parser) parseTypeName() string {
	words := []string{p.ident()}
	for p.tok.kind == tkIdent {
		words = append(words, p.ident())
	}
	return strings.Join(words, " ")
}

func (p *parser) aliasPrefix(s string) bool {
	for k := range p.aliases {
		if k == s || strings.HasPrefix(k, s+" ") {
			return true
		}
	}
	return false
}

// parseBlock parses "{ entry; ... } ;" after a block keyword.
func (p *parser) parseBlock() []entry {
	p.expect("{")
	var es []entry
	for p.err == nil && !p.is("}") {
		e := entry{line: p.tok.line}
		e.key = p.ident()
		for p.is(".") {
			p.next()
			e.key += "." + p.ident()
		}
		switch {
		case p.is("="):
			p.next()
			e.val, e.kind = p.parseValue()
		case p.is(":="):
			p.next()
			e.typ = p.parseType(0)
		default:
			p.fail(fmt.Sprintf("expected = or := after %q", e.key))
		}
		p.expect(";")
		es = append(es, e)
	}
	p.expect("}")
	p.expect(";")
	return es
}

func (p *parser) parseValue() (string, tokKind) {
	t := p.tok
	switch t.kind {
	case tkNumber, tkString:
		p.next()
		return t.text, t.kind
	case tkIdent:
		s := p.ident()
		for p.is(".") {
			p.next()
			s += "." + p.ident()
		}
		return s, tkIdent
	}
	p.fail(fmt.Sprintf("expected a value, found %q", t.text))
	return "", tkEOF
}

// parseType parses a type specifier at nesting depth depth and returns
// it; on a syntax error it records the error in p.err and returns an
// empty type.
func (p *parser) parseType(depth int) *tType {
	if depth > maxDepth {
		p.fail("types nested too deeply")
		return &tType{}
	}
	if p.tok.kind != tkIdent {
		p.fail(fmt.Sprintf("expected a type, found %q", p.tok.text))
		return &tType{}
	}
	switch p.tok.text {
	case "integer":
		p.next()
		return p.parseInteger()
	case "string":
		p.next()
		return p.parseString()
	case "struct":
		p.next()
		return p.parseStruct(depth)
	case "enum":
		p.next()
		return p.parseEnum(depth)
	case "variant":
		p.next()
		t := &tType{kind: ttVariant}
		if p.is("<") {
			p.next()
			t.tag = p.ident()
			p.expect(">")
		}
		t.fields = p.parseFields(depth)
		return t
	}
	return p.parseAlias()
}

// parseString parses what follows the keyword string and returns a
// string type; its attributes (encoding = UTF8) are checked for syntax
// only.
func (p *parser) parseString() *tType {
	if p.is("{") {
		p.next()
		for p.err == nil && !p.is("}") {
			p.ident()
			p.expect("=")
			p.parseValue()
			p.expect(";")
		}
		p.expect("}")
	}
	return &tType{kind: ttString, align: 8}
}

// parseStruct parses what follows the keyword struct: a reference to a
// named struct defined before, or a definition, which it remembers under
// its name. It returns the struct type.
func (p *parser) parseStruct(depth int) *tType {
	t := &tType{kind: ttStruct, align: 8}
	if p.tok.kind == tkIdent {
		t.name = p.ident()
		if !p.is("{") {
			if s, ok := p.structs[t.name]; ok {
				return s
			}
			p.fail(fmt.Sprintf("unknown struct %q", t.name))
			return t
		}
	}
	t.fields = p.parseFields(depth)
	if p.tok.kind == tkIdent && p.tok.text == "align" {
		p.next()
		p.expect("(")
		t.align = p.number()
		p.expect(")")
	}
	if t.name != "" && p.err == nil {
		p.structs[t.name] = t
	}
	return t
}

// parseEnum parses what follows the keyword enum and returns an enum type
// of its integer base's size; its labels are checked for syntax only. It
// fails when the base is not an integer.
func (p *parser) parseEnum(depth int) *tType {
	t := &tType{kind: ttEnum}
	p.expect(":")
	t.base = p.parseType(depth + 1)
	p.expect("{")
	for p.err == nil && !p.is("}") {
		if p.tok.kind == tkString {
			p.next()
		} else {
			p.ident()
		}
		if p.is("=") {
			p.next()
			p.number()
			if p.is("...") {
				p.next()
				p.number()
			}
		}
		if !p.is(",") {
			break
		}
		p.next()
	}
	p.expect("}")
	if t.base.kind != ttInt {
		p.fail("enum base is not an integer")
	}
	t.size, t.align = t.base.size, t.base.align
	return t
}

// parseAlias parses the name of a type defined by typealias and returns
// that type; it fails for an unknown name.
func (p *parser) parseAlias() *tType {
	// An alias may be several words ("unsigned long"): take words while
	// they still begin a known alias, so the field name is left.
	name := p.ident()
	for p.tok.kind == tkIdent && p.aliasPrefix(name+" "+p.tok.text) {
		name += " " + p.ident()
	}
	if t, ok := p.aliases[name]; ok {
		return t
	}
	p.fail(fmt.Sprintf("unknown type %q", name))
	return &tType{}
}

func (p *parser) parseInteger() *tType {
	t := &tType{kind: ttInt}
	p.expect("{")
	for p.err == nil && !p.is("}") {
		key := p.ident()
		p.expect("=")
		val, _ := p.parseValue()
		p.expect(";")
		switch key {
		case "size":
			t.size = atoiOr(val, -1)
		case "align":
			t.align = atoiOr(val, -1)
		case "signed":
			t.signed = val == "true" || val == "TRUE" || val == "1"
		case "encoding":
			t.encoding = val
		case "base":
			t.base16 = val == "16" || val == "hex" || val == "hexadecimal" || val == "x" || val == "X" || val == "p"
		case "map":
			t.mapClock = val
		case "byte_order":
			if val != "le" && val != "native" {
				p.fail("only little-endian integers are supported")
			}
		}
	}
	p.expect("}")
	if t.size < 1 || t.size > 64 || t.align < 1 || t.align > 64 {
		p.fail("integer size or alignment out of range")
	}
	return t
}

func (p *parser) parseFields(depth int) []tField {
	p.expect("{")
	var fs []tField
	for p.err == nil && !p.is("}") {
		f := tField{line: p.tok.line}
		f.typ = p.parseType(depth + 1)
		f.name = p.ident()
		if p.is("[") {
			p.next()
			if p.tok.kind == tkNumber {
				f.arrLen = p.number()
				if f.arrLen < 1 {
					p.fail("array length out of range")
				}
			} else {
				f.seqLen = p.ident()
			}
			p.expect("]")
		}
		p.expect(";")
		fs = append(fs, f)
		if len(fs) > MaxFields+8 {
			p.fail("too many fields")
		}
	}
	p.expect("}")
	return fs
}

func (p *parser) number() int {
	if p.tok.kind != tkNumber {
		p.fail(fmt.Sprintf("expected a number, found %q", p.tok.text))
		return 0
	}
	n := atoiOr(p.tok.text, -1)
	if n < 0 {
		p.fail(fmt.Sprintf("bad number %q", p.tok.text))
		return 0
	}
	p.next()
	return n
}

// atoiOr parses a decimal, hex or octal integer that fits in 31 bits.
func atoiOr(s string, def int) int {
	n, err := strconv.ParseInt(s, 0, 32)
	if err != nil {
		return def
	}
	return int(n)
}
