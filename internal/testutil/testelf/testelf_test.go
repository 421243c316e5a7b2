package testelf

import (
	"bytes"
	"debug/elf"
	"testing"
)

// TestFileIsELF: the synthetic files are ELF files as the standard library reads them.
func TestFileIsELF(t *testing.T) {
	b := File(1, Spec{Interp: "/lib64/ld-linux-x86-64.so.2", Needed: []string{"libc.so.6"}, Runpath: "$ORIGIN", Pad: 100})
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Progs) != 3 || f.Progs[0].Type != elf.PT_INTERP || f.Progs[2].Type != elf.PT_DYNAMIC {
		t.Fatalf("program headers %v", f.Progs)
	}
}
