package layer

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// Tests of prediction (predict.go): the files an ELF file's loader opens are fetched once
// its header is read, across the image's layers, and nothing else; and the ELF reader is
// bounded on hostile files.

// elfSpec describes a synthetic ELF64 little-endian x86-64 file (elfFile).
type elfSpec struct {
	interp  string
	needed  []string
	runpath string
	pad     int      // random bytes between the string table and the dynamic section
	zeros   int      // zero bytes after them
	static  bool     // no dynamic section
	typ     elf.Type // ET_DYN when zero
}

// elfFile builds the file of s: header, program headers (PT_LOAD of the whole file at
// address 0, PT_INTERP when s has an interpreter, PT_DYNAMIC), the interpreter path, the
// dynamic string table, s.pad bytes of random content and s.zeros of zeros, then the dynamic
// section.
func elfFile(seed uint64, s elfSpec) []byte {
	le := binary.LittleEndian
	nph := 1
	if s.interp != "" {
		nph++
	}
	if !s.static {
		nph++
	}
	body := 64 + 56*nph
	interpOff := body
	if s.interp != "" {
		body += len(s.interp) + 1
	}
	strOff := body
	strtab := []byte{0}
	var names []uint64
	for _, n := range s.needed {
		names = append(names, uint64(len(strtab)))
		strtab = append(append(strtab, n...), 0)
	}
	runOff := uint64(len(strtab))
	if s.runpath != "" {
		strtab = append(append(strtab, s.runpath...), 0)
	}
	body += len(strtab)
	pad := append(randomBytes(s.pad, seed), make([]byte, s.zeros)...)
	body += len(pad)
	dynOff := body
	var dyn []byte
	entry := func(tag elf.DynTag, v uint64) { dyn = le.AppendUint64(le.AppendUint64(dyn, uint64(tag)), v) }
	if !s.static {
		for _, o := range names {
			entry(elf.DT_NEEDED, o)
		}
		if s.runpath != "" {
			entry(elf.DT_RUNPATH, runOff)
		}
		entry(elf.DT_STRTAB, uint64(strOff))
		entry(elf.DT_STRSZ, uint64(len(strtab)))
		entry(elf.DT_NULL, 0)
	}
	size := body + len(dyn)

	b := make([]byte, 64, size)
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), 1
	typ := s.typ
	if typ == 0 {
		typ = elf.ET_DYN
	}
	le.PutUint16(b[16:], uint16(typ))
	le.PutUint16(b[18:], uint16(elf.EM_X86_64))
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[32:], 64) // e_phoff
	le.PutUint16(b[52:], 64) // e_ehsize
	le.PutUint16(b[54:], 56) // e_phentsize
	le.PutUint16(b[56:], uint16(nph))
	phdr := func(typ elf.ProgType, off, n int) {
		p := make([]byte, 56)
		le.PutUint32(p, uint32(typ))
		le.PutUint32(p[4:], uint32(elf.PF_R))
		le.PutUint64(p[8:], uint64(off))
		le.PutUint64(p[16:], uint64(off))
		le.PutUint64(p[24:], uint64(off))
		le.PutUint64(p[32:], uint64(n))
		le.PutUint64(p[40:], uint64(n))
		le.PutUint64(p[48:], 1)
		b = append(b, p...)
	}
	if s.interp != "" {
		phdr(elf.PT_INTERP, interpOff, len(s.interp)+1)
	}
	phdr(elf.PT_LOAD, 0, size)
	if !s.static {
		phdr(elf.PT_DYNAMIC, dynOff, len(dyn))
	}
	if s.interp != "" {
		b = append(append(b, s.interp...), 0)
	}
	b = append(b, strtab...)
	b = append(b, pad...)
	return append(b, dyn...)
}

// TestELFFileIsELF: the synthetic files are ELF files as the standard library reads them.
func TestELFFileIsELF(t *testing.T) {
	b := elfFile(1, elfSpec{interp: "/lib64/ld-linux-x86-64.so.2", needed: []string{"libc.so.6"}, runpath: "$ORIGIN", pad: 100})
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Progs) != 3 || f.Progs[0].Type != elf.PT_INTERP || f.Progs[2].Type != elf.PT_DYNAMIC {
		t.Fatalf("program headers %v", f.Progs)
	}
}

// TestReadELFDeps reads synthetic files, and the system's own ELF files compared with what
// debug/elf reads of them (their section headers).
func TestReadELFDeps(t *testing.T) {
	spec := elfSpec{interp: "/lib64/ld-linux-x86-64.so.2", needed: []string{"libz.so.1", "libc.so.6"}, runpath: "$ORIGIN/../lib:/opt/x", pad: 5000}
	b := elfFile(1, spec)
	d, err := readELFDeps(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if d.interp != spec.interp || !slices.Equal(d.needed, spec.needed) || !slices.Equal(d.runpath, []string{"$ORIGIN/../lib", "/opt/x"}) || d.machine != elf.EM_X86_64 {
		t.Fatalf("%+v", d)
	}
	b = elfFile(2, elfSpec{static: true})
	if d, err := readELFDeps(bytes.NewReader(b), int64(len(b))); err != nil || d.interp != "" || len(d.needed) != 0 {
		t.Fatalf("static: %+v, %v", d, err)
	}
	if _, err := readELFDeps(strings.NewReader("#!/bin/sh\n"), 10); !errors.Is(err, errNotELF) {
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
		d, err := readELFDeps(f, st.Size())
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if !slices.Equal(d.needed, libs) || d.interp != interp {
			t.Errorf("%s: needed %q interp %q; debug/elf: %q %q", p, d.needed, d.interp, libs, interp)
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

// maxELFRead bounds what readELFDeps reads of any file: the identification and header, the
// program headers, an interpreter path, the dynamic section and a name per string taken.
const maxELFRead = elf.EI_NIDENT + 64 + maxPhdrs*56 + maxPathLen + maxDynamic + (maxNeeded+1)*maxName

// TestReadELFDepsHostile: malformed files are errors or read as far as they hold, never a
// panic, and what is read and kept is bounded.
func TestReadELFDepsHostile(t *testing.T) {
	good := elfFile(1, elfSpec{needed: []string{"liba.so"}, pad: 10})
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
		"unterminated name":   elfFile(3, elfSpec{needed: []string{strings.Repeat("n", 3*maxName)}}),
		"too many needed":     elfFile(4, elfSpec{needed: many}),
		"interp unterminated": elfFile(5, elfSpec{interp: strings.Repeat("/x", 100), needed: []string{"a"}}),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			r := &countingReaderAt{r: bytes.NewReader(b)}
			d, _ := readELFDeps(r, int64(len(b)))
			if len(d.needed) > maxNeeded || len(d.runpath) > maxName || len(d.interp) > maxPathLen {
				t.Fatalf("kept %d names, %d run path entries, interp of %d bytes", len(d.needed), len(d.runpath), len(d.interp))
			}
			for _, n := range d.needed {
				if len(n) >= maxName {
					t.Fatalf("a name of %d bytes", len(n))
				}
			}
			if r.n > maxELFRead {
				t.Fatalf("read %d bytes", r.n)
			}
		})
	}
	if d, _ := readELFDeps(bytes.NewReader(cases["too many needed"]), int64(len(cases["too many needed"]))); len(d.needed) != maxNeeded {
		t.Errorf("%d names kept of 200, want %d", len(d.needed), maxNeeded)
	}
}

// FuzzReadELFDeps: no input makes readELFDeps panic, keep more than its bounds, or read
// more than maxELFRead.
func FuzzReadELFDeps(f *testing.F) {
	f.Add(elfFile(1, elfSpec{interp: "/lib/ld.so", needed: []string{"liba.so", "libb.so.1"}, runpath: "$ORIGIN:/x"}))
	f.Add(elfFile(2, elfSpec{static: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &countingReaderAt{r: bytes.NewReader(b)}
		d, _ := readELFDeps(r, int64(len(b)))
		if len(d.needed) > maxNeeded || r.n > maxELFRead || r.calls > 5+maxNeeded+1 {
			t.Fatalf("kept %d names, read %d bytes in %d reads", len(d.needed), r.n, r.calls)
		}
	})
}

// predictLayer builds an eStargz layer of entries, in 64 KiB chunks.
func predictLayer(t *testing.T, name string, es []testlayer.Entry) testlayer.Fixture {
	t.Helper()
	fx, err := testlayer.BuildEStargz(name, testlayer.Build(es), estargzChunkSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

func regEntry(name string, data []byte) testlayer.Entry {
	return testlayer.Entry{Header: tarFile(name, int64(len(data))), Data: data}
}

func linkEntry(name, target string) testlayer.Entry {
	return testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: testlayer.Epoch}}
}

// fetchedFiles returns the paths of l whose first chunk a logged fetch of its blob fetched.
func fetchedFiles(l *Layer, log []fetchEvent) []string {
	first := map[int64]string{}
	x := l.Index()
	for id := chunked.EntryID(0); int(id) < x.Len(); id++ {
		if e := x.Meta(id); e.Type == chunked.TypeReg && e.Inode == id && x.NumChunks(id) > 0 {
			c, _ := x.Chunk(id, 0)
			first[c.Offset] = x.Path(id)
		}
	}
	var out []string
	for _, ev := range log {
		if ev.blob != l.Digest() {
			continue
		}
		for _, r := range ev.ranges {
			if p, ok := first[r.Offset]; ok && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestPredictLoadedFiles: executing a program fetches, without any read, the program whole,
// its interpreter and the libraries it names, whole too (found through its
// run path, symlinks and the merged-/usr links of the image's lower layer), and theirs in
// turn; a name found nowhere is skipped; a read of a shared object, not of its start, predicts
// nothing; nothing of a layer of another image is fetched, and none of it counts as the
// workload's reads or enters a profile. With read-ahead off, nothing is predicted.
func TestPredictLoadedFiles(t *testing.T) {
	const lib = "usr/lib/x86_64-linux-gnu/"
	base := []testlayer.Entry{
		regEntry(lib+"libonlydata.so", elfFile(10, elfSpec{pad: 20 << 10})), // first in the blob: no read-ahead reaches it
		regEntry(lib+"libc.so.6", elfFile(11, elfSpec{pad: 150 << 10})),
		regEntry(lib+"libz.so.1.2.13", elfFile(12, elfSpec{needed: []string{"libc.so.6"}, pad: 30 << 10})),
		linkEntry(lib+"libz.so.1", "libz.so.1.2.13"),
		regEntry(lib+"ld-linux-x86-64.so.2", elfFile(13, elfSpec{static: true, pad: 10 << 10})),
		linkEntry("lib", "usr/lib"),
		linkEntry("lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
	}
	app := []testlayer.Entry{
		regEntry("usr/lib/app/libfoo.so", elfFile(20, elfSpec{needed: []string{"libc.so.6", "libnowhere.so.9"}, pad: 40 << 10})),
		regEntry("usr/bin/prog", elfFile(21, elfSpec{
			interp: "/lib64/ld-linux-x86-64.so.2", needed: []string{"libfoo.so", "libz.so.1", "libmissing.so.3"},
			runpath: "$ORIGIN/../lib/app", pad: 300 << 10,
		})),
		regEntry("usr/lib/app/data.so", elfFile(22, elfSpec{needed: []string{"libonlydata.so"}, pad: 10 << 10})),
	}
	decoy := []testlayer.Entry{regEntry(lib+"libz.so.1", elfFile(30, elfSpec{pad: 10 << 10}))}
	bf, af, df := predictLayer(t, "base", base), predictLayer(t, "app", app), predictLayer(t, "decoy", decoy)

	for _, readAhead := range []int64{defaultReadAhead, 0} {
		e := newProfEnv(t)
		e.reg.push(profRepo+":v1", bf, af)
		e.reg.push("registry.example/other:v1", bf, df)
		m, _ := e.start(withPrefetch(false), withReadAhead(readAhead), withProfileWindow(time.Second))
		lb := lookupOK(t, m, profRepo+":v1", profKey(bf))
		la := lookupOK(t, m, profRepo+":v1", profKey(af))
		ld := lookupOK(t, m, "registry.example/other:v1", profKey(df))
		lookupOK(t, m, "registry.example/other:v1", profKey(bf))
		e.reg.log(true)

		// Read first, not from its start (nothing predicted: TestPredictLoadedLibrary), then
		// executed.
		if _, err := la.ReadFile(t.Context(), fileOf(t, la, "usr/lib/app/data.so"), make([]byte, 4096), 4096); err != nil {
			t.Fatal(err)
		}
		la.Executing(fileOf(t, la, "usr/bin/prog"))
		wantBase := []string{lib + "ld-linux-x86-64.so.2", lib + "libc.so.6", lib + "libz.so.1.2.13"}
		if readAhead == 0 {
			time.Sleep(200 * time.Millisecond)
			if got := fetchedFiles(lb, e.reg.log(false)); len(got) != 0 {
				t.Fatalf("read-ahead off: fetched %q", got)
			}
			continue
		}
		waitFor(t, "the predicted files", func() bool {
			log := e.reg.log(false)
			return slices.Equal(fetchedFiles(lb, log), wantBase) && slices.Contains(fetchedFiles(la, log), "usr/lib/app/libfoo.so")
		})
		time.Sleep(100 * time.Millisecond) // anything more would come now
		log := e.reg.log(false)
		if got := fetchedFiles(lb, log); !slices.Equal(got, wantBase) {
			t.Errorf("fetched of the lower layer: %q, want %q", got, wantBase)
		}
		// Each predicted file is fetched whole (each under maxPredictWhole).
		fetched := map[int64]bool{}
		for _, ev := range log {
			for _, r := range ev.ranges {
				fetched[r.Offset] = true
			}
		}
		for _, f := range []struct {
			l *Layer
			p string
		}{{lb, lib + "libc.so.6"}, {lb, lib + "libz.so.1.2.13"}, {la, "usr/bin/prog"}, {la, "usr/lib/app/libfoo.so"}} {
			cs := f.l.Index().Chunks(fileOf(t, f.l, f.p))
			if len(cs) < 2 && (f.p == "usr/bin/prog" || f.p == lib+"libc.so.6") {
				t.Fatalf("%s: %d chunks", f.p, len(cs))
			}
			for i, c := range cs {
				if !fetched[c.Offset] {
					t.Errorf("%s: chunk %d of %d not fetched", f.p, i, len(cs))
				}
			}
		}
		for _, ev := range log {
			if ev.blob == df.Desc.Digest {
				t.Errorf("fetched from the other image's layer %s", ld.Digest())
			}
		}
		// The loader's reads find the libraries in the cache: no fetch.
		e.reg.log(true)
		readPaths(t, lb, lib+"libc.so.6", lib+"libz.so.1.2.13")
		readPaths(t, la, "usr/lib/app/libfoo.so")
		if log := e.reg.log(false); len(log) != 0 {
			t.Errorf("%d fetches for the predicted files' reads", len(log))
		}
		waitFor(t, "the recordings", func() bool { return la.Status().ProfileRecorded == 2 && lb.Status().ProfileRecorded == 2 })
		if s := lb.Status(); s.ReadChunks > int64(lb.Index().NumChunks(fileOf(t, lb, lib+"libc.so.6"))+lb.Index().NumChunks(fileOf(t, lb, lib+"libz.so.1.2.13"))) {
			t.Errorf("the lower layer counts %d chunks read", s.ReadChunks)
		}
	}
}

// TestPredictLoadedLibrary: a runtime's read of the start of a shared object (a library a
// program loads itself, dlopen) predicts it as an execution does: the file whole and the
// libraries it names, without a read of them; a read elsewhere in it, a read of the start of an
// ELF file of another type (an object a linker reads), and any read while the layer replays a
// startup profile (which knows what the start loads) predict nothing.
func TestPredictLoadedLibrary(t *testing.T) {
	const dir = "usr/lib/app/"
	fx := predictLayer(t, "dlopen", []testlayer.Entry{
		// Before the files read in the blob: no read-ahead reaches them.
		regEntry(dir+"libdep.so", elfFile(50, elfSpec{pad: 150 << 10})),
		regEntry(dir+"libother.so", elfFile(51, elfSpec{pad: 10 << 10})),
		regEntry(dir+"tool.o", elfFile(52, elfSpec{needed: []string{"libother.so"}, runpath: "$ORIGIN", typ: elf.ET_REL, pad: 10 << 10})),
		regEntry(dir+"plugin.so", elfFile(53, elfSpec{needed: []string{"libdep.so"}, runpath: "$ORIGIN", pad: 200 << 10})),
	})
	e := newProfEnv(t)
	e.reg.push(profRepo+":v1", fx)
	m, _ := e.start(withPrefetch(false))
	l := lookupOK(t, m, profRepo+":v1", profKey(fx))
	e.reg.log(true)
	read := func(p string, off int64) {
		t.Helper()
		if _, err := l.ReadFile(t.Context(), fileOf(t, l, p), make([]byte, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	replaying := func(on bool) {
		l.prefetch.mu.Lock()
		l.prefetch.profileFiles = map[bool]int{true: 1}[on]
		l.prefetch.mu.Unlock()
	}
	read(dir+"tool.o", 0)
	read(dir+"plugin.so", 100<<10)
	replaying(true)
	read(dir+"plugin.so", 0)
	replaying(false)
	time.Sleep(200 * time.Millisecond) // a prediction would fetch now
	if got := fetchedFiles(l, e.reg.log(false)); slices.Contains(got, dir+"libother.so") || slices.Contains(got, dir+"libdep.so") {
		t.Fatalf("fetched %q before the shared object's start was read outside a replay", got)
	}

	e.reg.log(true)
	read(dir+"plugin.so", 0)
	fetched := map[int64]bool{}
	whole := func(p string) bool {
		for _, ev := range e.reg.log(false) {
			for _, r := range ev.ranges {
				fetched[r.Offset] = true
			}
		}
		for _, c := range l.Index().Chunks(fileOf(t, l, p)) {
			if !fetched[c.Offset] {
				return false
			}
		}
		return true
	}
	complete := func(p string) bool { return l.env.cache.Has(l.Index().Meta(fileOf(t, l, p)).Digest) }
	waitFor(t, "the library the shared object names, whole", func() bool { return whole(dir + "libdep.so") })
	waitFor(t, "the shared object, whole", func() bool { return complete(dir + "plugin.so") })
	if n := len(l.Index().Chunks(fileOf(t, l, dir+"libdep.so"))); n < 2 {
		t.Fatalf("libdep.so: %d chunks", n)
	}
	time.Sleep(100 * time.Millisecond) // anything more would come now
	if whole(dir + "libother.so") {
		t.Error("the object file's library was fetched")
	}
	// The library was fetched, not read: the reads counted are the plugin's and the object's.
	want := int64(0)
	for _, p := range []string{dir + "tool.o", dir + "plugin.so"} {
		want += int64(l.Index().NumChunks(fileOf(t, l, p)))
	}
	if s := l.Status(); s.ReadChunks > want {
		t.Errorf("%d chunks counted as read, at most %d", s.ReadChunks, want)
	}
}

// TestIsSharedObject: the header check that starts a library's prediction on a read.
func TestIsSharedObject(t *testing.T) {
	so := elfFile(60, elfSpec{})
	exe := elfFile(61, elfSpec{typ: elf.ET_EXEC})
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
		if got := isSharedObject(c.p); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestResolvePathBounded: symlink loops and chains of more than maxLinkHops resolve to
// nothing; ".." stops at the root.
func TestResolvePathBounded(t *testing.T) {
	es := []testlayer.Entry{
		linkEntry("a", "b"), linkEntry("b", "/a"),
		linkEntry("self", "./self/x"),
		linkEntry("up", "../../../../etc/f"),
		regEntry("etc/f", []byte("x")),
	}
	for i := range maxLinkHops + 2 { // chain/0 -> chain/1 -> ... -> etc/f
		target := fmt.Sprintf("/chain/%d", i+1)
		if i == maxLinkHops+1 {
			target = "/etc/f"
		}
		es = append(es, linkEntry(fmt.Sprintf("chain/%d", i), target))
	}
	fx := predictLayer(t, "loops", es)
	e := newProfEnv(t)
	e.reg.push(profRepo+":v1", fx)
	m, _ := e.start(withPrefetch(false))
	l := lookupOK(t, m, profRepo+":v1", profKey(fx))
	for p, want := range map[string]bool{"/a": false, "/self": false, "/up": true, "/chain/0": false, "/chain/2": true, "/etc/f": true, "/etc": false, "/": false, "": false} {
		if _, ok := resolvePath([]*Layer{l}, p); ok != want {
			t.Errorf("%q: %v, want %v", p, ok, want)
		}
	}
}

// TestPredictedBounded: a layer predicts at most maxPredicted files, each once, and nothing
// with read-ahead off.
func TestPredictedBounded(t *testing.T) {
	fx := predictLayer(t, "bound", []testlayer.Entry{regEntry("f", []byte("x"))})
	for _, readAhead := range []int64{defaultReadAhead, 0} {
		e := newProfEnv(t)
		e.reg.push(profRepo+":v1", fx)
		m, _ := e.start(withPrefetch(false), withReadAhead(readAhead))
		l := lookupOK(t, m, profRepo+":v1", profKey(fx))
		n := 0
		for id := range chunked.EntryID(maxPredicted + 50) {
			if l.markPredicted(id) {
				n++
			}
			if l.markPredicted(id) {
				t.Fatalf("file %d predicted twice", id)
			}
		}
		want := maxPredicted
		if readAhead == 0 {
			want = 0
		}
		if n != want {
			t.Errorf("read-ahead %d: %d files predicted, want %d", readAhead, n, want)
		}
	}
}

// TestPredictWholeInBatches: an executed file larger than a batch is fetched whole without
// any read, in requests of at most a batch of content; a file of more than maxPredictWhole is
// not fetched whole: the chunks of its header and dynamic section only (a prediction's reads
// fetch no read-ahead nor region). (At most wholeBatches at once:
// TestParallelBounded.)
func TestPredictWholeInBatches(t *testing.T) {
	big := elfFile(40, elfSpec{pad: 2*wholeBatch + wholeBatch/2})
	huge := elfFile(41, elfSpec{pad: 64 << 10, zeros: maxPredictWhole})
	fx := predictLayer(t, "whole", []testlayer.Entry{regEntry("usr/bin/big", big), regEntry("usr/bin/huge", huge)})
	e := newProfEnv(t)
	e.reg.push(profRepo+":v1", fx)
	m, _ := e.start(withPrefetch(false))
	l := lookupOK(t, m, profRepo+":v1", profKey(fx))
	x := l.Index()
	// fileEvents returns the logged fetches of chunks of file p and how much of its content
	// they fetched.
	fileEvents := func(p string) (evs []fetchEvent, content int64) {
		cs := x.Chunks(fileOf(t, l, p))
		byOffset := map[int64]int64{}
		for _, c := range cs {
			byOffset[c.Offset] = c.Size
		}
		for _, ev := range e.reg.log(false) {
			mine := false
			for _, r := range ev.ranges {
				for c := range byOffset {
					if c >= r.Offset && c < r.End() {
						mine = true
						content += byOffset[c]
						delete(byOffset, c)
					}
				}
			}
			if mine {
				evs = append(evs, ev)
			}
		}
		return evs, content
	}

	l.Executing(fileOf(t, l, "usr/bin/big"))
	waitFor(t, "the whole file", func() bool { _, n := fileEvents("usr/bin/big"); return n == int64(len(big)) })
	evs, _ := fileEvents("usr/bin/big")
	if len(evs) < 3 {
		t.Errorf("%d requests for %d bytes: want batches of at most %d", len(evs), len(big), wholeBatch)
	}
	for _, ev := range evs {
		var n int64
		for _, r := range ev.ranges {
			n += r.Length
		}
		if n > wholeBatch+wholeBatch/64 { // a batch of content, compressed (random bytes: a little more)
			t.Errorf("a request of %d bytes: over a batch", n)
		}
	}
	e.reg.log(true)
	l.Executing(fileOf(t, l, "usr/bin/huge"))
	dyn := x.ChunkAt(fileOf(t, l, "usr/bin/huge"), int64(len(huge)-1))
	waitFor(t, "the dynamic section", func() bool {
		c, _ := x.Chunk(fileOf(t, l, "usr/bin/huge"), dyn)
		for _, ev := range e.reg.log(false) {
			for _, r := range ev.ranges {
				if c.Offset >= r.Offset && c.Offset < r.End() {
					return true
				}
			}
		}
		return false
	})
	time.Sleep(100 * time.Millisecond) // anything more would come now
	// The chunks of its header, program headers and string table (the first) and of its
	// dynamic section (the last); nothing around them.
	if _, n := fileEvents("usr/bin/huge"); n > 2*64<<10 {
		t.Errorf("%d bytes of a file of %d fetched: more than its header and dynamic section", n, len(huge))
	}
}

// TestPredictHoldsBackground: a prediction's fetches are a container starting: the background
// fetch of the rest of the layer waits for the quiet period after the last of them, as it
// does after a demand fetch, however long the prediction takes; and it does not fetch again
// what the prediction fetched after its plan was made.
func TestPredictHoldsBackground(t *testing.T) {
	big := elfFile(42, elfSpec{pad: 2*wholeBatch + wholeBatch/2})
	es := []testlayer.Entry{regEntry("usr/bin/big", big)}
	for i := range 8 {
		es = append(es, regEntry(fmt.Sprintf("usr/share/data%d", i), bytes.Repeat([]byte{byte(i)}, 64<<10)))
	}
	fx := predictLayer(t, "held", es)
	e := newProfEnv(t)
	e.reg.push(profRepo+":v1", fx)
	e.reg.mu.Lock()
	e.reg.delay = 150 * time.Millisecond // the prediction's fetches take longer than the quiet period
	e.reg.mu.Unlock()
	const quiet = 250 * time.Millisecond // a stall this long between the lookup and the exec would start the background first
	m, _ := e.start(withPrefetchQuiet(quiet))
	l := lookupOK(t, m, profRepo+":v1", profKey(fx))
	l.Executing(fileOf(t, l, "usr/bin/big"))
	x := l.Index()
	bigChunks := map[int64]bool{}
	for _, c := range x.Chunks(fileOf(t, l, "usr/bin/big")) {
		bigChunks[c.Offset] = true
	}
	waitFor(t, "the background fetch", func() bool { return l.Status().State == StateComplete })
	var lastPredict time.Time
	var background []fetchEvent
	times := map[int64]int{}
	for _, ev := range e.reg.log(false) {
		predicted := false
		for _, r := range ev.ranges {
			predicted = predicted || bigChunks[r.Offset]
			times[r.Offset]++
		}
		if predicted && ev.end.After(lastPredict) {
			lastPredict = ev.end
		} else if !predicted {
			background = append(background, ev)
		}
	}
	for off := range bigChunks {
		if times[off] != 1 {
			t.Errorf("the chunk at %d of the predicted file fetched %d times: the background fetch fetched again what the prediction had", off, times[off])
			break
		}
	}
	if len(background) == 0 {
		t.Fatal("test premise: no background fetch logged")
	}
	for _, ev := range background {
		if ev.start.Before(lastPredict.Add(quiet * 3 / 4)) {
			t.Errorf("a background fetch started %v after the prediction's last fetch ended, within the quiet period of %v",
				ev.start.Sub(lastPredict), quiet)
		}
	}
}
