package chunked

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/layerstore/layerstore/internal/byterange"
)

// TestWideFormChunksInPlace: the builder holds a file's one chunk in its entry, as most files
// have it, and only the others in the chunk table: a million-entry layer of small files holds
// no table of a million chunks (80 bytes each) beside its compact form.
func TestWideFormChunksInPlace(t *testing.T) {
	const sum = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	const other = "sha256:0f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	toc := `{"version":1,"entries":[
	{"type":"reg","name":"one","size":10,"digest":"` + sum + `","offset":100,"chunkDigest":"` + sum + `"},
	{"type":"reg","name":"inner","size":10,"digest":"` + sum + `","offset":100,"innerOffset":7,"chunkDigest":"` + sum + `"},
	{"type":"reg","name":"sum","size":10,"digest":"` + sum + `","offset":200,"chunkDigest":"` + other + `"},
	{"type":"reg","name":"two","size":10,"digest":"` + sum + `","offset":300,"chunkSize":4,"chunkDigest":"` + sum + `"},
	{"type":"chunk","name":"two","offset":400,"chunkOffset":4,"chunkSize":6,"chunkDigest":"` + other + `"},
	{"type":"symlink","name":"l","linkName":"one"},
	{"type":"char","name":"c","devMajor":1,"devMinor":3}]}`
	layout := &Layout{Format: EStargz, TOC: byterange.Range{Offset: 1000, Length: 1}}
	b := &builder{ctx: context.Background(), lim: Limits{}.WithDefaults(), cur: -1,
		x: newWideIndex(layout)}
	b.x.keep = true
	defer b.free()
	if err := b.decode(bytes.NewBufferString(toc)); err != nil {
		t.Fatal(err)
	}
	x, err := b.finish()
	if err != nil {
		t.Fatal(err)
	}
	// "sum" (its own digest) and both of "two"'s are in the table; "one" and "inner" in place.
	if n := b.x.chunks.len(); n != 3 {
		t.Errorf("chunk table of %d chunks, want 3", n)
	}
	if n := b.x.extras.len(); n != 2 {
		t.Errorf("%d extras, want 2 (the symlink's target, the device's numbers)", n)
	}
	if err := CompareWide(layout, []byte(toc), Limits{}); err != nil {
		t.Error(err)
	}
	for name, want := range map[string]Chunk{
		"one":   {Range: byterange.Range{Offset: 100, Length: 100}, Size: 10},
		"inner": {Range: byterange.Range{Offset: 100, Length: 100}, InnerOffset: 7, Size: 10},
	} {
		id, ok := x.LookupPath(name)
		if !ok {
			t.Fatalf("%s: not found", name)
		}
		cs := x.Chunks(id)
		want.Digest = x.Entry(id).Digest
		if len(cs) != 1 || cs[0] != want {
			t.Errorf("%s: chunks %+v, want %+v", name, cs, want)
		}
	}
	if size := unsafe.Sizeof(wideEntry{}); size > 104 {
		t.Errorf("a wide entry takes %d bytes, want at most 104", size)
	}
	if size := unsafe.Sizeof(wideExtra{}); size > 32 {
		t.Errorf("an entry's extras take %d bytes, want at most 32", size)
	}
}

// TestWideNamesShareDirectories: the builder holds a directory's path once for a run of its
// entries, and each entry's base name, not every entry's whole Name (47 bytes an entry of a
// million-entry layer, where its base names take 14); the names read back whole.
func TestWideNamesShareDirectories(t *testing.T) {
	const dir = "usr/lib/python3.12/site-packages/numpy/core"
	var toc strings.Builder
	toc.WriteString(`{"version":1,"entries":[`)
	var want []string
	for i := range 100 {
		name := fmt.Sprintf("%s/f%d.py", dir, i)
		if i%50 == 0 { // a run of another directory between two runs of dir
			name = fmt.Sprintf("%s/sub%d/f.py", dir, i)
		}
		want = append(want, name)
		fmt.Fprintf(&toc, `{"type":"reg","name":%q,"mode":420},`, name)
	}
	toc.WriteString(`{"type":"dir","name":"usr/"}]}`)
	want = append(want, "usr")
	layout := &Layout{Format: EStargz, TOC: byterange.Range{Offset: 1000, Length: 1}}
	b := &builder{ctx: context.Background(), lim: Limits{}.WithDefaults(), cur: -1, x: newWideIndex(layout)}
	b.x.keep = true
	defer b.free()
	if err := b.decode(strings.NewReader(toc.String())); err != nil {
		t.Fatal(err)
	}
	held, whole := 0, 0
	for _, blk := range b.x.names.blocks {
		held += len(blk)
	}
	for i, name := range want {
		e := b.x.entries.at(i)
		if got := b.x.nameOf(e); got != name || !b.x.nameIs(e, name) || b.x.nameIs(e, name+"x") {
			t.Errorf("entry %d: name %q, want %q", i, got, name)
		}
		whole += len(name)
	}
	// The runs: dir (3 times), dir/sub0, dir/sub50; usr's root directory is held already.
	if max := 3*len(dir) + 2*len(dir+"/sub50") + whole - 100*len(dir); held > max || held >= whole/3 {
		t.Errorf("names take %d bytes, want at most %d (the whole names take %d)", held, max, whole)
	}
	if _, err := b.finish(); err != nil {
		t.Fatal(err)
	}
	if err := CompareWide(layout, []byte(toc.String()), Limits{}); err != nil {
		t.Error(err)
	}
}

// TestWideOneChunkLongSpan: a file's one chunk held in its entry keeps a compressed length of
// more than 32 bits (a zstd:chunked endOffset far away, before fillEnds caps it), moved to the
// chunk table.
func TestWideOneChunkLongSpan(t *testing.T) {
	w := newWideIndex(&Layout{Format: ZstdChunked, TOC: byterange.Range{Offset: 8 << 30, Length: 1}})
	defer w.free()
	w.entries.append(wideEntry{Type: TypeReg, Size: 10, chunk0: inPlace, nchunks: 1, one: oneChunk{offset: 100, inner: 7}})
	e := w.entries.at(0)
	for _, n := range []int64{5 << 30, 4 << 30, 1 << 30, 3} {
		w.setLength(e, 0, n)
		if c := w.chunk(e, 0); c.Length != n || c.Offset != 100 || c.InnerOffset != 7 || c.Size != 10 {
			t.Errorf("set to %d: chunk %+v", n, c)
		}
	}
}

// TestWideTimesOutOfRange: a modification time beyond 64 bits of nanoseconds (before 1678,
// after 2262) is kept whole beside the entries, and the index has every time as the TOC gives
// it, before 1970 too.
func TestWideTimesOutOfRange(t *testing.T) {
	times := []string{"1500-01-01T00:00:00.5Z", "1960-05-05T01:02:03.000000007Z", "2024-01-01T00:00:00Z",
		"2500-12-31T23:59:59.999999999Z", "0001-01-01T00:00:00Z", "1677-09-21T00:12:43.145224191Z", "1969-12-31T23:59:59.999999999Z"}
	var toc strings.Builder
	toc.WriteString(`{"version":1,"entries":[`)
	for i, s := range times {
		if i > 0 {
			toc.WriteByte(',')
		}
		fmt.Fprintf(&toc, `{"type":"reg","name":"t%d","modtime":%q},{"type":"dir","name":"d%d","modtime":%q}`, i, s, i, s)
	}
	toc.WriteString(`]}`)
	layout := &Layout{Format: EStargz, TOC: byterange.Range{Offset: 1000, Length: 1}}
	x, err := Parse(context.Background(), layout, []byte(toc.String()), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range times {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{fmt.Sprint("t", i), fmt.Sprint("d", i)} {
			id, ok := x.LookupPath(name)
			if !ok {
				t.Fatalf("%s: not found", name)
			}
			if e := x.Entry(id); e.ModTimeSec != tm.Unix() || e.ModTimeNsec != uint32(tm.Nanosecond()) {
				t.Errorf("%s: %d.%09d, want %s (%d.%09d)", name, e.ModTimeSec, e.ModTimeNsec, s, tm.Unix(), tm.Nanosecond())
			}
		}
	}
	if err := CompareWide(layout, []byte(toc.String()), Limits{}); err != nil {
		t.Error(err)
	}
}
