package verify_test

import (
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// BenchmarkVerifyChunk measures decompressing and verifying chunks on one core, per format,
// in uncompressed bytes per second.
func BenchmarkVerifyChunk(b *testing.B) {
	for _, f := range fixtures(b) {
		switch f.Name {
		case "estargz", "estargz-zstd", "zstdchunked-modern":
		default:
			continue
		}
		b.Run(f.Name, func(b *testing.B) {
			l, _ := open(b, f)
			x := l.Index()
			type ref struct {
				id chunked.EntryID
				i  int
				c  chunked.Chunk
			}
			var refs []ref
			var total int64
			for id := range chunked.EntryID(x.Len()) {
				if x.Entry(id).Inode == id {
					for i, c := range x.Chunks(id) {
						refs = append(refs, ref{id, i, c})
						total += c.Size
					}
				}
			}
			b.SetBytes(total)
			for b.Loop() {
				for _, r := range refs {
					if _, err := l.VerifyChunk(r.id, r.i, f.Blob[r.c.Offset:r.c.End()]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkOpenLarge measures opening a large synthetic zstd:chunked layer (the first
// resolution of a layer: footer, TOC digest and parse, tar-split digest), and the deferred
// comparison of its TOC with its tar-split, in ns per entry.
func BenchmarkOpenLarge(b *testing.B) {
	const n = 200_000
	f, err := testlayer.SyntheticZstdChunked(n, nil)
	if err != nil {
		b.Fatal(err)
	}
	src := source(f.Blob)
	b.Run("open", func(b *testing.B) {
		for b.Loop() {
			if _, err := verify.Open(b.Context(), f.Desc, f.DiffID, src, verify.Config{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/entry")
	})
	b.Run("open+compare", func(b *testing.B) {
		for b.Loop() {
			l, err := verify.Open(b.Context(), f.Desc, f.DiffID, src, verify.Config{})
			if err != nil {
				b.Fatal(err)
			}
			if err := l.CheckTarSplit(b.Context(), src); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/entry")
	})
}

// BenchmarkVerifyChunkOfManyChunks measures verifying each chunk of a file cut into 1024
// (zstd:chunked cuts files into chunks of tens of KiB), in uncompressed bytes per second: the
// cost of finding one chunk must not grow with the file's count.
func BenchmarkVerifyChunkOfManyChunks(b *testing.B) {
	const size = 16 << 20
	l, f, id := manyChunks(b, size, 16<<10)
	cs := l.Index().Chunks(id)
	if len(cs) < 1000 {
		b.Fatalf("%d chunks", len(cs))
	}
	b.SetBytes(size)
	for b.Loop() {
		for i, c := range cs {
			if _, err := l.VerifyChunk(id, i, f.Blob[c.Offset:c.End()]); err != nil {
				b.Fatal(err)
			}
		}
	}
}
