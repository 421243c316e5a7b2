package chunked

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"hash"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/layerstore/layerstore/internal/readahead"
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
	zr, err := newTOCReader(l, &consumed{b: raw}, lim)
	if err != nil {
		return nil, err
	}
	defer zr.release()
	out, err := readCapped(zr, lim.MaxTOCSize, tocSizeHint(l, int64(len(raw)), lim))
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

// tocSizeHint returns the TOC's uncompressed size the layout states when a compressed TOC of
// size bytes could plausibly hold it (a manifest alone must not make the daemon allocate up
// to the limit), else 0.
func tocSizeHint(l *Layout, size int64, lim Limits) int64 {
	if h := l.TOCUncompressed; h > 0 && h <= maxTOCRatio*size && h <= lim.MaxTOCSize {
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

// consumed reads b and lets go of it at its end: the compressed TOC (tens of MB for a million
// entries) is not live while the index is built from what it decompressed to, whoever holds
// the decoder (unless the caller holds it). The decoder reads it as a stream, whatever its
// size, where given the bytes whole it decodes a TOC of less than 5 MB compressed whole, into
// one buffer of its decompressed size.
type consumed struct{ b []byte }

func (c *consumed) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		c.b = nil
		return 0, io.EOF
	}
	n := copy(p, c.b)
	c.b = c.b[n:]
	return n, nil
}

// newTOCReader returns a reader of the zstd TOC r yields, decompressed as it is read, on the
// reader's goroutine: a decoder of more goroutines holds more windows (3 MiB more at the end
// of a million-entry TOC, where the daemon's peak was) and is no faster on two cores, where
// the parse's own two goroutines take them.
func newTOCReader(l *Layout, r io.Reader, lim Limits) (*tocReader, error) {
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1),
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
	if t.dec == nil {
		return 0, io.EOF // released
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

// release lets go of the decoder once the TOC is read to its end (the decoder's windows and
// buffers, some 11 MB for a million-entry TOC, are then not live while the index is built):
// Read returns io.EOF after.
func (t *tocReader) release() {
	if t.dec != nil {
		t.dec.Close()
		t.dec = nil
	}
}

// extractStargzTOC reads the TOC member to its end, so that the gzip CRC covers every byte
// of it: the tar header, the JSON, the padding and the end blocks.
func extractStargzTOC(raw []byte, limit int64) ([]byte, error) {
	m, err := openStargzTOC(bytes.NewReader(raw), int64(len(raw)), limit)
	if err != nil {
		return nil, err
	}
	// The size the header claims sizes the buffer only as far as the compressed TOC could
	// plausibly hold it; beyond that, the buffer grows with the data actually read.
	buf := bytes.NewBuffer(make([]byte, 0, m.sizeHint()+bytes.MinRead))
	if _, err := buf.ReadFrom(m.tr); err != nil {
		return nil, invalidf("TOC: %v", err)
	}
	if err := m.finish(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// stargzMember is an eStargz TOC member opened at the start of its JSON: m.tr yields the
// JSON (to the size its tar header states, within the limit), then m.finish checks the rest.
type stargzMember struct {
	br    *bufio.Reader // the compressed member, and nothing after it
	zr    *gzip.Reader
	tr    *tar.Reader
	csize int64 // the compressed member's size
	size  int64 // the JSON's size, as the tar header states it
}

// openStargzTOC opens the TOC member of csize bytes r yields, which it reads as a stream.
func openStargzTOC(r io.Reader, csize, limit int64) (*stargzMember, error) {
	m := &stargzMember{br: bufio.NewReaderSize(r, stargzReadBuffer), csize: csize}
	var err error
	if m.zr, err = gzip.NewReader(m.br); err != nil {
		return nil, invalidf("TOC: %v", err)
	}
	m.zr.Multistream(false)
	m.tr = tar.NewReader(m.zr)
	h, err := m.tr.Next()
	if err != nil {
		return nil, invalidf("TOC: %v", err)
	}
	if h.Name != tocTarName || h.Typeflag != tar.TypeReg {
		return nil, invalidf("TOC: %w (first entry is %q)", ErrTOCNotFound, h.Name)
	}
	if h.Size > limit {
		return nil, limitf("TOC of %d bytes exceeds %d", h.Size, limit)
	}
	m.size = h.Size
	return m, nil
}

// stargzReadBuffer is how much of a compressed eStargz TOC its decompressor reads at once.
const stargzReadBuffer = 64 << 10

// sizeHint is the JSON's size the tar header states, as far as the compressed TOC could
// plausibly hold it (a header alone must not make the daemon allocate up to the limit).
func (m *stargzMember) sizeHint() int64 { return min(m.size, maxTOCRatio*m.csize) }

// finish checks what follows the JSON, once read: nothing more in the tar, the end blocks,
// then the member's CRC and size, and nothing after the member.
func (m *stargzMember) finish() error {
	if _, err := m.tr.Next(); err != io.EOF {
		return invalidf("TOC: the TOC member holds more than stargz.index.json (%v)", err)
	}
	if n, err := io.Copy(io.Discard, io.LimitReader(m.zr, 1<<20)); err != nil || n >= 1<<20 {
		return invalidf("TOC: bad end of the TOC member (%d bytes, %v)", n, err)
	}
	switch _, err := m.br.ReadByte(); {
	case err == nil:
		return invalidf("TOC: bytes after the TOC member")
	case err != io.EOF:
		return invalidf("TOC: %v", err)
	}
	return nil
}

// streamBlock is the size of the blocks in which a TOC is decompressed on one goroutine and
// parsed on another, and streamBlocks how many are under way at most.
const (
	streamBlock  = 256 << 10
	streamBlocks = 4
)

// newStargzStream decompresses the TOC member m on a goroutine of its own, writing its JSON to
// h (when not nil), while the caller reads the JSON (and parses it), in blocks of streamBlock
// bytes, at most streamBlocks of them under way.
func newStargzStream(m *stargzMember, h hash.Hash) *readahead.Reader {
	return readahead.New(streamBlocks, func(b []byte) ([]byte, error) {
		if b == nil {
			b = make([]byte, streamBlock)
		}
		n, err := fill(m.tr, b)
		if h != nil {
			h.Write(b[:n])
		}
		switch {
		case err == io.EOF:
			if err := m.finish(); err != nil {
				return b[:n], err
			}
			return b[:n], io.EOF
		case err != nil:
			return b[:n], invalidf("TOC: %v", err)
		}
		return b[:n], nil
	}, nil)
}

// fill reads into b until it is full or r fails (io.EOF at its end).
func fill(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
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
