package verify_test

import (
	"testing"

	"github.com/layerstore/layerstore/chunked"
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
