package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"

	"go.podman.io/storage/pkg/chunked/compressor"
)

// compressResult is what compress prints: the annotations the compressor gives the layer
// descriptor (TOC digest and position, tar-split digest).
type compressResult struct {
	Annotations map[string]string `json:"annotations"`
}

// runCompress turns a tar stream on stdin into a zstd:chunked blob in the file named by its
// argument, with c/storage's own compressor, as c/image calls it when it pushes with
// --compression-format zstd:chunked (the default level).
func runCompress(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	fs := newFlagSet("compress", &common)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		return nil, fmt.Errorf("%w: compress needs BLOBFILE (the tar comes on stdin)", errUsage)
	}
	ctx, cancel, err := common.apply(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	f, err := os.Create(pos[0])
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	annotations := map[string]string{}
	w, err := compressor.ZstdCompressor(bw, annotations, nil)
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(w, &ctxReader{ctx, bufio.NewReaderSize(os.Stdin, 1<<20)}); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return compressResult{Annotations: annotations}, nil
}

// ctxReader stops a copy once ctx is done (the --timeout).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
