package cache_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// The cache holds files by the digest of their content, and takes content only as chunks
// that package verify checked. A reader opens the file, reads what is present, stores the
// chunks it had to fetch, and reads again.
func Example() {
	// A verified chunk: the content of etc/hostname in a test layer.
	ctx := context.Background()
	fx, err := testlayer.LoadFixture(filepath.Join(testlayer.FixtureDir(), "zstdchunked-modern"))
	if err != nil {
		log.Fatal(err)
	}
	src := testlayer.BlobSource(fx.Blob)
	l, err := verify.Open(ctx, fx.Desc, fx.DiffID, src, verify.Config{})
	if err != nil {
		log.Fatal(err)
	}
	id, _ := l.Index().LookupPath("etc/hostname")
	e := l.Index().Entry(id)
	chunk, err := l.ReadChunk(ctx, src, id, 0)
	if err != nil {
		log.Fatal(err)
	}

	root, err := os.MkdirTemp("", "cache-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	c, err := cache.New(root, cache.Config{MaxSize: 1 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	f, err := c.Open(e.Digest, e.Size) // pinned until Close
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	p := make([]byte, e.Size)
	_, err = f.ReadAt(p, 0)
	fmt.Println(errors.Is(err, cache.ErrMissing), f.Missing(0, e.Size))

	if err := f.Put(chunk); err != nil { // durable when Put returns
		log.Fatal(err)
	}
	n, err := f.ReadAt(p, 0)
	fmt.Printf("%q %v complete=%v\n", p[:n], err, f.Complete())
	// Output:
	// true [{0 11}]
	// "layerstore\n" <nil> complete=true
}
