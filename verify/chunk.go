package verify

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/flate"
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
	if ref, ok := v.index.Chunk(file, i); ok && int64(len(compressed)) > ref.Length {
		compressed = compressed[:ref.Length]
	}
	c, err := v.verifyChunk(file, i, whole(compressed))
	if err != nil {
		return ChunkData{}, &LayerError{Layer: v.layout.BlobDigest, Format: v.layout.Format, Err: err}
	}
	return c, nil
}

// verifyChunk decompresses chunk i of file from in, its compressed bytes, and checks the
// result against the TOC's digest.
func (v *Verifier) verifyChunk(file chunked.EntryID, i int, in *arriving) (ChunkData, error) {
	// The one chunk, not the file's list: a file of zstd:chunked's small chunks has hundreds.
	ref, ok := v.index.Chunk(file, i)
	if !ok {
		return ChunkData{}, fmt.Errorf("%q has no chunk %d", v.index.Entry(file).Name, i)
	}
	data := make([]byte, ref.Size)
	if err := decompress(v.layout.Format, ref, in, data); err != nil {
		return ChunkData{}, fmt.Errorf("chunk %d of %q: %w: %v", i, v.index.Entry(file).Name, ErrCorrupt, err)
	}
	if got := sha256.Sum256(data); got != ref.Digest {
		return ChunkData{}, &MismatchError{What: fmt.Sprintf("chunk %d of %q", i, v.index.Entry(file).Name),
			Want: digest.Digest(ref.Digest.String()), Got: digest.NewDigestFromBytes(digest.SHA256, got[:])}
	}
	return ChunkData{ref: ref, data: data}, nil
}

// arriving is a chunk's compressed bytes for a decompressor: whole, or as they arrive (a
// [StreamSource]'s reader). It records the first error of the read itself, which is then the
// read's failure, not the chunk's.
type arriving struct {
	// r is what the decompressor reads: a *bytes.Reader over the whole bytes, or a
	// *bufio.Reader over the arriving ones. klauspost's flate reads either type without an
	// interface call per byte (any other reader costs the background fetch a quarter more CPU).
	r     flate.Reader
	whole []byte    // every byte, when they came whole
	src   io.Reader // the arriving bytes, when streamed
	err   error
}

// wholeReader is a reader of bytes on their way that can wait for them all and return them.
type wholeReader interface {
	Bytes() ([]byte, error)
}

// whole returns the arriving bytes of a chunk read whole.
func whole(b []byte) *arriving {
	return &arriving{r: bytes.NewReader(b), whole: b}
}

// streamed returns the arriving bytes of a chunk read from src as they come.
func streamed(src io.Reader) *arriving {
	a := &arriving{src: src}
	a.r = bufio.NewReaderSize(recorder{a}, streamedBuffer)
	return a
}

// streamedBuffer is the buffer of a chunk decompressed as it arrives: each fill takes what has
// come, up to that.
const streamedBuffer = 32 << 10

// recorder reads the arriving bytes, recording the read's error.
type recorder struct{ a *arriving }

func (r recorder) Read(p []byte) (int, error) {
	n, err := r.a.src.Read(p)
	return n, r.a.record(err)
}

func (a *arriving) record(err error) error {
	if err != nil && err != io.EOF && a.err == nil {
		a.err = err
	}
	return err
}

// all returns every byte, waiting for them.
func (a *arriving) all() ([]byte, error) {
	switch w, ok := a.src.(wholeReader); {
	case a.whole != nil || a.src == nil:
		return a.whole, nil
	case ok:
		b, err := w.Bytes()
		return b, a.record(err)
	}
	return io.ReadAll(a.r)
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
func decompress(f chunked.Format, ref chunked.Chunk, in *arriving, out []byte) error {
	if !f.Zstd() {
		zr, _ := gzipPool.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(in.r)
		} else {
			err = zr.Reset(in.r)
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
		// zstd:chunked: the range is exactly the chunk's frame, of some tens of KiB; decode
		// it in one call once it is in, capped at the chunk's size.
		src, err := in.all()
		if err != nil {
			return err
		}
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
	if err := d.Reset(in.r); err != nil {
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
