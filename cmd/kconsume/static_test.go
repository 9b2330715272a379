package main

import (
	"debug/elf"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
)

// TestBinaryIsStatic checks that the kconsume the tests run (built as
// make build builds it) needs no dynamic loader: it must run in VM images
// and initramfs guests without the host's libc.
func TestBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(testenv.KconsumeBin(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("kconsume is dynamically linked (%v): build it with CGO_ENABLED=0", p.Type)
		}
	}
}
