package fetcher

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"

	"github.com/layerstore/layerstore/internal/byterange"
)

// Whole-blob benchmark: a 200 MB incompressible blob in go-containerregistry's registry on
// 127.0.0.1, fetched (a) with one plain GET and (b) the way a layer's background prefetch does
// it: ranges of 64 KiB to 1 MiB covering the blob (chunks of a zstd:chunked or eStargz layer),
// grouped into batches of about 8 MiB, four batches in flight (package layer's defaults) or
// one, each batch one Blob.Fetch. Run with
//
//	go test -run '^$' -bench WholeBlob -benchtime 3x ./fetcher/
//
// Both report MB/s (b.SetBytes) and requests/op.

const (
	benchBlobSize    = 200 << 20
	benchBatch       = 8 << 20
	benchConcurrency = 4
)

var benchData = sync.OnceValue(func() []byte { return testBlob(benchBlobSize) })

// benchTransport is what a Client uses by default.
func benchTransport(b *testing.B) http.RoundTripper {
	tr := defaultTransport()
	b.Cleanup(tr.CloseIdleConnections)
	return tr
}

func BenchmarkWholeBlob(b *testing.B) {
	reg := newTestRegistry(b, benchData())

	b.Run("plain-GET", func(b *testing.B) {
		client := &http.Client{Transport: benchTransport(b)}
		b.SetBytes(benchBlobSize)
		before := reg.count()
		for b.Loop() {
			resp, err := client.Get(reg.blobURL)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || n != benchBlobSize {
				b.Fatalf("read %d bytes: %v", n, err)
			}
		}
		b.ReportMetric(float64(reg.count()-before)/float64(b.N), "requests/op")
	})

	batches := prefetchBatches(benchBlobSize)
	for _, workers := range []int{benchConcurrency, 1} {
		b.Run(fmt.Sprintf("coalesced-Fetch-%dx", workers), func(b *testing.B) {
			rt := benchTransport(b)
			b.SetBytes(benchBlobSize)
			var requests int64
			for b.Loop() {
				blob, err := newURLBlob(rt, reg.blobURL, benchBlobSize, Config{limiter: newHostLimiter(8)})
				if err != nil {
					b.Fatal(err)
				}
				if err := fetchAll(b.Context(), blob, batches, workers); err != nil {
					b.Fatal(err)
				}
				requests += blob.Stats().Requests
			}
			b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
		})
	}
}

// prefetchBatches cuts a blob of size bytes into chunks of 64 KiB to 1 MiB, grouped into
// batches of about benchBatch bytes, in blob order.
func prefetchBatches(size int64) [][]byterange.Range {
	rng := rand.New(rand.NewPCG(1, 2))
	var batches [][]byterange.Range
	var cur []byterange.Range
	var curBytes int64
	for off := int64(0); off < size; {
		n := min(64<<10+rng.Int64N(1<<20-64<<10+1), size-off)
		if curBytes+n > benchBatch && len(cur) > 0 {
			batches = append(batches, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, byterange.Range{Offset: off, Length: n})
		curBytes += n
		off += n
	}
	return append(batches, cur)
}

// fetchAll fetches the batches with workers batches in flight.
func fetchAll(ctx context.Context, blob *Blob, batches [][]byterange.Range, workers int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan []byterange.Range)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for batch := range next {
				if _, err := blob.Fetch(ctx, batch); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	for _, batch := range batches {
		select {
		case next <- batch:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}
