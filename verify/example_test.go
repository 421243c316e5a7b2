package verify_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// Open checks a layer against its descriptor before anything of it is used. Here the layer is
// a zstd:chunked blob made by containers/storage; the descriptor (with the annotations that
// name the TOC) comes from the image manifest and the DiffID from the image config.
func ExampleOpen() {
	ctx := context.Background()
	dir := filepath.Join("..", "chunked", "testdata", "fixtures", "zstdchunked-modern")
	blob, err := os.ReadFile(filepath.Join(dir, "blob"))
	if err != nil {
		log.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(dir, "descriptor.json"))
	if err != nil {
		log.Fatal(err)
	}
	var desc chunked.Descriptor // mediaType, digest, size, annotations
	if err := json.Unmarshal(js, &desc); err != nil {
		log.Fatal(err)
	}
	diffID, err := os.ReadFile(filepath.Join(dir, "diffid"))
	if err != nil {
		log.Fatal(err)
	}

	// The source is random access to the blob: a fetcher.Blob in the daemon.
	src := testlayer.BlobSource(blob)
	l, err := verify.Open(ctx, desc, digest.Digest(strings.TrimSpace(string(diffID))), src, verify.Config{})
	if err != nil {
		log.Fatal(err)
	}
	x := l.Index()
	id, _ := x.LookupPath("etc/hostname")
	fmt.Println(x.Entry(id).Name, x.Entry(id).Size, "bytes in", len(x.Chunks(id)), "chunk")

	// A chunk's compressed bytes, fetched from wherever: VerifyChunk decompresses them and
	// checks them against the TOC's digest before handing out the content.
	ref := x.Chunks(id)[0]
	c, err := l.VerifyChunk(id, 0, blob[ref.Offset:ref.End()])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q\n", c.Bytes())

	// Other bytes in their place, here well-formed zstd of other content, give an error and
	// no content.
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = l.VerifyChunk(id, 0, enc.EncodeAll([]byte("LAYERSTORE\n"), nil))
	fmt.Println(errors.Is(err, verify.ErrDigestMismatch))
	fmt.Println(l.Guarantee())
	// Output:
	// etc/hostname 11 bytes in 1 chunk
	// "layerstore\n"
	// true
	// chunks-verified
}
