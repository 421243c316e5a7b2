package chunked_test

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testlayer"
)

// BenchmarkParse measures building the index of synthetic layers, and the heap the index
// keeps per entry.
func BenchmarkParse(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			js, end := testlayer.SyntheticTOC(n)
			layout := &chunked.Layout{Format: chunked.ZstdChunked, TOC: chunked.Range{Offset: end + 8, Length: 1}}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			x, err := chunked.Parse(layout, js, chunked.Limits{})
			if err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(x)
			x = nil
			b.SetBytes(int64(len(js)))
			for b.Loop() {
				if _, err := chunked.Parse(layout, js, chunked.Limits{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heapB/entry")
		})
	}
}

// BenchmarkTarSplit measures reading the records of a tar-split of 100k files (a header
// segment and a file record each, as c/storage writes them), against decoding the same
// records through reflection (json.UnmarshalDecode into the record type).
func BenchmarkTarSplit(b *testing.B) {
	const files = 100_000
	var sb strings.Builder
	hdr := make([]byte, 512)
	for i := range files {
		for j := range hdr {
			hdr[j] = byte(i + j)
		}
		sb.WriteString(tsLine(chunked.TarSplitSegment, "", 0, hdr, int64(2*i)))
		sb.WriteString(obj("type", chunked.TarSplitFile, "name", fmt.Sprintf("usr/share/doc/pkg%d/file%d.txt", i%500, i),
			"size", i%9000, "payload", "AAAAAAAAAAA=", "position", 2*i+1) + "\n")
	}
	data := []byte(sb.String())
	b.Run("reader", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if n, _, err := readAllRecords(data, chunked.Limits{}); err != io.EOF || n != files {
				b.Fatalf("%d files, %v", n, err)
			}
		}
	})
	b.Run("reflection", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if rs, err := referenceRecords(data); err != nil || len(rs) != 2*files {
				b.Fatalf("%d records, %v", len(rs), err)
			}
		}
	})
}
