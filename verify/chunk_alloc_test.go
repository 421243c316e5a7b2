package verify_test

import (
	"archive/tar"
	"runtime"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// TestVerifyChunkMemoryOfManyChunks: verifying one chunk of a file costs memory for that chunk,
// whatever the file's count of chunks. A TOC may cut one file into millions (its entries are
// bounded, not its chunks per file); looking the chunk up in a list of the file's chunks built
// for every verification took 80 bytes per chunk of the file each time (640 MB for a file of
// eight million), and as many decodings.
func TestVerifyChunkMemoryOfManyChunks(t *testing.T) {
	const size, chunk = 4 << 20, 512
	l, f, id := manyChunks(t, size, chunk)
	x := l.Index()
	n := x.NumChunks(id)
	if n < size/chunk {
		t.Fatalf("%d chunks, want %d", n, size/chunk)
	}
	const verified = 64
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for k := range verified {
		i := k * (n / verified)
		c, _ := x.Chunk(id, i)
		if _, err := l.VerifyChunk(id, i, f.Blob[c.Offset:c.End()]); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / verified
	t.Logf("%d bytes allocated per chunk of %d bytes verified, in a file of %d chunks", per, chunk, n)
	if per > 16<<10 { // the chunk's bytes and the decompressor's state; not 80 x 8192
		t.Errorf("%d bytes allocated per chunk verified: want at most 16 KiB", per)
	}
}

// manyChunks builds an eStargz layer of one file, "big", of size bytes cut into chunks of
// chunk bytes, and returns its verifier, the fixture and the file.
func manyChunks(t testing.TB, size, chunk int) (*verify.Verifier, testlayer.Fixture, chunked.EntryID) {
	t.Helper()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 13 / 7)
	}
	tarBlob := testlayer.Build([]testlayer.Entry{{Header: tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, Size: int64(size)}, Data: data}})
	f, err := testlayer.BuildEStargz("many-chunks", tarBlob, estargz.WithChunkSize(chunk))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := open(t, f)
	id, ok := l.Index().LookupPath("big")
	if !ok {
		t.Fatal("no big")
	}
	return l, f, id
}
