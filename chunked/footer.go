package chunked

import (
	"bytes"
	stdgzip "compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/klauspost/compress/gzip"
	"github.com/layerstore/layerstore/internal/byterange"
)

// Footer sizes of the formats. The zstd footers are the payload of a skippable frame whose
// 8-byte header precedes them.
const (
	EStargzFooterSize       = 51
	LegacyStargzFooterSize  = 47
	ZstdFooterSize          = 40
	ZstdChunkedFooterSize   = 64
	skippableHeaderSize     = 8
	maxFooterSize           = ZstdChunkedFooterSize + skippableHeaderSize
	stargzFooterSubfieldLen = 22
)

var (
	skippableMagic      = []byte{0x50, 0x2a, 0x4d, 0x18}
	legacyZstdMagic     = []byte("GnUlInUx")
	zstdChunkedMagic    = []byte("GNUlInUx")
	stargzFooterTrailer = "STARGZ"
)

// Footer is what a blob's footer says.
type Footer struct {
	Size                 int64 // bytes at the end of the blob taken by the footer (incl. frame header)
	TOC                  byterange.Range
	TOCUncompressed      int64           // 0 for eStargz, whose footer does not say
	TarSplit             byterange.Range // zero Length when the footer has none
	TarSplitUncompressed int64
	// TarSplitFields reports a footer that has tar-split fields (the 64-byte one), even zero.
	TarSplitFields bool
}

// TailSize is how many bytes from the end of a blob [ParseFooter] needs: enough for every footer
// variant of the format.
func TailSize(f Format) int64 {
	if f == EStargz {
		return EStargzFooterSize
	}
	return maxFooterSize
}

// ParseFooter parses the footer of a blob of blobSize bytes in format f from tail, the last
// bytes of the blob (at least [TailSize] bytes, or the whole blob if it is smaller).
func ParseFooter(f Format, tail []byte, blobSize int64) (Footer, error) {
	if int64(len(tail)) > blobSize {
		return Footer{}, invalidf("footer: %d tail bytes for a %d-byte blob", len(tail), blobSize)
	}
	var (
		ft  Footer
		err error
	)
	switch f {
	case EStargz:
		ft, err = parseStargzFooter(tail, blobSize)
	case StargzZstd, ZstdChunkedLegacy:
		ft, err = legacyFooter.parse(tail, blobSize)
	case ZstdChunked:
		// c/storage 1.44-1.46 wrote the 40-byte footer with the io.github keys, 1.47-1.49 the
		// 56-byte one; the first error, the modern footer's, is the one reported.
		if ft, err = modernFooter.parse(tail, blobSize); err != nil {
			for _, f := range []zstdFooter{footer56, legacyFooter} {
				if ft2, err2 := f.parse(tail, blobSize); err2 == nil {
					ft, err = ft2, nil
					break
				}
			}
		}
	default:
		err = invalidf("footer: unknown format")
	}
	if err != nil {
		return Footer{}, err
	}
	return ft, nil
}

func parseStargzFooter(tail []byte, blobSize int64) (Footer, error) {
	var firstErr error
	for _, size := range []int{EStargzFooterSize, LegacyStargzFooterSize} {
		if len(tail) < size {
			continue
		}
		off, err := stargzTOCOffset(tail[len(tail)-size:], size == EStargzFooterSize)
		if err == nil {
			end := blobSize - int64(size)
			if off >= end {
				return Footer{}, invalidf("eStargz footer: TOC offset %d is past the data end %d", off, end)
			}
			return Footer{Size: int64(size), TOC: byterange.Range{Offset: off, Length: end - off}}, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		firstErr = invalidf("eStargz footer: blob too small")
	}
	return Footer{}, firstErr
}

// stargzTOCOffset reads the TOC offset from an empty gzip member whose extra field holds
// "%016xSTARGZ", inside an "SG" subfield (current) or raw (legacy stargz). Every producer
// writes it with Go's gzip; anything but those exact bytes is refused, so that no byte of the
// footer can change unnoticed.
func stargzTOCOffset(b []byte, subfield bool) (int64, error) {
	off, err := parseStargzFooterMember(b, subfield)
	if err != nil {
		return 0, err
	}
	if !bytes.Equal(b, stargzFooterBytes(off, subfield)) {
		return 0, invalidf("eStargz footer: not in the canonical form")
	}
	return off, nil
}

// stargzFooterBytes returns the footer the producers write for a TOC offset.
func stargzFooterBytes(off int64, subfield bool) []byte {
	var buf bytes.Buffer
	zw, _ := stdgzip.NewWriterLevel(&buf, stdgzip.NoCompression)
	extra := []byte(fmt.Sprintf("%016x%s", off, stargzFooterTrailer))
	if subfield {
		extra = append([]byte{'S', 'G', stargzFooterSubfieldLen, 0}, extra...)
	}
	zw.Header.Extra = extra
	zw.Close()
	return buf.Bytes()
}

func parseStargzFooterMember(b []byte, subfield bool) (int64, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return 0, invalidf("eStargz footer: %v", err)
	}
	zr.Multistream(false)
	if n, err := io.Copy(io.Discard, io.LimitReader(zr, 1)); err != nil || n != 0 {
		return 0, invalidf("eStargz footer: not an empty gzip member (%d bytes, %v)", n, err)
	}
	extra := zr.Header.Extra
	if subfield {
		if len(extra) != 4+stargzFooterSubfieldLen || extra[0] != 'S' || extra[1] != 'G' ||
			binary.LittleEndian.Uint16(extra[2:4]) != stargzFooterSubfieldLen {
			return 0, invalidf("eStargz footer: extra field is not an SG subfield")
		}
		extra = extra[4:]
	}
	if len(extra) != stargzFooterSubfieldLen || string(extra[16:]) != stargzFooterTrailer {
		return 0, invalidf("eStargz footer: no STARGZ marker")
	}
	off, err := strconv.ParseUint(string(extra[:16]), 16, 63)
	if err != nil {
		return 0, invalidf("eStargz footer: TOC offset %q: %v", extra[:16], err)
	}
	return int64(off), nil
}

// zstdFooter is one generation's footer: the payload of a skippable frame.
type zstdFooter struct {
	size   int    // payload bytes
	fields int    // little-endian uint64 fields at the start
	magic  []byte // follows the fields; zero bytes pad the rest
}

var (
	// legacyFooter: c/storage <= 1.46 and stargz-zstd.
	legacyFooter = zstdFooter{size: ZstdFooterSize, fields: 4, magic: legacyZstdMagic}
	// footer56: c/storage 1.47-1.49, the legacy layout padded with 16 zero bytes.
	footer56 = zstdFooter{size: 56, fields: 4, magic: legacyZstdMagic}
	// modernFooter: c/storage >= 1.50, with the tar-split position.
	modernFooter = zstdFooter{size: ZstdChunkedFooterSize, fields: 7, magic: zstdChunkedMagic}
)

// parse reads the footer at the end of tail: offset, compressed and uncompressed length and
// type of the TOC, then (7 fields) the tar-split's offset and lengths.
func (f zstdFooter) parse(tail []byte, blobSize int64) (Footer, error) {
	total := f.size + skippableHeaderSize
	if len(tail) < total {
		return Footer{}, invalidf("zstd footer: blob too small")
	}
	frame := tail[len(tail)-total:]
	b := frame[skippableHeaderSize:]
	if !bytes.Equal(frame[:4], skippableMagic) || binary.LittleEndian.Uint32(frame[4:8]) != uint32(f.size) {
		return Footer{}, invalidf("zstd footer: not in a %d-byte skippable frame", f.size)
	}
	magicEnd := 8*f.fields + len(f.magic)
	if !bytes.Equal(b[8*f.fields:magicEnd], f.magic) {
		return Footer{}, invalidf("zstd footer: bad magic %q", b[8*f.fields:magicEnd])
	}
	if !bytes.Equal(b[magicEnd:], make([]byte, f.size-magicEnd)) {
		return Footer{}, invalidf("zstd footer: non-zero padding")
	}
	var v [7]int64
	for i := range f.fields {
		u := binary.LittleEndian.Uint64(b[8*i:])
		bound := uint64(blobSize)
		if i == 2 || i == 6 { // uncompressed sizes: bounded by the limits when decompressing
			bound = math.MaxInt64
		}
		if u > bound {
			return Footer{}, invalidf("zstd footer: field %d (%d) exceeds the blob size %d", i, u, blobSize)
		}
		v[i] = int64(u)
	}
	if v[3] != 1 {
		return Footer{}, invalidf("zstd footer: manifest type %d is not a TOC", v[3])
	}
	end := blobSize - int64(total)
	ft := Footer{Size: int64(total), TOC: byterange.Range{Offset: v[0], Length: v[1]}, TOCUncompressed: v[2]}
	if ft.TOC.Length <= 0 || !ft.TOC.Within(end) {
		return Footer{}, invalidf("zstd footer: TOC range %d+%d outside the data end %d", v[0], v[1], end)
	}
	ft.TarSplitFields = f.fields == 7
	if ft.TarSplitFields && v[5] > 0 {
		ft.TarSplit, ft.TarSplitUncompressed = byterange.Range{Offset: v[4], Length: v[5]}, v[6]
		if !ft.TarSplit.Within(end) {
			return Footer{}, invalidf("zstd footer: tar-split range %d+%d outside the data end %d", v[4], v[5], end)
		}
	}
	return ft, nil
}

// ApplyFooter completes the layout from the blob's footer and cross-checks it: positions known
// from annotations must equal the footer's. tail is the last [TailSize] bytes of the blob.
func (l *Layout) ApplyFooter(tail []byte) error {
	ft, err := ParseFooter(l.Format, tail, l.BlobSize)
	if err != nil {
		return err
	}
	if err := crossCheck("TOC", l.TOC, l.TOCUncompressed, ft.TOC, ft.TOCUncompressed); err != nil {
		return err
	}
	l.TOC = ft.TOC
	if ft.TOCUncompressed != 0 {
		l.TOCUncompressed = ft.TOCUncompressed
	}
	if l.Format == ZstdChunked && ft.TarSplitFields {
		if err := crossCheck("tar-split", l.TarSplit, l.TarSplitUncompressed, ft.TarSplit, ft.TarSplitUncompressed); err != nil {
			return err
		}
		l.TarSplit, l.TarSplitUncompressed = ft.TarSplit, ft.TarSplitUncompressed
	}
	if end := l.BlobSize - ft.Size; !l.TOC.Within(end) || !l.TarSplit.Within(end) {
		return invalidf("TOC or tar-split overlaps the footer")
	}
	return nil
}

func crossCheck(what string, ann byterange.Range, annU int64, ft byterange.Range, ftU int64) error {
	if ann.Length == 0 {
		return nil
	}
	if ann != ft || (annU != 0 && ftU != 0 && annU != ftU) {
		return invalidf("%s position in the annotations (%d+%d, %d) differs from the footer (%d+%d, %d)",
			what, ann.Offset, ann.Length, annU, ft.Offset, ft.Length, ftU)
	}
	return nil
}

// PayloadEnd is the offset where file data ends: the start of the TOC (eStargz) or of the
// skippable frame holding it.
func (l *Layout) PayloadEnd() int64 {
	if l.Format == EStargz {
		return l.TOC.Offset
	}
	return l.TOC.Offset - skippableHeaderSize
}

func (l *Layout) String() string {
	return fmt.Sprintf("%s layer %s", l.Format, l.BlobDigest)
}
