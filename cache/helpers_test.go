package cache

import (
	"crypto/sha256"
	"path/filepath"
	"sync"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// testFile is a real file of the reference layer with its verified chunks from each fixture.
type testFile struct {
	name    string
	sum     chunked.Sum
	content []byte
	chunks  map[string][]verify.ChunkData // by fixture: "zstd" (zstd:chunked) or "estargz" (64 KiB)
}

func (f *testFile) size() int64 { return int64(len(f.content)) }

var (
	filesOnce sync.Once
	filesErr  error
	files     map[string]*testFile
)

// realFiles returns the regular files of the reference layer, read as verified chunks from
// the committed zstd:chunked fixture and from an eStargz build with other chunk boundaries.
func realFiles(t testing.TB) map[string]*testFile {
	t.Helper()
	filesOnce.Do(func() { files, filesErr = loadFiles(t) })
	if filesErr != nil {
		t.Fatal(filesErr)
	}
	return files
}

func loadFiles(t testing.TB) (map[string]*testFile, error) {
	zf, err := testlayer.LoadFixture(filepath.Join(testlayer.FixtureDir(), "zstdchunked-modern"))
	if err != nil {
		return nil, err
	}
	ef, err := testlayer.BuildEStargz("estargz", testlayer.Tar())
	if err != nil {
		return nil, err
	}
	out := map[string]*testFile{}
	for kind, fx := range map[string]testlayer.Fixture{"zstd": zf, "estargz": ef} {
		src := testlayer.BlobSource(fx.Blob)
		l, err := verify.Open(t.Context(), fx.Desc, fx.DiffID, src, verify.Config{})
		if err != nil {
			return nil, err
		}
		x := l.Index()
		for i := range x.Len() {
			id := chunked.EntryID(i)
			e := x.Entry(id)
			if e.Type != chunked.TypeReg || e.Inode != id || e.Size == 0 || !e.Visible() {
				continue
			}
			tf := out[e.Name]
			if tf == nil {
				tf = &testFile{name: e.Name, sum: e.Digest, chunks: map[string][]verify.ChunkData{}}
				out[e.Name] = tf
			}
			var content []byte
			for j := range x.Chunks(id) {
				c, err := l.ReadChunk(t.Context(), src, id, j)
				if err != nil {
					return nil, err
				}
				tf.chunks[kind] = append(tf.chunks[kind], c)
				content = append(content, c.Bytes()...)
			}
			if chunked.Sum(sha256.Sum256(content)) != tf.sum {
				t.Fatalf("%s: %s content does not match its digest", kind, e.Name)
			}
			tf.content = content
		}
	}
	return out, nil
}

func newCache(t *testing.T, root string, cfg Config) *Cache {
	t.Helper()
	c, err := New(root, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func open(t *testing.T, c *Cache, f *testFile) *File {
	t.Helper()
	h, err := c.Open(f.sum, f.size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func putAll(t *testing.T, h *File, cs []verify.ChunkData) {
	t.Helper()
	for _, c := range cs {
		if err := h.Put(c); err != nil {
			t.Fatal(err)
		}
	}
}

// fill stores a whole file and closes the handle.
func fill(t *testing.T, c *Cache, f *testFile) {
	t.Helper()
	h := open(t, c, f)
	putAll(t, h, f.chunks["zstd"])
	if !h.Complete() {
		t.Fatalf("%s not complete after all its chunks", f.name)
	}
	h.Close()
}

func chunkRange(c verify.ChunkData) byterange.Range {
	return byterange.Range{Offset: c.Ref().FileOffset, Length: c.Ref().Size}
}
