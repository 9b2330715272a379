package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/recorder/hot"
)

// TestCurrent: the committed programs are what the table generates
// (make generate rewrites them).
func TestCurrent(t *testing.T) {
	want, err := generate(hot.Events)
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range want {
		got, err := os.ReadFile(filepath.Join("../../../../bpf/kc", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, src) {
			t.Errorf("bpf/kc/%s is not what the table generates: run make generate", name)
		}
	}
}

// TestRefused: an entry the programs could not hold is refused with the
// event named: a record larger than the stack's, an argument without a
// name, a char array off a 4-byte boundary.
func TestRefused(t *testing.T) {
	big := make([]hot.Field, 9)
	for i := range big {
		big[i] = hot.Field{Name: string(rune('a' + i)), Type: "u64", Expr: "0"}
	}
	for name, l := range map[string]hot.Layout{
		"large":   {Args: []string{"int x"}, Fields: big},
		"noname":  {Args: []string{"int"}, Fields: []hot.Field{{Name: "x", Type: "int", Expr: "0"}}},
		"oddcomm": {Args: []string{"int x"}, Fields: []hot.Field{{Name: "b", Type: "bool", Expr: "0"}, {Name: "comm", Type: "char[16]", Expr: "0"}}},
	} {
		_, err := generate([]hot.Event{{System: "s", Name: name, Layouts: []hot.Layout{l}}})
		if err == nil || !strings.Contains(err.Error(), "s:"+name) {
			t.Errorf("%s: %v, want an error naming s:%s", name, err, name)
		}
	}
}
