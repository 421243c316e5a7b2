package chunked

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// maxTOCRatio bounds the uncompressed size of a TOC, per compressed byte, that ExtractTOC
// allocates before decompressing it (TOC JSON compresses 5-10 times).
const maxTOCRatio = 64

// tocTarName is the tar entry holding an eStargz TOC.
const tocTarName = "stargz.index.json"

// ExtractTOC decompresses the TOC bytes found at [Layout].TOC and returns the TOC JSON: for
// eStargz, the content of the stargz.index.json tar entry in the gzip member; otherwise the
// zstd frame's content. Decompression stops past the limit.
func ExtractTOC(l *Layout, raw []byte, limits Limits) ([]byte, error) {
	lim := limits.WithDefaults()
	if int64(len(raw)) > lim.MaxTOCSize {
		return nil, limitf("compressed TOC of %d bytes exceeds %d", len(raw), lim.MaxTOCSize)
	}
	if l.Format == EStargz {
		return extractStargzTOC(raw, lim.MaxTOCSize)
	}
	zr, err := newTOCReader(l, raw, lim, 1)
	if err != nil {
		return nil, err
	}
	defer zr.close()
	out, err := readCapped(zr, lim.MaxTOCSize, tocSizeHint(l, raw, lim))
	if zr.err != nil {
		return nil, zr.err
	}
	if err != nil {
		return nil, err
	}
	if err := zr.checkSize(); err != nil {
		return nil, err
	}
	return out, nil
}

// tocSizeHint returns the TOC's uncompressed size the layout states when the compressed TOC
// raw could plausibly hold it (a manifest alone must not make the daemon allocate up to the
// limit), else 0.
func tocSizeHint(l *Layout, raw []byte, lim Limits) int64 {
	if h := l.TOCUncompressed; h > 0 && h <= maxTOCRatio*int64(len(raw)) && h <= lim.MaxTOCSize {
		return h
	}
	return 0
}

// tocReader decompresses a zstd TOC up to the limit, counting its bytes.
type tocReader struct {
	dec   *zstd.Decoder
	l     *Layout
	limit int64
	n     int64
	err   error // the first error other than io.EOF, as ExtractTOC reports it
}

// newTOCReader returns a reader of the zstd TOC raw; concurrency is the decoder's (1:
// decompressed as it is read, on the reader's goroutine).
func newTOCReader(l *Layout, raw []byte, lim Limits, concurrency int) (*tocReader, error) {
	dec, err := zstd.NewReader(bytes.NewReader(raw), zstd.WithDecoderConcurrency(concurrency),
		zstd.WithDecoderMaxMemory(uint64(lim.MaxTOCSize)), zstd.WithDecoderMaxWindow(uint64(min(lim.MaxTOCSize, 1<<30))))
	if err != nil {
		return nil, invalidf("TOC: %v", err)
	}
	return &tocReader{dec: dec, l: l, limit: lim.MaxTOCSize}, nil
}

func (t *tocReader) Read(p []byte) (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	n, err := t.dec.Read(p)
	t.n += int64(n)
	switch {
	case t.n > t.limit:
		t.err = limitf("TOC decompresses to more than %d bytes", t.limit)
	case errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded):
		t.err = limitf("TOC: %v", err)
	case err != nil && err != io.EOF:
		t.err = invalidf("TOC: %w", err)
	default:
		return n, err
	}
	return 0, t.err
}

// checkSize refuses a TOC whose size is not the one the layout states (once read to its end).
func (t *tocReader) checkSize() error {
	if t.l.TOCUncompressed != 0 && t.n != t.l.TOCUncompressed {
		return invalidf("TOC decompressed to %d bytes, the layout says %d", t.n, t.l.TOCUncompressed)
	}
	return nil
}

func (t *tocReader) close() { t.dec.Close() }

// extractStargzTOC reads the TOC member to its end, so that the gzip CRC covers every byte
// of it: the tar header, the JSON, the padding and the end blocks.
func extractStargzTOC(raw []byte, limit int64) ([]byte, error) {
	br := bytes.NewReader(raw)
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, invalidf("TOC: %v", err)
	}
	zr.Multistream(false)
	tr := tar.NewReader(zr)
	h, err := tr.Next()
	if err != nil {
		return nil, invalidf("TOC: %v", err)
	}
	if h.Name != tocTarName || h.Typeflag != tar.TypeReg {
		return nil, invalidf("TOC: %w (first entry is %q)", ErrTOCNotFound, h.Name)
	}
	if h.Size > limit {
		return nil, limitf("TOC of %d bytes exceeds %d", h.Size, limit)
	}
	// The size the header claims sizes the buffer only as far as the compressed TOC could
	// plausibly hold it; beyond that, the buffer grows with the data actually read.
	buf := bytes.NewBuffer(make([]byte, 0, min(h.Size, maxTOCRatio*int64(len(raw)))+bytes.MinRead))
	if _, err := buf.ReadFrom(tr); err != nil {
		return nil, invalidf("TOC: %v", err)
	}
	out := buf.Bytes()
	if _, err := tr.Next(); err != io.EOF {
		return nil, invalidf("TOC: the TOC member holds more than stargz.index.json (%v)", err)
	}
	// The end blocks, then the member's CRC and size.
	if n, err := io.Copy(io.Discard, io.LimitReader(zr, 1<<20)); err != nil || n >= 1<<20 {
		return nil, invalidf("TOC: bad end of the TOC member (%d bytes, %v)", n, err)
	}
	if br.Len() != 0 {
		return nil, invalidf("TOC: %d bytes after the TOC member", br.Len())
	}
	return out, nil
}

func readCapped(r io.Reader, limit, sizeHint int64) ([]byte, error) {
	var buf bytes.Buffer
	// The size the layout states, when within the limit, saves the doublings (and the
	// clearing of each new buffer) of a TOC of hundreds of megabytes.
	if sizeHint > 0 && sizeHint <= limit {
		buf.Grow(int(sizeHint) + bytes.MinRead)
	}
	n, err := io.Copy(&buf, io.LimitReader(r, limit+1))
	if err != nil {
		return nil, invalidf("TOC: %w", err)
	}
	if n > limit {
		return nil, limitf("TOC decompresses to more than %d bytes", limit)
	}
	return buf.Bytes(), nil
}
