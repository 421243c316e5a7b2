package chunked_test

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
)

// deepTOC returns a TOC of n fifos, each at its own path of depth components ("dI/a/a/.../f").
func deepTOC(n, depth int) string {
	deep := strings.Repeat("a/", depth-2)
	es := make([]string, n)
	for i := range es {
		es[i] = ent(fmt.Sprintf("d%d/%sf", i, deep), "fifo")
	}
	return tocOf(es...)
}

// parseMeasured parses js and returns the bytes allocated meanwhile and the heap the result
// keeps alive.
func parseMeasured(t *testing.T, js []byte, lim chunked.Limits) (x *chunked.Index, err error, total, live uint64, took time.Duration) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	x, err = chunked.Parse(context.Background(), testLayout(chunked.EStargz), js, lim)
	took = time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(x)
	return x, err, after.TotalAlloc - before.TotalAlloc, after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc), took
}

// TestParseDeepNestingBounded: a TOC of a few thousand deeply nested entries, each needing
// thousands of implicit directories, is refused at once, without building the directories.
func TestParseDeepNestingBounded(t *testing.T) {
	js := []byte(deepTOC(4000, 2000))
	x, err, total, live, took := parseMeasured(t, js, chunked.Limits{})
	t.Logf("%d-byte TOC: %v; allocated %d MiB, %d MiB live, in %v", len(js), err, total>>20, live>>20, took)
	if x != nil {
		t.Logf("index of %d entries", x.Len())
	}
	if !errors.Is(err, chunked.ErrLimit) {
		t.Errorf("Parse = %v, want ErrLimit", err)
	}
	if total > 4*uint64(len(js)) {
		t.Errorf("Parse of a %d-byte TOC allocated %d MiB", len(js), total>>20)
	}
}

// TestParseImplicitDirectoriesCounted: the directories an index adds for parents the TOC does
// not list count against MaxEntries.
func TestParseImplicitDirectoriesCounted(t *testing.T) {
	const n, depth, limit = 100, 200, 10000 // n*(depth-1) implicit directories
	js := []byte(deepTOC(n, depth))
	_, err, total, _, took := parseMeasured(t, js, chunked.Limits{MaxEntries: limit})
	t.Logf("%d-byte TOC of %d entries: %v; allocated %d KiB in %v", len(js), n, err, total>>10, took)
	if !errors.Is(err, chunked.ErrLimit) || !strings.Contains(err.Error(), "directories they imply") {
		t.Errorf("Parse = %v, want ErrLimit for the implied directories", err)
	}
	// The entries array and the path map of the limit's entries (about 1 KiB each with the
	// growth of both), no more.
	if total > limit<<10+4*uint64(len(js)) {
		t.Errorf("Parse allocated %d KiB", total>>10)
	}
	// Within the limit, the same tree is built.
	x, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), js, chunked.Limits{MaxEntries: n * depth})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := x.Len(), n+n*(depth-1)+1; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
}

// TestParseDepthCap: names and hardlink targets of more than 256 components are refused; 256
// are accepted.
func TestParseDepthCap(t *testing.T) {
	at := func(depth int) string { return strings.Repeat("a/", depth-1) + "f" }
	if _, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), []byte(tocOf(ent(at(256), "fifo"))), chunked.Limits{}); err != nil {
		t.Errorf("Parse of a name of 256 components: %v", err)
	}
	for _, js := range []string{
		tocOf(ent(at(257), "fifo")),
		tocOf(ent("f", "fifo"), ent("l", "hardlink", "linkName", at(257))),
	} {
		if _, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), []byte(js), chunked.Limits{}); !errors.Is(err, chunked.ErrLimit) || !strings.Contains(err.Error(), "257 components exceeds 256") {
			t.Errorf("Parse of a name of 257 components = %v, want ErrLimit", err)
		}
	}
}

// TestParseChunkSpanCapped: however far the next chunk or the end of the data lies, and
// whatever endOffset a zstd:chunked TOC gives, a chunk's span is at most MaxSpan of what it
// decompresses to.
func TestParseChunkSpanCapped(t *testing.T) {
	const far = 8 << 30 // the TOC, and the end of the data, 8 GiB into the blob
	for _, tc := range []struct {
		format chunked.Format
		toc    string
	}{
		{chunked.EStargz, tocOf(file("a", 1, 0), file("b", 10, 100, "innerOffset", 20), file("c", 1, far/2))},
		{chunked.StargzZstd, tocOf(file("a", 1, 0), file("b", 10, 100, "innerOffset", 20), file("c", 1, far/2))},
		{chunked.ZstdChunked, tocOf(
			ent("a", "reg", "size", 1, "offset", 0, "endOffset", far-8, "digest", dg('a')),
			ent("b", "reg", "size", 10, "offset", 100, "endOffset", far-8, "digest", dg('b')),
			ent("c", "reg", "size", 1, "offset", far/2, "digest", dg('c')))},
	} {
		l := &chunked.Layout{Format: tc.format, TOC: byterange.Range{Offset: far, Length: 100}}
		x, err := chunked.Parse(context.Background(), l, []byte(tc.toc), chunked.Limits{})
		if err != nil {
			t.Fatalf("%v: %v", tc.format, err)
		}
		for _, p := range []string{"a", "b", "c"} {
			for _, c := range x.Chunks(lookup(t, x, p)) {
				if span, limit := c.Length, chunked.MaxSpan(c.InnerOffset+c.Size); span <= 0 || span > limit {
					t.Errorf("%v: %s: chunk spans %d bytes (%d-%d), want at most %d", tc.format, p, span, c.Offset, c.End(), limit)
				}
			}
		}
	}
	if got := chunked.MaxSpan(chunked.DefaultMaxChunkSize); got > chunked.DefaultMaxChunkSize+chunked.DefaultMaxChunkSize/50 {
		t.Errorf("MaxSpan(%d) = %d", chunked.DefaultMaxChunkSize, got)
	}
}

// repeatByte is an endless stream of one byte.
type repeatByte byte

func (b repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// TestTarSplitEntryBounded: one tar-split entry (a line of JSON) of hundreds of megabytes, as
// a tiny zstd frame can hold, is refused before the decoder has buffered it.
func TestTarSplitEntryBounded(t *testing.T) {
	const n = 200 << 20
	r := io.MultiReader(strings.NewReader(`{"type":2,"payload":"`), io.LimitReader(repeatByte('A'), n),
		strings.NewReader(`","position":0}`+"\n"))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := chunked.NewTarSplitReader(r, chunked.Limits{}).Next()
	runtime.ReadMemStats(&after)
	total := after.TotalAlloc - before.TotalAlloc
	t.Logf("a record of %d MiB: %v; allocated %d MiB", n>>20, err, total>>20)
	if !errors.Is(err, chunked.ErrLimit) {
		t.Errorf("Next = %v, want ErrLimit", err)
	}
	if total > 128<<20 {
		t.Errorf("Next allocated %d MiB", total>>20)
	}
	// The largest segment allowed still reads.
	seg := make([]byte, 16<<20)
	line := `{"type":2,"payload":"` + base64.StdEncoding.EncodeToString(seg) + `","position":0}` + "\n"
	if rec, err := chunked.NewTarSplitReader(strings.NewReader(line), chunked.Limits{}).Next(); err != nil || len(rec.Payload) != len(seg) {
		t.Errorf("Next of a %d-byte segment: %v", len(seg), err)
	}
}

// flatTOC returns a TOC of n fifos in 100 directories.
func flatTOC(n int) string {
	es := make([]string, n)
	for i := range es {
		es[i] = ent(fmt.Sprintf("d%d/f%d", i%100, i), "fifo", "mode", 0o644, "modtime", "2024-01-02T03:04:05Z")
	}
	return tocOf(es...)
}

// TestParseCanceled: Parse stops soon after its context is done, with the context's error.
func TestParseCanceled(t *testing.T) {
	js := []byte(flatTOC(300000))
	start := time.Now()
	if _, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), js, chunked.Limits{}); err != nil {
		t.Fatal(err)
	}
	full := time.Since(start)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	_, err := chunked.Parse(ctx, testLayout(chunked.EStargz), js, chunked.Limits{})
	t.Logf("full parse %v; canceled %v: %v", full, time.Since(start), err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Parse with a canceled context = %v, want context.Canceled", err)
	}
	// Canceled while it runs, at each of its looks at the context, in each of its phases.
	small := []byte(flatTOC(20000))
	for n := int64(1); ; n++ {
		ctx := &cancelAfter{Context: context.Background(), n: n}
		_, err := chunked.Parse(ctx, testLayout(chunked.EStargz), small, chunked.Limits{})
		if err == nil {
			if n < 10 {
				t.Errorf("Parse looked at its context %d times, want more", n-1)
			}
			break
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Parse canceled at its look %d = %v, want context.Canceled", n, err)
		}
	}
	// Canceled from another goroutine.
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(full/10, cancel)
	start = time.Now()
	_, err = chunked.Parse(ctx, testLayout(chunked.EStargz), js, chunked.Limits{})
	if took := time.Since(start); !errors.Is(err, context.Canceled) || took > full/2 {
		t.Errorf("Parse canceled after %v = %v after %v, want context.Canceled sooner", full/10, err, took)
	}
}

// cancelAfter is a context that is canceled from the n-th look at its Err on.
type cancelAfter struct {
	context.Context
	n, looks int64
}

func (c *cancelAfter) Err() error {
	if c.looks++; c.looks >= c.n {
		return context.Canceled
	}
	return nil
}

// TestIterateTarSplitCanceled: IterateTarSplit stops soon after its context is done, with the
// context's error.
func TestIterateTarSplitCanceled(t *testing.T) {
	var b strings.Builder
	const n = 20000
	for i := range n {
		b.WriteString(tsLine(2, "", 0, make([]byte, 512), int64(i))) // zero blocks: end of archive
	}
	data := b.String()
	for _, looks := range []int64{1, 2, 4} {
		records := 0
		err := chunked.IterateTarSplit(&cancelAfter{Context: context.Background(), n: looks},
			chunked.NewTarSplitReader(strings.NewReader(data), chunked.Limits{}),
			func(int, *tar.Header) error { return nil }, func(int, *chunked.TarSplitEntry) error { records++; return nil })
		if !errors.Is(err, context.Canceled) {
			t.Errorf("IterateTarSplit canceled at its look %d = %v, want context.Canceled", looks, err)
		}
	}
	if err := chunked.IterateTarSplit(context.Background(), chunked.NewTarSplitReader(strings.NewReader(data), chunked.Limits{}),
		func(int, *tar.Header) error { return nil }, func(int, *chunked.TarSplitEntry) error { return nil }); err != nil {
		t.Errorf("IterateTarSplit = %v", err)
	}
}

// TestIterateTarSplitAheadBounded: records decoded ahead of the comparison are bounded: a
// tar-split of many segments of the largest size allowed (after the end of the archive, where
// they are consumed unparsed) allocates about the same whatever their number: the batches'
// buffers are reused.
func TestIterateTarSplitAheadBounded(t *testing.T) {
	const seg = 16 << 20
	alloc := func(n int) uint64 {
		rs := []io.Reader{strings.NewReader(tsLine(chunked.TarSplitSegment, "", 0, make([]byte, 1024), 0))}
		for i := range n {
			rs = append(rs, strings.NewReader(`{"type":2,"payload":"`), io.LimitReader(repeatByte('A'), seg/3*4),
				strings.NewReader(fmt.Sprintf(`","position":%d}`+"\n", i+1)))
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err := chunked.IterateTarSplit(context.Background(), chunked.NewTarSplitReader(io.MultiReader(rs...), chunked.Limits{}),
			func(int, *tar.Header) error { return nil }, func(int, *chunked.TarSplitEntry) error { return nil })
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		return after.TotalAlloc - before.TotalAlloc
	}
	few, many := alloc(4), alloc(16)
	t.Logf("4 segments of %d MiB: %d MiB allocated; 16: %d MiB", seg>>20, few>>20, many>>20)
	if many > few+2*seg {
		t.Errorf("16 segments allocated %d MiB, 4 %d MiB: records decoded ahead are not bounded", many>>20, few>>20)
	}
}

// TestParseOutOfRangeTimesBounded: a TOC whose every entry has a time outside the wide form's
// 64 bits of nanoseconds (year 1) costs the parse its 16 bytes an entry beside the entries,
// mapped with them, and the index keeps nothing more for them.
func TestParseOutOfRangeTimesBounded(t *testing.T) {
	const n = 200000
	toc := func(modtime string) []byte {
		es := make([]string, n)
		for i := range es {
			es[i] = ent(fmt.Sprintf("d%d/f%d", i%100, i), "fifo", "mode", 0o644, "modtime", modtime)
		}
		return []byte(tocOf(es...))
	}
	inRange, outOfRange := toc("2024-01-02T03:04:05Z"), toc("0001-01-01T00:00:00Z")
	chunked.MappedPeak()
	_, err, totalIn, liveIn, _ := parseMeasured(t, inRange, chunked.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	mappedIn := chunked.MappedPeak()
	x, err, totalOut, liveOut, took := parseMeasured(t, outOfRange, chunked.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	mappedOut := chunked.MappedPeak()
	t.Logf("%d entries: allocated %d KiB (in range %d KiB), %d KiB live (%d KiB), mapped at most %d KiB (%d KiB), in %v",
		n, totalOut>>10, totalIn>>10, liveOut>>10, liveIn>>10, mappedOut>>10, mappedIn>>10, took)
	if id, ok := x.LookupPath("d7/f7"); !ok {
		t.Error("d7/f7 not found")
	} else if e := x.Entry(id); e.ModTimeSec != -62135596800 || e.ModTimeNsec != 0 {
		t.Errorf("d7/f7's time %d.%09d, want year 1", e.ModTimeSec, e.ModTimeNsec)
	}
	// 16 bytes an entry, in blocks (at most one block more), and the index's records' longer
	// times: at most 18 bytes an entry in all.
	if extra := (mappedOut - mappedIn) + int64(totalOut) - int64(totalIn); extra > 18*n+64<<10 {
		t.Errorf("out-of-range times cost the parse %d bytes, want at most 18 an entry (%d)", extra, 18*n)
	}
	if extra := int64(liveOut) - int64(liveIn); extra > 8*n {
		t.Errorf("out-of-range times cost the index %d bytes an entry, want at most 8", extra/n)
	}
}

// TestParseShapesBounded: TOCs made to cost the parse what each kind of entry can (files,
// xattrs, hardlinks, files of many chunks, devices, a directory's path that changes at every
// entry, long link targets) stay within what each costs now, counting everything the parse
// allocates on the heap (garbage included) and the most it maps at once. The bounds hold
// about a fifth more than measured; xattrs held as strings of their own (1089 bytes an entry),
// and links' targets decoded into strings of their own (2040), fail theirs.
func TestParseShapesBounded(t *testing.T) {
	const n = 100000
	const sum = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	long := strings.Repeat("abcdefghij", 20)
	for _, c := range []struct {
		name  string
		max   int64 // bytes an entry
		entry func(i int) string
	}{
		{"files", 240, func(i int) string {
			return fmt.Sprintf(`{"type":"reg","name":"d%d/f%d","size":10,"digest":%q,"offset":%d,"chunkDigest":%q}`, i/64, i, sum, 512+int64(i)*100, sum)
		}},
		{"xattrs", 900, func(i int) string {
			return fmt.Sprintf(`{"type":"reg","name":"d%d/f%d","xattrs":{"user.a%d":"YWFhYWFhYWFhYWFhYWFhYWFh","user.b":"YQ=="}}`, i/64, i, i)
		}},
		{"hardlinks", 270, func(i int) string {
			if i == 0 {
				return `{"type":"reg","name":"target"}`
			}
			return fmt.Sprintf(`{"type":"hardlink","name":"d%d/h%d","linkName":"target"}`, i/64, i)
		}},
		{"alternating directories", 700, func(i int) string {
			return fmt.Sprintf(`{"type":"reg","name":"%s/%s/d%d/f%d"}`, long, long, i%2, i)
		}},
		{"chunks", 240, func(i int) string {
			f, c := i/8, i%8
			if c == 0 {
				return fmt.Sprintf(`{"type":"reg","name":"d%d/f%d","size":80,"digest":%q,"offset":%d,"chunkSize":10,"chunkDigest":%q}`, f/64, f, sum, 512+int64(i)*100, sum)
			}
			return fmt.Sprintf(`{"type":"chunk","name":"d%d/f%d","offset":%d,"chunkOffset":%d,"chunkSize":10,"chunkDigest":%q}`, f/64, f, 512+int64(i)*100, c*10, sum)
		}},
		{"devices", 250, func(i int) string {
			return fmt.Sprintf(`{"type":"char","name":"d%d/c%d","devMajor":%d,"devMinor":%d}`, i/64, i, 1+i%200, i)
		}},
		{"long link targets", 1700, func(i int) string {
			return fmt.Sprintf(`{"type":"symlink","name":"d%d/l%d","linkName":"%s%s%s"}`, i/64, i, long, long, long)
		}},
	} {
		var b strings.Builder
		b.WriteString(`{"version":1,"entries":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(c.entry(i))
		}
		b.WriteString(`]}`)
		js := []byte(b.String())
		layout := &chunked.Layout{Format: chunked.EStargz, TOC: byterange.Range{Offset: 1 << 40, Length: 100}}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		chunked.MappedPeak()
		x, err := chunked.Parse(context.Background(), layout, js, chunked.Limits{})
		mapped := chunked.MappedPeak()
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		heap := int64(after.TotalAlloc - before.TotalAlloc)
		t.Logf("%s: %d bytes of JSON an entry; %d bytes an entry allocated, %d mapped at most; index %d bytes an entry",
			c.name, len(js)/n, heap/n, mapped/n, len(x.Binary())/x.Len())
		if got := (heap + mapped) / n; got > c.max {
			t.Errorf("%s: the parse took %d bytes an entry, want at most %d", c.name, got, c.max)
		}
	}
}

// TestParseXattrPieces: an xattr's name of more than 4096 bytes, and a value of more than
// 1 MiB, are refused whatever MaxXattrBytes allows (Linux allows 255 and 64 KiB); a value of
// 1 MiB reads back whole.
func TestParseXattrPieces(t *testing.T) {
	lim := chunked.Limits{MaxXattrBytes: 4 << 20}
	toc := func(name string, value int) []byte {
		v := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("v", value)))
		return []byte(tocOf(ent("f", "reg", "xattrs", map[string]string{name: v})))
	}
	x, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), toc(strings.Repeat("n", 4096), 1<<20), lim)
	if err != nil {
		t.Fatal(err)
	}
	if xs := x.TOCXattrs(lookup(t, x, "f")); len(xs) != 1 || len(xs[0].Name) != 4096 || xs[0].Value != strings.Repeat("v", 1<<20) {
		t.Errorf("the xattr read back differs")
	}
	for _, js := range [][]byte{toc(strings.Repeat("n", 4097), 1), toc("user.a", 1<<20+1)} {
		if _, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), js, lim); !errors.Is(err, chunked.ErrLimit) {
			t.Errorf("Parse = %v, want ErrLimit", err)
		}
	}
}
