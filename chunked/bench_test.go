package chunked_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
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
			bin, _ := x.AppendBinary(nil)
			b.ReportMetric(float64(len(bin))/float64(n), "binB/entry")
		})
	}
}
