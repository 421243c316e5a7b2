package execdeps

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/internal/testutil/testelf"
)

// TestReadELF reads synthetic files, and the system's own ELF files compared with what
// debug/elf reads of them (their section headers).
func TestReadELF(t *testing.T) {
	spec := testelf.Spec{Interp: "/lib64/ld-linux-x86-64.so.2", Needed: []string{"libz.so.1", "libc.so.6"}, Runpath: "$ORIGIN/../lib:/opt/x", Pad: 5000}
	b := testelf.File(1, spec)
	d, err := ReadELF(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if d.Interp != spec.Interp || !slices.Equal(d.Needed, spec.Needed) || !slices.Equal(d.Runpath, []string{"$ORIGIN/../lib", "/opt/x"}) || d.Machine != elf.EM_X86_64 {
		t.Fatalf("%+v", d)
	}
	b = testelf.File(2, testelf.Spec{Static: true})
	if d, err := ReadELF(bytes.NewReader(b), int64(len(b))); err != nil || d.Interp != "" || len(d.Needed) != 0 {
		t.Fatalf("static: %+v, %v", d, err)
	}
	if _, err := ReadELF(strings.NewReader("#!/bin/sh\n"), 10); !errors.Is(err, ErrNotELF) {
		t.Fatalf("a script: %v", err)
	}

	compared := 0
	for _, p := range []string{"/bin/sh", "/usr/bin/ls", "/usr/bin/git", "/usr/bin/python3", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		st, _ := f.Stat()
		ef, err := elf.NewFile(f)
		if err != nil {
			f.Close()
			continue
		}
		libs, _ := ef.ImportedLibraries()
		interp := ""
		for _, pr := range ef.Progs {
			if pr.Type == elf.PT_INTERP {
				b, _ := io.ReadAll(pr.Open())
				interp = cString(b)
			}
		}
		d, err := ReadELF(f, st.Size())
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if !slices.Equal(d.Needed, libs) || d.Interp != interp {
			t.Errorf("%s: needed %q interp %q; debug/elf: %q %q", p, d.Needed, d.Interp, libs, interp)
		}
		compared++
	}
	t.Logf("%d of the system's ELF files compared with debug/elf", compared)
}

// countingReaderAt counts the bytes read of r.
type countingReaderAt struct {
	r     io.ReaderAt
	n     int64
	calls int
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	c.calls++
	n, err := c.r.ReadAt(p, off)
	c.n += int64(n)
	return n, err
}

// maxELFRead bounds what ReadELF reads of any file: the identification and header, the
// program headers, an interpreter path, the dynamic section and a name per string taken.
const maxELFRead = elf.EI_NIDENT + 64 + maxPhdrs*56 + MaxPath + maxDynamic + (maxNeeded+1)*maxName

// TestReadELFHostile: malformed files are errors or read as far as they hold, never a panic,
// and what is read and kept is bounded.
func TestReadELFHostile(t *testing.T) {
	good := testelf.File(1, testelf.Spec{Needed: []string{"liba.so"}, Pad: 10})
	le := binary.LittleEndian
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	many := make([]string, 200)
	for i := range many {
		many[i] = "lib" + strings.Repeat("x", i%7) + ".so"
	}
	cases := map[string][]byte{
		"truncated header":   good[:30],
		"big endian garbage": edit(func(b []byte) []byte { b[elf.EI_DATA] = 2; return b }),
		"bad class":          edit(func(b []byte) []byte { b[elf.EI_CLASS] = 9; return b }),
		"bad data":           edit(func(b []byte) []byte { b[elf.EI_DATA] = 7; return b }),
		"phnum huge":         edit(func(b []byte) []byte { le.PutUint16(b[56:], 0xffff); return b }),
		"phnum zero":         edit(func(b []byte) []byte { le.PutUint16(b[56:], 0); return b }),
		"phentsize small":    edit(func(b []byte) []byte { le.PutUint16(b[54:], 8); return b }),
		"phoff past the end": edit(func(b []byte) []byte { le.PutUint64(b[32:], 1<<62); return b }),
		"phoff wraps":        edit(func(b []byte) []byte { le.PutUint64(b[32:], ^uint64(0)-10); return b }),
		"dynamic past the end": edit(func(b []byte) []byte {
			le.PutUint64(b[64+56+8:], uint64(len(b))-4) // PT_DYNAMIC's offset
			return b
		}),
		"dynamic huge size": edit(func(b []byte) []byte { le.PutUint64(b[64+56+32:], 1<<40); return b }),
		"strtab nowhere": edit(func(b []byte) []byte {
			i := bytes.Index(b, le.AppendUint64(nil, uint64(elf.DT_STRTAB)))
			le.PutUint64(b[i+8:], 1<<50)
			return b
		}),
		"strsz huge": edit(func(b []byte) []byte {
			i := bytes.Index(b, le.AppendUint64(nil, uint64(elf.DT_STRSZ)))
			le.PutUint64(b[i+8:], 1<<60)
			return b
		}),
		"unterminated name":   testelf.File(3, testelf.Spec{Needed: []string{strings.Repeat("n", 3*maxName)}}),
		"too many needed":     testelf.File(4, testelf.Spec{Needed: many}),
		"interp unterminated": testelf.File(5, testelf.Spec{Interp: strings.Repeat("/x", 100), Needed: []string{"a"}}),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			r := &countingReaderAt{r: bytes.NewReader(b)}
			d, _ := ReadELF(r, int64(len(b)))
			if len(d.Needed) > maxNeeded || len(d.Runpath) > maxName || len(d.Interp) > MaxPath {
				t.Fatalf("kept %d names, %d run path entries, interp of %d bytes", len(d.Needed), len(d.Runpath), len(d.Interp))
			}
			for _, n := range d.Needed {
				if len(n) >= maxName {
					t.Fatalf("a name of %d bytes", len(n))
				}
			}
			if r.n > maxELFRead {
				t.Fatalf("read %d bytes", r.n)
			}
		})
	}
	if d, _ := ReadELF(bytes.NewReader(cases["too many needed"]), int64(len(cases["too many needed"]))); len(d.Needed) != maxNeeded {
		t.Errorf("%d names kept of 200, want %d", len(d.Needed), maxNeeded)
	}
}

// FuzzReadELF: no input makes ReadELF panic, keep more than its bounds, or read more than
// maxELFRead.
func FuzzReadELF(f *testing.F) {
	f.Add(testelf.File(1, testelf.Spec{Interp: "/lib/ld.so", Needed: []string{"liba.so", "libb.so.1"}, Runpath: "$ORIGIN:/x"}))
	f.Add(testelf.File(2, testelf.Spec{Static: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &countingReaderAt{r: bytes.NewReader(b)}
		d, _ := ReadELF(r, int64(len(b)))
		if len(d.Needed) > maxNeeded || r.n > maxELFRead || r.calls > 5+maxNeeded+1 {
			t.Fatalf("kept %d names, read %d bytes in %d reads", len(d.Needed), r.n, r.calls)
		}
	})
}

// TestIsSharedObject: the header check that starts a library's prediction on a read.
func TestIsSharedObject(t *testing.T) {
	so := testelf.File(60, testelf.Spec{})
	exe := testelf.File(61, testelf.Spec{Type: elf.ET_EXEC})
	be := slices.Clone(so)
	be[elf.EI_DATA] = byte(elf.ELFDATA2MSB)
	binary.BigEndian.PutUint16(be[16:], uint16(elf.ET_DYN))
	for _, c := range []struct {
		name string
		p    []byte
		want bool
	}{
		{"shared object", so, true},
		{"big-endian shared object", be, true},
		{"executable", exe, false},
		{"header cut short", so[:17], false},
		{"not ELF", []byte("#!/bin/sh\nexec true\n"), false},
		{"unknown data encoding", append([]byte(elf.ELFMAG), 2, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0), false},
	} {
		if got := IsSharedObject(c.p); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestShebang: a script's interpreter is the first word of its first line after "#!", within
// the kernel's 256 bytes; anything else names none.
func TestShebang(t *testing.T) {
	for _, c := range []struct {
		data, want string
		ok         bool
	}{
		{"#!/bin/sh\necho\n", "/bin/sh", true},
		{"#! \t/usr/bin/env python3\n", "/usr/bin/env", true},
		{"#!/bin/bash\t-e\n", "/bin/bash", true},
		{"#!sh\n", "sh", false},
		{"#!", "", false},
		{"\x7fELF", "", false},
		{"echo #!/bin/sh\n", "", false},
	} {
		got, ok := Shebang(readerAt(c.data), int64(len(c.data)))
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("%q: %q %v, want %q %v", c.data, got, ok, c.want, c.ok)
		}
	}
}

type readerAt string

func (r readerAt) ReadAt(p []byte, off int64) (int, error) {
	n := copy(p, r[off:])
	return n, nil
}

// TestSearchDirs: the run path first ($ORIGIN substituted, other substitutions and relative
// entries skipped, duplicates once), then the system's directories for the machine and class,
// at most MaxSearchDirs.
func TestSearchDirs(t *testing.T) {
	d := ELF{Machine: elf.EM_X86_64, Class: elf.ELFCLASS64, Runpath: []string{"$ORIGIN/../lib", "${ORIGIN}", "$LIB/x", "rel", "/usr/lib"}}
	want := []string{"/opt/app/lib", "/opt/app/bin", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/local/lib"}
	if got := d.SearchDirs("/opt/app/bin"); !slices.Equal(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
	d = ELF{Machine: elf.EM_MIPS, Class: elf.ELFCLASS32}
	if got, want := d.SearchDirs("/"), []string{"/lib", "/usr/lib", "/usr/local/lib"}; !slices.Equal(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
	for i := range 2 * MaxSearchDirs {
		d.Runpath = append(d.Runpath, "/r/"+string(rune('a'+i)))
	}
	if got := d.SearchDirs("/"); len(got) != MaxSearchDirs {
		t.Errorf("%d directories, want %d", len(got), MaxSearchDirs)
	}
}
