package verify

import (
	"context"
	"io"

	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/readahead"
)

// streamPiece is the size of the pieces in which streamRange reads (a variable for tests),
// and streamPieces how many it reads ahead of its reader at most. A 1M-entry TOC is parsed
// at about 30 MB of compressed bytes a second on one core: a piece of 2 MiB read while one is
// parsed keeps that fed at 1 Gbit/s up to round trips of about 50 ms (a slower link bounds the
// parse whatever the pieces), and the two hold half what pieces of 4 MiB did beside a decoder
// at its peak (the end of a 1M-entry zstd:chunked TOC: 151.6-152.2 -> 148.0-148.1 MiB).
var streamPiece int64 = 2 << 20

const streamPieces = 2

// streamRange reads range r of src as a stream, in pieces of up to streamPiece bytes read one
// after the other on a goroutine of its own, at most streamPieces ahead of the reader: a TOC
// of tens of MB is parsed as it arrives, from its first piece, and never held whole. Close
// ends a read under way (its context is canceled) and returns src's error, if one stopped the
// reads.
func streamRange(ctx context.Context, src Source, r byterange.Range) *readahead.Reader {
	ctx, cancel := context.WithCancel(ctx)
	off := r.Offset
	return readahead.New(streamPieces, func(b []byte) ([]byte, error) {
		n := min(streamPiece, r.End()-off)
		if n <= 0 {
			return nil, io.EOF
		}
		if int64(cap(b)) < n {
			b = make([]byte, n) // a short TOC is one piece of its size
		}
		b = b[:n]
		if err := readFull(ctx, src, b, off); err != nil {
			return nil, err
		}
		off += n
		return b, nil
	}, cancel)
}
