package verify

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/layerstore/layerstore/chunked"
	digest "github.com/opencontainers/go-digest"
)

// ChunkData is verified uncompressed chunk data. Only [Verifier.VerifyChunk] makes non-empty ones.
type ChunkData struct {
	ref  chunked.Chunk
	data []byte
}

// Bytes returns the chunk's content. The slice belongs to the chunk: do not modify it.
func (c ChunkData) Bytes() []byte { return c.data }

// Ref returns where the chunk is in its file and in the blob.
func (c ChunkData) Ref() chunked.Chunk { return c.ref }

// VerifyChunk decompresses chunk i of a file from compressed, the blob bytes starting at the
// chunk's Offset (at least its Length bytes), and checks the result against the TOC's digest.
// Decompression never produces more than the chunk's InnerOffset+Size bytes. On any mismatch
// nothing is returned but an error wrapping [ErrDigestMismatch] or [ErrCorrupt].
//
// Once [Verifier.CheckTarSplit] has failed, it verifies nothing and returns that failure.
func (v *Verifier) VerifyChunk(file chunked.EntryID, i int, compressed []byte) (ChunkData, error) {
	if err := v.Err(); err != nil {
		return ChunkData{}, err
	}
	c, err := v.verifyChunk(file, i, compressed)
	if err != nil {
		return ChunkData{}, &LayerError{Layer: v.layout.BlobDigest, Format: v.layout.Format, Err: err}
	}
	return c, nil
}

func (v *Verifier) verifyChunk(file chunked.EntryID, i int, compressed []byte) (ChunkData, error) {
	// The one chunk, not the file's list: a file of zstd:chunked's small chunks has hundreds.
	ref, ok := v.index.Chunk(file, i)
	if !ok {
		return ChunkData{}, fmt.Errorf("%q has no chunk %d", v.index.Entry(file).Name, i)
	}
	if want := ref.Length; int64(len(compressed)) > want {
		compressed = compressed[:want]
	}
	data := make([]byte, ref.Size)
	if err := decompress(v.layout.Format, ref, compressed, data); err != nil {
		return ChunkData{}, fmt.Errorf("chunk %d of %q: %w: %v", i, v.index.Entry(file).Name, ErrCorrupt, err)
	}
	if got := sha256.Sum256(data); got != ref.Digest {
		return ChunkData{}, &MismatchError{What: fmt.Sprintf("chunk %d of %q", i, v.index.Entry(file).Name),
			Want: digest.Digest(ref.Digest.String()), Got: digest.NewDigestFromBytes(digest.SHA256, got[:])}
	}
	return ChunkData{ref: ref, data: data}, nil
}

var (
	zstdPool = sync.Pool{New: func() any {
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecodeAllCapLimit(true),
			zstd.WithDecoderMaxWindow(chunked.DefaultMaxChunkSize))
		if err != nil {
			panic(err) // only invalid options fail
		}
		return d
	}}
	gzipPool sync.Pool
)

// decompress fills out with the chunk's bytes, skipping InnerOffset bytes first. Reading stops
// at len(out): a frame that holds more (eStargz members carry the next tar header) is not
// decoded further.
func decompress(f chunked.Format, ref chunked.Chunk, src []byte, out []byte) error {
	if !f.Zstd() {
		zr, _ := gzipPool.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(bytes.NewReader(src))
		} else {
			err = zr.Reset(bytes.NewReader(src))
		}
		if err != nil {
			return err
		}
		defer gzipPool.Put(zr)
		return readExact(zr, ref.InnerOffset, out)
	}
	d := zstdPool.Get().(*zstd.Decoder)
	defer zstdPool.Put(d)
	if ref.InnerOffset == 0 && f != chunked.StargzZstd {
		// zstd:chunked: the range is exactly the chunk's frame; decode it in one call,
		// capped at the chunk's size.
		got, err := d.DecodeAll(src, out[:0])
		if err != nil {
			return err
		}
		if len(got) != len(out) {
			return fmt.Errorf("decompressed to %d bytes, want %d", len(got), len(out))
		}
		if &got[0] != &out[0] {
			copy(out, got)
		}
		return nil
	}
	if err := d.Reset(bytes.NewReader(src)); err != nil {
		return err
	}
	defer d.Reset(nil) //nolint:errcheck // releasing the source
	return readExact(d, ref.InnerOffset, out)
}

func readExact(r io.Reader, skip int64, out []byte) error {
	if skip > 0 {
		if n, err := io.CopyN(io.Discard, r, skip); err != nil {
			return fmt.Errorf("skipping %d inner bytes: %d: %w", skip, n, err)
		}
	}
	if _, err := io.ReadFull(r, out); err != nil {
		return fmt.Errorf("reading %d bytes: %w", len(out), err)
	}
	return nil
}
