package testlayer

import (
	"context"
	"errors"
	"io"
)

// BlobSource is random access to a blob held in memory, as package verify reads a layer's
// blob (a verify.Source; the daemon reads through package fetcher).
type BlobSource []byte

// ReadAt fills p with the blob's bytes at off, or returns ctx's error once ctx is done, or
// io.EOF when the blob ends before p is full.
func (b BlobSource) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, errors.New("testlayer: negative offset")
	}
	n := 0
	if off < int64(len(b)) {
		n = copy(p, b[off:])
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
