package chunked

import (
	"bytes"
	"context"
	"testing"
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
	if size := unsafe.Sizeof(wideEntry{}); size > 120 {
		t.Errorf("a wide entry takes %d bytes, want at most 120", size)
	}
}
