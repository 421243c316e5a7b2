package chunked_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// BenchmarkParse measures building the index of synthetic layers, and the heap the index
// keeps per entry.
func BenchmarkParse(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			js, end := testlayer.SyntheticTOC(n)
			layout := &chunked.Layout{Format: chunked.ZstdChunked, TOC: byterange.Range{Offset: end + 8, Length: 1}}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			x, err := chunked.Parse(context.Background(), layout, js, chunked.Limits{})
			if err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(js)
			b.SetBytes(int64(len(js)))
			for b.Loop() {
				if _, err := chunked.Parse(context.Background(), layout, js, chunked.Limits{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heapB/entry")
			b.ReportMetric(float64(len(x.Binary()))/float64(n), "binB/entry")
		})
	}
}

// BenchmarkParseCompressed measures decompressing and parsing a zstd TOC in one pass.
func BenchmarkParseCompressed(b *testing.B) {
	layout, raw := compressedTOC(b, 1_000_000)
	b.SetBytes(layout.TOCUncompressed)
	for b.Loop() {
		if _, err := chunked.ParseCompressed(context.Background(), layout, raw, chunked.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

// compressedTOC returns the zstd-compressed synthetic TOC of n entries and its layout.
func compressedTOC(b *testing.B, n int) (*chunked.Layout, []byte) {
	js, end := testlayer.SyntheticTOC(n)
	return compressedJSON(b, js, end)
}

// compressedJSON returns the zstd-compressed TOC js, whose payload ends at end, and its
// layout.
func compressedJSON(b *testing.B, js []byte, end int64) (*chunked.Layout, []byte) {
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		b.Fatal(err)
	}
	raw := enc.EncodeAll(js, nil)
	return &chunked.Layout{Format: chunked.ZstdChunked, TOC: byterange.Range{Offset: end + 8, Length: int64(len(raw))},
		TOCUncompressed: int64(len(js))}, raw
}

// BenchmarkIndexAccess measures the accessors of the read paths on the compact index.
func BenchmarkIndexAccess(b *testing.B) {
	js, end := testlayer.SyntheticTOC(100_000)
	layout := &chunked.Layout{Format: chunked.ZstdChunked, TOC: byterange.Range{Offset: end + 8, Length: 1}}
	x, err := chunked.Parse(context.Background(), layout, js, chunked.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	n := chunked.EntryID(x.Len())
	for _, bc := range []struct {
		name string
		f    func(id chunked.EntryID)
	}{
		{"Entry", func(id chunked.EntryID) { _ = x.Entry(id) }},
		{"Meta", func(id chunked.EntryID) { _ = x.Meta(id) }},
		{"Chunk", func(id chunked.EntryID) { _, _ = x.Chunk(id, 0) }},
		{"Lookup", func(id chunked.EntryID) { _, _ = x.Lookup(x.Meta(id).Parent, "file1234.so") }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			id := chunked.EntryID(0)
			for b.Loop() {
				bc.f(id)
				if id++; id == n {
					id = 0
				}
			}
		})
	}
}

// BenchmarkLoadIndex measures checking the compact form of a synthetic layer's index, as a
// restart does before it uses an index it wrote.
func BenchmarkLoadIndex(b *testing.B) {
	js, end := testlayer.SyntheticTOC(1_000_000)
	layout := &chunked.Layout{Format: chunked.ZstdChunked, TOC: byterange.Range{Offset: end + 8, Length: 1}}
	x, err := chunked.Parse(context.Background(), layout, js, chunked.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	data := x.Binary()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := chunked.LoadIndex(data, chunked.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
	runtime.KeepAlive(x)
}

// BenchmarkParsePeak measures the peak memory of parsing a compressed 1M-entry TOC, as a
// lookup does: the process's VmHWM (reset through /proc/self/clear_refs before the parse)
// over its VmRSS before, beside the size of the index it keeps. Four shapes: a tree of small
// files, one of symbolic links only (a link's target is held beside its entry), one of files
// with two xattrs each, and one of hardlinks to one file (each with its extras).
func BenchmarkParsePeak(b *testing.B) {
	const n = 1_000_000
	for _, shape := range []struct {
		name string
		toc  func() (*chunked.Layout, []byte)
	}{
		{"files", func() (*chunked.Layout, []byte) { return compressedTOC(b, n) }},
		{"symlinks", func() (*chunked.Layout, []byte) { return compressedJSON(b, symlinkTOC(n), 0) }},
		{"xattrs", func() (*chunked.Layout, []byte) { return compressedJSON(b, shapeTOC(n, xattrEntry), 0) }},
		{"hardlinks", func() (*chunked.Layout, []byte) { return compressedJSON(b, shapeTOC(n, hardlinkEntry), 0) }},
	} {
		b.Run(shape.name, func(b *testing.B) {
			layout, raw := shape.toc()
			var peak, kept float64
			for b.Loop() {
				runtime.GC()
				debug.FreeOSMemory()
				before := procStatus(b, "VmRSS")
				if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
					b.Skip("cannot reset the peak RSS:", err)
				}
				x, err := chunked.ParseCompressed(context.Background(), layout, raw, chunked.Limits{})
				if err != nil {
					b.Fatal(err)
				}
				peak = float64(procStatus(b, "VmHWM") - before)
				kept = float64(len(x.Binary()))
			}
			b.ReportMetric(peak/(1<<20), "peakMiB")
			b.ReportMetric(peak/n, "peakB/entry")
			b.ReportMetric(kept/(1<<20), "indexMiB")
		})
	}
}

// shapeTOC returns a TOC of the n entries entry renders.
func shapeTOC(n int, entry func(i int) string) []byte {
	var b strings.Builder
	b.WriteString(`{"version":1,"entries":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(entry(i))
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// xattrEntry renders entry i of a TOC of files with two xattrs each, one named after the file
// (security.capability and user.* attributes of real images are few; this is a TOC made to
// cost the parse what xattrs can).
func xattrEntry(i int) string {
	return fmt.Sprintf(`{"type":"reg","name":"d%d/f%d","xattrs":{"user.a%d":"YWFhYWFhYWFhYWFhYWFhYWFh","user.b":"YQ=="}}`, i/64, i, i)
}

// hardlinkEntry renders entry i of a TOC of hardlinks to its first entry, a file.
func hardlinkEntry(i int) string {
	if i == 0 {
		return `{"type":"reg","name":"target"}`
	}
	return fmt.Sprintf(`{"type":"hardlink","name":"d%d/h%d","linkName":"target"}`, i/64, i)
}

// symlinkTOC returns a TOC of n entries: directories of 40 entries, the others symbolic
// links.
func symlinkTOC(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"version":1,"entries":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		dir := fmt.Sprintf("usr/lib/pkg%06d/", i/40)
		if i%40 == 0 {
			fmt.Fprintf(&b, `{"name":%q,"type":"dir","mode":493}`, dir)
			continue
		}
		fmt.Fprintf(&b, `{"name":"%slink%d.so","type":"symlink","linkName":"../target.so","mode":511}`, dir, i)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// procStatus returns a field of /proc/self/status given in kB, in bytes.
func procStatus(b *testing.B, field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}
