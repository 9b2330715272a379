package kallsyms

import (
	"errors"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
)

func TestParse(t *testing.T) {
	text := `ffffffff81000000 T _stext
ffffffff81000010 t a_func
ffffffff81000010 t a_alias
ffffffff81000040 T b_func	[some_mod]
garbage
`
	tab, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if s, e, ok := tab.Lookup("a_func"); !ok || s != 0xffffffff81000010 || e != 0xffffffff81000040 {
		t.Errorf("a_func: %#x %#x %v", s, e, ok)
	}
	if s, e, ok := tab.Lookup("b_func"); !ok || s != 0xffffffff81000040 || e != s+1 {
		t.Errorf("b_func, the last: %#x %#x %v", s, e, ok)
	}
	if _, _, ok := tab.Lookup("nothing"); ok {
		t.Error("nothing found")
	}
	if s, e, ok := tab.Containing(0xffffffff81000020); !ok || s != 0xffffffff81000010 || e != 0xffffffff81000040 {
		t.Errorf("containing: %#x %#x %v", s, e, ok)
	}
	if _, _, ok := tab.Containing(0x10); ok {
		t.Error("an address below every symbol was found")
	}
	if n, off, ok := tab.Name(0xffffffff81000005); !ok || n != "_stext" || off != 5 {
		t.Errorf("name: %q %d %v", n, off, ok)
	}
	if _, err := Parse(strings.NewReader("0000000000000000 T x\n")); !errors.Is(err, ErrHidden) {
		t.Errorf("hidden addresses: %v", err)
	}
}

// TestRead reads the running kernel's table, which root sees.
func TestRead(t *testing.T) {
	testenv.RequireRoot(t)
	tab, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	s, e, ok := tab.Lookup("schedule")
	if !ok || e <= s {
		t.Fatalf("schedule: %#x %#x %v", s, e, ok)
	}
	if n, _, ok := tab.Name(s + 1); !ok || n == "" {
		t.Errorf("the symbol holding schedule+1: %q", n)
	}
}
