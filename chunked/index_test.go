package chunked_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
)

func parseOK(t *testing.T, f chunked.Format, js string) *chunked.Index {
	t.Helper()
	x, err := chunked.Parse(context.Background(), testLayout(f), []byte(js), chunked.Limits{})
	if err != nil {
		t.Fatalf("Parse: %v\nTOC: %.500s", err, js)
	}
	checkIndex(t, x)
	if err := chunked.CompareWide(testLayout(f), []byte(js), chunked.Limits{}); err != nil {
		t.Errorf("compact index: %v", err)
	}
	return x
}

func lookup(t *testing.T, x *chunked.Index, p string) chunked.EntryID {
	t.Helper()
	id, ok := x.LookupPath(p)
	if !ok {
		t.Fatalf("LookupPath(%q) found nothing", p)
	}
	return id
}

func childNames(x *chunked.Index, dir chunked.EntryID) []string {
	var names []string
	for _, id := range x.Children(dir) {
		names = append(names, x.BaseName(id))
	}
	return names
}

func TestParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits chunked.Limits
		toc    string
	}{
		{"empty TOC", chunked.Limits{}, tocOf()},
		{"keys in any order", chunked.Limits{}, `{"entries":[],"version":1}`},
		{"whitespace around", chunked.Limits{}, " \n\t" + tocOf() + " \r\n"},
		{"unknown keys", chunked.Limits{}, `{"version":1,"x":{"y":[1,2]},"entries":[{"name":"a","type":"dir","future":true}]}`},
		{"null fields", chunked.Limits{}, tocOf(`{"name":"a","type":"dir","xattrs":null,"size":null,"digest":null}`)},
		{"name of 4096 bytes", chunked.Limits{}, tocOf(ent(longName(4096), "fifo"))},
		{"symlink target of 4096 bytes", chunked.Limits{}, tocOf(ent("s", "symlink", "linkName", longName(4096)))},
		{"exactly MaxEntries", chunked.Limits{MaxEntries: 3}, tocOf(file("f", 2, 0, "chunkSize", 1), chunk2("f", 1, 1, 10), ent("g", "dir"))},
		{"exactly MaxTOCSize", chunked.Limits{MaxTOCSize: int64(len(tocOf(ent("a", "dir"))))}, tocOf(ent("a", "dir"))},
		{"exactly MaxChunkSize", chunked.Limits{MaxChunkSize: 1024}, tocOf(file("f", 1024, 0), file("g", 1000, 0, "innerOffset", 24))},
		{"xattrs of exactly MaxXattrBytes", chunked.Limits{MaxXattrBytes: 16}, tocOf(ent("f", "fifo", "xattrs", map[string]string{"user.a": b64("0123456789")}))},
		{"name cleaned", chunked.Limits{}, tocOf(ent("./a//b/./c/", "dir"))},
		{"dots inside names", chunked.Limits{}, tocOf(ent("...", "dir"), ent("a..b", "fifo"), ent(".../..x", "fifo"))},
		{"root entry", chunked.Limits{}, tocOf(ent("./", "dir", "mode", 0o700))},
		{"zero-size file without offset", chunked.Limits{}, tocOf(ent("f", "reg"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), []byte(tc.toc), tc.limits)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			checkIndex(t, x)
		})
	}
}

func TestParsePayloadEnd(t *testing.T) {
	for _, f := range []chunked.Format{chunked.EStargz, chunked.StargzZstd, chunked.ZstdChunkedLegacy, chunked.ZstdChunked} {
		l := testLayout(f)
		if got, want := l.PayloadEnd(), payloadEnd(f); got != want {
			t.Errorf("%v: Layout.PayloadEnd = %d, want %d", f, got, want)
		}
		x := parseOK(t, f, tocOf())
		if got, want := x.PayloadEnd(), payloadEnd(f); got != want {
			t.Errorf("%v: Index.PayloadEnd = %d, want %d", f, got, want)
		}
		if x.Format() != f {
			t.Errorf("Format = %v, want %v", x.Format(), f)
		}
	}
	for _, off := range []int64{0, 7} {
		l := &chunked.Layout{Format: chunked.ZstdChunked, TOC: byterange.Range{Offset: off, Length: 1}}
		if _, err := chunked.Parse(context.Background(), l, []byte(tocOf()), chunked.Limits{}); !errors.Is(err, chunked.ErrInvalid) {
			t.Errorf("zstd TOC at offset %d: Parse = %v, want ErrInvalid", off, err)
		}
	}
}

func TestParseMetadata(t *testing.T) {
	js := `{"version":1,"tarSplitDigest":"` + dg('e') + `","entries":[` + strings.Join([]string{
		ent("f", "reg", "size", 3, "offset", 10, "chunkDigest", dg('1'), "digest", dg('2'),
			"mode", 0o100755, "uid", int64(math.MaxUint32), "gid", 7, "modtime", "2024-03-01T12:00:00.5Z",
			"accesstime", "2024-03-02T00:00:00Z", "changetime", "1970-01-01T00:00:00Z",
			"xattrs", map[string]string{"user.b": b64("2"), "user.a": b64("1"), "security.capability": b64("\x01\x00")}),
		ent("setuid", "fifo", "mode", 0o104755),
		ent("d", "dir", "mode", 0o41777),
		ent("c", "char", "devMajor", 1, "devMinor", 3, "mode", 0o20666),
		ent("b", "block", "devMajor", int64(math.MaxUint32), "devMinor", 0),
		ent("bigmode", "fifo", "mode", int64(1)<<40|0o640),
	}, ",") + `]}`
	x := parseOK(t, chunked.EStargz, js)
	if got := x.TarSplitDigest(); got != sumOf('e') {
		t.Errorf("TarSplitDigest = %v, want %v", got, dg('e'))
	}
	f := x.Entry(lookup(t, x, "f"))
	if f.Type != chunked.TypeReg || f.Size != 3 || f.Mode != 0o755 || f.UID != math.MaxUint32 || f.GID != 7 {
		t.Errorf("f = %+v", f)
	}
	if f.ModTimeSec != 1709294400 || f.ModTimeNsec != 5e8 {
		t.Errorf("f mtime = %d.%09d, want 1709294400.500000000", f.ModTimeSec, f.ModTimeNsec)
	}
	if f.Digest != sumOf('2') {
		t.Errorf("f digest = %v, want %v", f.Digest, dg('2'))
	}
	atime, ctime := x.TOCTimes(lookup(t, x, "f"))
	if atime != 1709337600e9 || ctime != 0 {
		t.Errorf("TOCTimes(f) = %d, %d; want 1709337600e9, 0 (the epoch means none)", atime, ctime)
	}
	if a, c := x.TOCTimes(x.Root()); a != 0 || c != 0 {
		t.Errorf("TOCTimes(root) = %d, %d; want 0, 0", a, c)
	}
	wantX := []chunked.Xattr{{"security.capability", "\x01\x00"}, {"user.a", "1"}, {"user.b", "2"}}
	if got := x.Xattrs(lookup(t, x, "f")); !slices.Equal(got, wantX) {
		t.Errorf("Xattrs(f) = %q, want %q", got, wantX)
	}
	for _, tc := range []struct {
		path string
		typ  chunked.Type
		mode uint32
		dev  [2]uint32
	}{
		{"setuid", chunked.TypeFifo, 0o4755, [2]uint32{}},
		{"d", chunked.TypeDir, 0o1777, [2]uint32{}},
		{"c", chunked.TypeChar, 0o666, [2]uint32{1, 3}},
		{"b", chunked.TypeBlock, 0, [2]uint32{math.MaxUint32, 0}},
		{"bigmode", chunked.TypeFifo, 0o640, [2]uint32{}},
	} {
		e := x.Entry(lookup(t, x, tc.path))
		if e.Type != tc.typ || e.Mode != tc.mode || e.DevMajor != tc.dev[0] || e.DevMinor != tc.dev[1] {
			t.Errorf("%s: type %v mode %#o dev %d,%d; want %v %#o %d,%d", tc.path, e.Type, e.Mode, e.DevMajor, e.DevMinor,
				tc.typ, tc.mode, tc.dev[0], tc.dev[1])
		}
	}
}

func TestParseShadowedEntries(t *testing.T) {
	js := tocOf(
		fileD("f", 5, 100, 'a'),
		ent("d", "dir", "mode", 0o700),
		fileD("f", 7, 200, 'b'),
		ent("d/x", "fifo"),
		ent("d", "dir", "mode", 0o750),
	)
	x := parseOK(t, chunked.EStargz, js)
	id := lookup(t, x, "f")
	if id != 2 {
		t.Fatalf("LookupPath(f) = %d, want the later entry 2", id)
	}
	if e := x.Entry(0); e.Flags&chunked.FlagShadowed == 0 || e.Visible() {
		t.Errorf("earlier f: flags %b, want FlagShadowed", e.Flags)
	}
	if e := x.Entry(2); e.Flags&chunked.FlagShadowed != 0 || !e.Visible() {
		t.Errorf("later f: flags %b, want visible", e.Flags)
	}
	for _, tc := range []struct {
		id   chunked.EntryID
		want chunked.Chunk
	}{
		{0, chunked.Chunk{Range: byterange.Range{Offset: 100, Length: 100}, Size: 5, Digest: sumOf('a')}},
		{2, chunked.Chunk{Range: byterange.Range{Offset: 200, Length: chunked.MaxSpan(7)}, Size: 7, Digest: sumOf('b')}},
	} {
		if got := x.Chunks(tc.id); !slices.Equal(got, []chunked.Chunk{tc.want}) {
			t.Errorf("Chunks(%d) = %+v, want [%+v]", tc.id, got, tc.want)
		}
	}
	d := lookup(t, x, "d")
	if d != 4 || x.Entry(d).Mode != 0o750 || x.Entry(1).Flags&chunked.FlagShadowed == 0 {
		t.Errorf("LookupPath(d) = %d (mode %#o), want the later entry 4", d, x.Entry(d).Mode)
	}
	if got := x.Entry(lookup(t, x, "d/x")).Parent; got != d {
		t.Errorf("parent of d/x = %d, want the later d %d", got, d)
	}
	if got, want := childNames(x, x.Root()), []string{"d", "f"}; !slices.Equal(got, want) {
		t.Errorf("Children(root) = %q, want %q", got, want)
	}
	if x.TOCLen() != 5 {
		t.Errorf("TOCLen = %d, want 5", x.TOCLen())
	}
}

func TestParseImplicitDirectories(t *testing.T) {
	x := parseOK(t, chunked.EStargz, tocOf(ent("a/b/c", "fifo"), ent("a/d", "dir", "mode", 0o700)))
	if x.TOCLen() != 2 || x.Len() != 5 {
		t.Errorf("TOCLen, Len = %d, %d; want 2, 5 (root, a, a/b implicit)", x.TOCLen(), x.Len())
	}
	for _, p := range []string{"", "a", "a/b"} {
		id := lookup(t, x, p)
		e := x.Entry(id)
		if int(id) < x.TOCLen() || e.Type != chunked.TypeDir || e.Mode != 0o755 || e.Flags&chunked.FlagImplicit == 0 {
			t.Errorf("%q: id %d type %v mode %#o flags %b; want an implicit 0755 directory", p, id, e.Type, e.Mode, e.Flags)
		}
	}
	if e := x.Entry(lookup(t, x, "a/d")); e.Flags&chunked.FlagImplicit != 0 || e.Mode != 0o700 {
		t.Errorf("a/d: mode %#o flags %b; want the listed directory", e.Mode, e.Flags)
	}
	for p, want := range map[string]uint32{"": 3, "a": 4, "a/b": 2, "a/d": 2, "a/b/c": 1} {
		if got := x.Entry(lookup(t, x, p)).Nlink; got != want {
			t.Errorf("Nlink(%q) = %d, want %d", p, got, want)
		}
	}
	if got := x.Entry(x.Root()).Parent; got != x.Root() {
		t.Errorf("root's parent = %d, want the root %d", got, x.Root())
	}
}

func TestParseWhiteoutsAndOpaque(t *testing.T) {
	x := parseOK(t, chunked.EStargz, tocOf(
		ent("d", "dir", "xattrs", map[string]string{"user.own": b64("v")}),
		ent("d/.wh.x", "reg"),
		ent("d/.wh..wh..opq", "reg"),
		ent("d/kept", "fifo"),
		ent(".wh.top", "reg"),
		ent("e/.wh..wh..opq", "reg"),
		ent("p/.wh..wh.plnk", "reg"),
		ent("p/real", "fifo"),
	))
	w := lookup(t, x, "d/x")
	if e := x.Entry(w); e.Flags&chunked.FlagWhiteout == 0 || e.Name != "d/.wh.x" {
		t.Errorf("d/x: name %q flags %b; want the whiteout d/.wh.x", e.Name, e.Flags)
	}
	if got := x.BaseName(w); got != "x" {
		t.Errorf("BaseName(whiteout) = %q, want x", got)
	}
	if got := x.Path(w); got != "d/x" {
		t.Errorf("Path(whiteout) = %q, want d/x", got)
	}
	if id, ok := x.Lookup(x.Root(), "top"); !ok || x.Entry(id).Flags&chunked.FlagWhiteout == 0 {
		t.Errorf("Lookup(root, top) = %d, %v; want the root-level whiteout", id, ok)
	}
	for _, p := range []string{"d/.wh.x", "d/.wh..wh..opq", ".wh.top", "e/.wh..wh..opq", "p/.wh..wh.plnk"} {
		if id, ok := x.LookupPath(p); ok {
			t.Errorf("LookupPath(%q) = %d, want nothing", p, id)
		}
	}
	d := lookup(t, x, "d")
	if got, want := childNames(x, d), []string{"kept", "x"}; !slices.Equal(got, want) {
		t.Errorf("Children(d) = %q, want %q", got, want)
	}
	want := []chunked.Xattr{{"user.own", "v"}, {"trusted.overlay.opaque", "y"}, {"user.overlay.opaque", "y"}}
	if got := x.Xattrs(d); !slices.Equal(got, want) {
		t.Errorf("Xattrs(d) = %q, want %q", got, want)
	}
	if got := x.TOCXattrs(d); !slices.Equal(got, want[:1]) {
		t.Errorf("TOCXattrs(d) = %q, want %q", got, want[:1])
	}
	if x.Entry(d).Flags&chunked.FlagOpaque == 0 {
		t.Errorf("d: flags %b, want FlagOpaque", x.Entry(d).Flags)
	}
	// An opaque marker alone makes its directory, implicitly.
	e := lookup(t, x, "e")
	if fl := x.Entry(e).Flags; fl&chunked.FlagOpaque == 0 || fl&chunked.FlagImplicit == 0 {
		t.Errorf("e: flags %b, want FlagOpaque|FlagImplicit", fl)
	}
	if got := x.Xattrs(e); !slices.Equal(got, want[1:]) {
		t.Errorf("Xattrs(e) = %q, want %q", got, want[1:])
	}
	if got := childNames(x, e); len(got) != 0 {
		t.Errorf("Children(e) = %q, want none", got)
	}
	if got, want := childNames(x, lookup(t, x, "p")), []string{"real"}; !slices.Equal(got, want) {
		t.Errorf("Children(p) = %q, want %q (.wh..wh.plnk is hidden)", got, want)
	}
	if x.Entry(x.Root()).Flags&chunked.FlagOpaque != 0 || len(x.Xattrs(x.Root())) != 0 {
		t.Errorf("root is opaque without a marker")
	}
	// Calling Xattrs again must not have changed the index.
	if got := x.TOCXattrs(d); !slices.Equal(got, want[:1]) {
		t.Errorf("TOCXattrs(d) after Xattrs = %q", got)
	}
}

func TestParseArtefacts(t *testing.T) {
	x := parseOK(t, chunked.EStargz, tocOf(
		file(".no.prefetch.landmark", 1, 0),
		file("a", 1, 50),
		file(".prefetch.landmark", 1, 1234),
		file("b", 1, 2000),
		file("stargz.index.json", 1, 3000),
		file("sub/stargz.index.json", 1, 4000),
		file("sub/.prefetch.landmark", 1, 5000),
	))
	if got := x.PrefetchEnd(); got != 1234 {
		t.Errorf("PrefetchEnd = %d, want 1234", got)
	}
	if got, want := childNames(x, x.Root()), []string{"a", "b", "sub"}; !slices.Equal(got, want) {
		t.Errorf("Children(root) = %q, want %q", got, want)
	}
	if got, want := childNames(x, lookup(t, x, "sub")), []string{".prefetch.landmark", "stargz.index.json"}; !slices.Equal(got, want) {
		t.Errorf("Children(sub) = %q, want %q (only root-level artefacts are hidden)", got, want)
	}
	for id := range x.TOCLen() {
		e := x.Entry(chunked.EntryID(id))
		hidden := !strings.Contains(e.Name, "/") && (e.Name == "stargz.index.json" || strings.HasSuffix(e.Name, ".landmark"))
		if got := e.Flags&chunked.FlagHidden != 0; got != hidden {
			t.Errorf("%q: hidden = %v, want %v", e.Name, got, hidden)
		}
	}
	// The hidden entries' chunks still delimit their neighbours'.
	if got := x.Chunks(lookup(t, x, "a"))[0].End(); got != 1234 {
		t.Errorf("a ends at %d, want 1234 (the landmark's offset)", got)
	}
	x = parseOK(t, chunked.EStargz, tocOf(file(".no.prefetch.landmark", 1, 0), file("a", 1, 50)))
	if got := x.PrefetchEnd(); got != -1 {
		t.Errorf("PrefetchEnd without a landmark = %d, want -1", got)
	}
}

func TestParseHardlinks(t *testing.T) {
	x := parseOK(t, chunked.EStargz, tocOf(
		file("f", 3, 100, "xattrs", map[string]string{"user.a": b64("1")}),
		ent("l1", "hardlink", "linkName", "f"),
		ent("d/l2", "hardlink", "linkName", "./f"),
		ent("l3", "hardlink", "linkName", "d/l2"),
		ent("s", "symlink", "linkName", "f"),
		ent("ls", "hardlink", "linkName", "s"),
		ent("fifo", "fifo"),
		ent("lf", "hardlink", "linkName", "fifo/"),
		ent("lone", "fifo"),
	))
	f := lookup(t, x, "f")
	for _, p := range []string{"f", "l1", "d/l2", "l3"} {
		id := lookup(t, x, p)
		if got := x.Entry(id).Inode; got != f {
			t.Errorf("Inode(%s) = %d, want f's %d", p, got, f)
		}
		if got := x.Chunks(id); len(got) != 1 || got[0].Offset != 100 || got[0].Size != 3 {
			t.Errorf("Chunks(%s) = %+v, want f's", p, got)
		}
		if got := x.Xattrs(id); len(got) != 1 || got[0] != (chunked.Xattr{Name: "user.a", Value: "1"}) {
			t.Errorf("Xattrs(%s) = %q, want f's", p, got)
		}
	}
	if got := x.Entry(f).Nlink; got != 4 {
		t.Errorf("Nlink(f) = %d, want 4 (f, l1, d/l2, l3)", got)
	}
	if got := x.Entry(lookup(t, x, "d/l2")).LinkName; got != "f" {
		t.Errorf("LinkName(d/l2) = %q, want the cleaned f", got)
	}
	for p, target := range map[string]string{"ls": "s", "lf": "fifo"} {
		t0 := lookup(t, x, target)
		if got := x.Entry(lookup(t, x, p)).Inode; got != t0 {
			t.Errorf("Inode(%s) = %d, want %s's %d", p, got, target, t0)
		}
		if got := x.Entry(t0).Nlink; got != 2 {
			t.Errorf("Nlink(%s) = %d, want 2", target, got)
		}
	}
	if got := x.Entry(lookup(t, x, "lone")).Nlink; got != 1 {
		t.Errorf("Nlink(lone) = %d, want 1", got)
	}
	if got := x.Entry(lookup(t, x, "d")).Nlink; got != 2 {
		t.Errorf("Nlink(d) = %d, want 2 (hardlinks are not subdirectories)", got)
	}
	// A file with two hardlinks has three links.
	x = parseOK(t, chunked.ZstdChunked, tocOf(
		ent("g", "reg", "size", 2, "offset", 10, "endOffset", 20, "digest", dg('9')),
		ent("h1", "hardlink", "linkName", "g"),
		ent("h2", "hardlink", "linkName", "g"),
	))
	g := lookup(t, x, "g")
	for _, p := range []string{"g", "h1", "h2"} {
		id := lookup(t, x, p)
		if e := x.Entry(id); e.Inode != g || x.Entry(e.Inode).Nlink != 3 {
			t.Errorf("%s: inode %d with Nlink %d, want g's %d with 3", p, e.Inode, x.Entry(e.Inode).Nlink, g)
		}
	}
	// A hardlink links to the entry its target path holds where the hardlink is: a later
	// entry at that path replaces the path, not the link (see TestHardlinksAsExtracted).
	x = parseOK(t, chunked.EStargz, tocOf(file("f", 1, 0), ent("l", "hardlink", "linkName", "f"), ent("f", "fifo")))
	if got := x.Entry(lookup(t, x, "l")).Inode; got != 0 {
		t.Errorf("Inode(l) = %d, want the first f (0)", got)
	}
	if e := x.Entry(0); e.Nlink != 1 || e.Visible() {
		t.Errorf("the first f: Nlink %d, visible %v; want 1, shadowed", e.Nlink, e.Visible())
	}
	// A chain of hardlinks, however long, links to the file.
	x = parseOK(t, chunked.EStargz, tocOf(manyLinks...))
	if got := x.Entry(lookup(t, x, "l69")).Inode; got != lookup(t, x, "f") || x.Entry(got).Nlink != 71 {
		t.Errorf("Inode(l69) = %d with Nlink %d, want f's with 71", got, x.Entry(got).Nlink)
	}
}

func TestParseDirectoryLinkCounts(t *testing.T) {
	x := parseOK(t, chunked.EStargz, tocOf(
		ent("a", "dir"), ent("b", "dir"), ent("a/c", "dir"), ent("a/f", "fifo"), ent("a/c/d/e", "dir"), ent("g", "fifo"),
	))
	for p, want := range map[string]uint32{"": 4, "a": 3, "b": 2, "a/c": 3, "a/c/d": 3, "a/c/d/e": 2, "g": 1, "a/f": 1} {
		if got := x.Entry(lookup(t, x, p)).Nlink; got != want {
			t.Errorf("Nlink(%q) = %d, want %d", p, got, want)
		}
	}
}

func TestChunkAt(t *testing.T) {
	x := parseOK(t, chunked.EStargz, tocOf(
		file("f", 25, 100, "chunkSize", 10),
		chunk2("f", 10, 10, 200),
		ent("f", "chunk", "chunkOffset", 20, "offset", 300, "chunkDigest", dg('3')),
		ent("empty", "reg"),
		ent("l", "hardlink", "linkName", "f"),
		ent("d", "dir"),
	))
	f := lookup(t, x, "f")
	if got := x.Chunks(f); len(got) != 3 || got[2].Size != 5 || got[2].FileOffset != 20 {
		t.Fatalf("Chunks(f) = %+v, want 3 chunks, the last of 5 bytes (chunkSize absent: to the end of the file)", got)
	}
	for _, tc := range []struct {
		off  int64
		want int
	}{
		{math.MinInt64, -1}, {-1, -1}, {0, 0}, {1, 0}, {9, 0}, {10, 1}, {15, 1}, {19, 1}, {20, 2}, {24, 2}, {25, -1}, {26, -1}, {1 << 40, -1}, {math.MaxInt64, -1},
	} {
		if got := x.ChunkAt(f, tc.off); got != tc.want {
			t.Errorf("ChunkAt(f, %d) = %d, want %d", tc.off, got, tc.want)
		}
		if got := x.ChunkAt(lookup(t, x, "l"), tc.off); got != tc.want {
			t.Errorf("ChunkAt(l, %d) = %d, want %d", tc.off, got, tc.want)
		}
	}
	for _, p := range []string{"empty", "d"} {
		id := lookup(t, x, p)
		for _, off := range []int64{-1, 0, 1} {
			if got := x.ChunkAt(id, off); got != -1 {
				t.Errorf("ChunkAt(%s, %d) = %d, want -1", p, off, got)
			}
		}
		if got := x.Chunks(id); len(got) != 0 {
			t.Errorf("Chunks(%s) = %+v, want none", p, got)
		}
	}
}

func TestLookupPath(t *testing.T) {
	x := parseOK(t, chunked.EStargz, tocOf(
		ent("a/b/c", "fifo"), ent("a/b2", "dir"), ent("ab", "fifo"), ent("a/ü/名前", "fifo"), ent("s", "symlink", "linkName", "a"),
	))
	for _, tc := range []struct {
		path string
		want string // entry name, "-" for none
	}{
		{"", ""}, {"/", ""}, {".", ""},
		{"a", "a"}, {"a/b", "a/b"}, {"a/b/c", "a/b/c"}, {"/a/b/c", "a/b/c"}, {"a//b/./c/", "a/b/c"},
		{"a/ü/名前", "a/ü/名前"}, {"ab", "ab"}, {"a/b2", "a/b2"},
		{"../a", "a"},
		{"a/x", "-"}, {"a/b/c/d", "-"}, {"b", "-"}, {"A", "-"}, {"a/b/", "a/b"},
		{"s/b", "-"}, // symlinks are not followed
	} {
		id, ok := x.LookupPath(tc.path)
		switch {
		case tc.want == "-" && ok:
			t.Errorf("LookupPath(%q) = %q, want nothing", tc.path, x.Entry(id).Name)
		case tc.want != "-" && !ok:
			t.Errorf("LookupPath(%q) found nothing, want %q", tc.path, tc.want)
		case ok && x.Entry(id).Name != tc.want:
			t.Errorf("LookupPath(%q) = %q, want %q", tc.path, x.Entry(id).Name, tc.want)
		}
	}
	if _, ok := x.Lookup(lookup(t, x, "ab"), "x"); ok {
		t.Errorf("Lookup in a non-directory found something")
	}
}

func TestChildrenSorted(t *testing.T) {
	x := parseOK(t, chunked.EStargz, tocOf(
		ent("z", "fifo"), ent("b", "dir"), ent("a", "fifo"), ent("B", "fifo"), ent("a.txt", "fifo"), ent(".wh.m", "reg"),
		ent("é", "fifo"), ent("b/2", "fifo"), ent("b/10", "fifo"), ent("b/1", "fifo"), ent("-", "fifo"),
	))
	if got, want := childNames(x, x.Root()), []string{"-", "B", "a", "a.txt", "b", "m", "z", "é"}; !slices.Equal(got, want) {
		t.Errorf("Children(root) = %q, want %q", got, want)
	}
	if got, want := childNames(x, lookup(t, x, "b")), []string{"1", "10", "2"}; !slices.Equal(got, want) {
		t.Errorf("Children(b) = %q, want %q", got, want)
	}
	if got := childNames(x, lookup(t, x, "z")); len(got) != 0 {
		t.Errorf("Children(z) = %q, want none", got)
	}
}

func TestParseSymlinkTargetsVerbatim(t *testing.T) {
	targets := []string{"../../x", "/abs", "a//b/./c/", ".", "..", "名前", " space ", longName(4096)}
	var es []string
	for i, target := range targets {
		es = append(es, ent(fmt.Sprintf("s%d", i), "symlink", "linkName", target))
	}
	x := parseOK(t, chunked.EStargz, tocOf(es...))
	for i, want := range targets {
		e := x.Entry(lookup(t, x, fmt.Sprintf("s%d", i)))
		if e.Type != chunked.TypeSymlink || e.LinkName != want {
			t.Errorf("s%d: %v -> %.40q, want symlink -> %.40q", i, e.Type, e.LinkName, want)
		}
	}
}

func TestParseStargzChunkEnds(t *testing.T) {
	for _, f := range []chunked.Format{chunked.EStargz, chunked.StargzZstd} {
		t.Run(f.String(), func(t *testing.T) {
			x := parseOK(t, f, tocOf(
				file("a", 3, 100),
				file("b", 4, 100, "innerOffset", 3),
				file("c", 5, 100, "innerOffset", 7),
				file("big", 8, 300, "chunkSize", 4),
				ent("big", "chunk", "chunkOffset", 4, "chunkSize", 4, "offset", 300, "innerOffset", 4, "chunkDigest", dg('2')),
				file("late", 2, 500),
				file("early", 2, 50), // listed last, stored first
				ent("empty", "reg", "offset", 999),
			))
			end := payloadEnd(f)
			for _, tc := range []struct {
				path string
				want []chunked.Chunk
			}{
				{"a", []chunked.Chunk{{Range: byterange.Range{Offset: 100, Length: 200}, Size: 3, Digest: sumOf('1')}}},
				{"b", []chunked.Chunk{{Range: byterange.Range{Offset: 100, Length: 200}, InnerOffset: 3, Size: 4, Digest: sumOf('1')}}},
				{"c", []chunked.Chunk{{Range: byterange.Range{Offset: 100, Length: 200}, InnerOffset: 7, Size: 5, Digest: sumOf('1')}}},
				{"big", []chunked.Chunk{
					{Range: byterange.Range{Offset: 300, Length: 200}, Size: 4, Digest: sumOf('1')},
					{Range: byterange.Range{Offset: 300, Length: 200}, InnerOffset: 4, FileOffset: 4, Size: 4, Digest: sumOf('2')},
				}},
				{"late", []chunked.Chunk{{Range: byterange.Range{Offset: 500, Length: min(end-500, chunked.MaxSpan(2))}, Size: 2, Digest: sumOf('1')}}},
				{"early", []chunked.Chunk{{Range: byterange.Range{Offset: 50, Length: 50}, Size: 2, Digest: sumOf('1')}}},
				{"empty", nil},
			} {
				if got := x.Chunks(lookup(t, x, tc.path)); !slices.Equal(got, tc.want) {
					t.Errorf("Chunks(%s) =\n %+v\nwant\n %+v", tc.path, got, tc.want)
				}
			}
		})
	}
}

func TestParseZstdChunkEnds(t *testing.T) {
	for _, f := range []chunked.Format{chunked.ZstdChunked, chunked.ZstdChunkedLegacy} {
		t.Run(f.String(), func(t *testing.T) {
			x := parseOK(t, f, tocOf(
				ent("one", "reg", "size", 5, "offset", 100, "endOffset", 120, "digest", dg('a')),
				ent("multi", "reg", "size", 3000, "offset", 200, "endOffset", 900, "digest", dg('b'),
					"chunkSize", 1000, "chunkDigest", dg('1')),
				ent("multi", "chunk", "chunkOffset", 1000, "chunkSize", 1500, "offset", 400, "chunkDigest", dg('2'), "chunkType", "zeros"),
				ent("multi", "chunk", "chunkOffset", 2500, "chunkSize", 500, "offset", 410, "chunkDigest", dg('3')),
				// Without endOffset the end is the next offset in the blob.
				ent("noend", "reg", "size", 1, "offset", 1000, "digest", dg('c')),
				ent("last", "reg", "size", 1, "offset", 2000, "digest", dg('d')),
				ent("empty", "reg"),
			))
			for _, tc := range []struct {
				path string
				want []chunked.Chunk
			}{
				{"one", []chunked.Chunk{{Range: byterange.Range{Offset: 100, Length: 20}, Size: 5, Digest: sumOf('a')}}},
				{"multi", []chunked.Chunk{
					{Range: byterange.Range{Offset: 200, Length: 200}, Size: 1000, Digest: sumOf('1')},
					{Range: byterange.Range{Offset: 400, Length: 10}, FileOffset: 1000, Size: 1500, Digest: sumOf('2'), Zeros: true},
					{Range: byterange.Range{Offset: 410, Length: 490}, FileOffset: 2500, Size: 500, Digest: sumOf('3')},
				}},
				{"noend", []chunked.Chunk{{Range: byterange.Range{Offset: 1000, Length: 1000}, Size: 1, Digest: sumOf('c')}}},
				{"last", []chunked.Chunk{{Range: byterange.Range{Offset: 2000, Length: min(payloadEnd(f)-2000, chunked.MaxSpan(1))}, Size: 1, Digest: sumOf('d')}}},
				{"empty", nil},
			} {
				if got := x.Chunks(lookup(t, x, tc.path)); !slices.Equal(got, tc.want) {
					t.Errorf("Chunks(%s) =\n %+v\nwant\n %+v", tc.path, got, tc.want)
				}
			}
			if got := x.Entry(lookup(t, x, "multi")).Digest; got != sumOf('b') {
				t.Errorf("Digest(multi) = %v, want the whole-file %v", got, dg('b'))
			}
		})
	}
}

// TestIdentity checks that indexes of one TOC share an identity and that one of another
// TOC, or with another entry count, has another.
func TestIdentity(t *testing.T) {
	a := parseOK(t, chunked.EStargz, tocOf(ent("a", "dir"), ent("a/b", "fifo")))
	b := parseOK(t, chunked.EStargz, tocOf(ent("a", "dir"), ent("a/b", "fifo")))
	c := parseOK(t, chunked.EStargz, tocOf(ent("a", "dir"), ent("a/c", "fifo"), ent("a/b", "fifo")))
	if a.Identity() != b.Identity() {
		t.Error("two indexes of one TOC have different identities")
	}
	if a.Identity() == c.Identity() {
		t.Error("indexes of different TOCs share an identity")
	}
	if got := c.ChildrenFrom(lookup(t, c, "a"), 1, 5); len(got) != 1 || c.BaseName(got[0]) != "c" {
		t.Errorf("ChildrenFrom(a, 1, 5) = %v, want [c]", got)
	}
	if got := c.ChildrenFrom(lookup(t, c, "a"), 2, 5); got != nil {
		t.Errorf("ChildrenFrom past the end = %v", got)
	}
}
