package chunked_test

import (
	"bytes"
	"compress/gzip"
	_ "crypto/sha512" // for digest.SHA512

	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	digest "github.com/opencontainers/go-digest"
)

// stargzFooterExtra returns an empty gzip member whose extra field is extra, written as
// estargz writes its footer (no compression, so that the member has a fixed size).
func stargzFooterExtra(t testing.TB, extra []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.NoCompression)
	if err != nil {
		t.Fatal(err)
	}
	zw.Header.Extra = extra
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// stargzFooter returns the eStargz footer (51 bytes, "SG" subfield) or the legacy stargz one
// (47 bytes, raw extra field) pointing at a TOC at off.
func stargzFooter(t testing.TB, off int64, legacy bool) []byte {
	t.Helper()
	s := fmt.Sprintf("%016xSTARGZ", off)
	if legacy {
		return stargzFooterExtra(t, []byte(s))
	}
	return stargzFooterExtra(t, sgSubfield(s))
}

func sgSubfield(s string) []byte {
	return append([]byte{'S', 'G', byte(len(s)), byte(len(s) >> 8)}, s...)
}

// zstdFooter returns a zstd footer in its skippable frame: the 40-byte one (4 fields, magic
// GnUlInUx) or the modern 64-byte one (7 fields, magic GNUlInUx).
func zstdFooter(modern bool, fields ...uint64) []byte {
	n, magic := 4, "GnUlInUx"
	if modern {
		n, magic = 7, "GNUlInUx"
	}
	if len(fields) != n {
		panic("zstdFooter: wrong number of fields")
	}
	b := []byte{0x50, 0x2a, 0x4d, 0x18}
	b = binary.LittleEndian.AppendUint32(b, uint32(8*n+8))
	for _, f := range fields {
		b = binary.LittleEndian.AppendUint64(b, f)
	}
	return append(b, magic...)
}

func withPrefix(n int, b []byte) []byte { return append(bytes.Repeat([]byte{0xAA}, n), b...) }

func TestParseFooterFixtures(t *testing.T) {
	wantSize := map[string]int64{
		"zstdchunked-modern": 72, "zstdchunked-notarsplit": 48, "zstdchunked-legacy": 48,
		"estargz": 51, "estargz-prioritized": 51, "estargz-minchunk": 51, "estargz-zstd": 48, "estargz-zstd-annotated": 48,
	}
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			size := int64(len(f.Blob))
			tail := f.Blob[size-chunked.TailSize(f.Format):]
			ft, err := chunked.ParseFooter(f.Format, tail, size)
			if err != nil {
				t.Fatal(err)
			}
			if ft.Size != wantSize[f.Name] {
				t.Errorf("footer size = %d, want %d", ft.Size, wantSize[f.Name])
			}
			if f.Format == chunked.EStargz {
				if !bytes.HasPrefix(f.Blob[ft.TOC.Offset:], []byte{0x1f, 0x8b}) || ft.TOC.End() != size-ft.Size || ft.TOCUncompressed != 0 {
					t.Errorf("eStargz TOC %+v (%d) is not the gzip member before the footer", ft.TOC, ft.TOCUncompressed)
				}
				if got := stargzFooter(t, ft.TOC.Offset, false); !bytes.Equal(got, tail) {
					t.Errorf("footer\n %x\nwant (as estargz writes it)\n %x", tail, got)
				}
			} else {
				checkSkippable(t, f.Blob, "TOC", ft.TOC)
				if ft.TOCUncompressed <= 0 {
					t.Errorf("TOC uncompressed size = %d", ft.TOCUncompressed)
				}
			}
			for _, k := range []string{chunked.AnnotationPosition, chunked.AnnotationLegacyPosition} {
				if p, ok := f.Desc.Annotations[k]; ok {
					if want := fmt.Sprintf("%d:%d:%d:1", ft.TOC.Offset, ft.TOC.Length, ft.TOCUncompressed); p != want {
						t.Errorf("%s = %q, the footer says %q", k, p, want)
					}
				}
			}
			if p, ok := f.Desc.Annotations[chunked.AnnotationTarSplitPosition]; ok {
				if want := fmt.Sprintf("%d:%d:%d", ft.TarSplit.Offset, ft.TarSplit.Length, ft.TarSplitUncompressed); p != want {
					t.Errorf("tar-split position %q, the footer says %q", p, want)
				}
				checkSkippable(t, f.Blob, "tar-split", ft.TarSplit)
			} else if ft.TarSplit != (byterange.Range{}) || ft.TarSplitUncompressed != 0 {
				t.Errorf("footer has a tar-split %+v, the annotations do not", ft.TarSplit)
			}
			// Any tail from the footer's own size to the whole blob reads the same.
			for _, n := range []int64{ft.Size, ft.Size + 1, 100, 4096, size} {
				got, err := chunked.ParseFooter(f.Format, f.Blob[size-n:], size)
				if err != nil || got != ft {
					t.Errorf("tail of %d bytes: %+v, %v; want %+v", n, got, err, ft)
				}
			}
			if _, err := chunked.ParseFooter(f.Format, f.Blob[size-ft.Size+1:], size); !errors.Is(err, chunked.ErrInvalid) {
				t.Errorf("tail one byte short of the footer: %v, want ErrInvalid", err)
			}
		})
	}
}

// checkSkippable checks that r is a zstd frame right after a skippable-frame header of its length.
func checkSkippable(t *testing.T, blob []byte, what string, r byterange.Range) {
	t.Helper()
	h := blob[r.Offset-8 : r.Offset]
	if !bytes.Equal(h[:4], []byte{0x50, 0x2a, 0x4d, 0x18}) || int64(binary.LittleEndian.Uint32(h[4:])) != r.Length {
		t.Errorf("%s %+v: header %x is not a skippable frame of that length", what, r, h)
	}
	if !bytes.HasPrefix(blob[r.Offset:], []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		t.Errorf("%s %+v: no zstd frame at the offset", what, r)
	}
}

func TestParseFooterAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format chunked.Format
		tail   []byte
		size   int64
		want   chunked.Footer
	}{
		{"eStargz", chunked.EStargz, stargzFooter(t, 1000, false), 5000,
			chunked.Footer{Size: 51, TOC: byterange.Range{Offset: 1000, Length: 5000 - 51 - 1000}}},
		{"eStargz TOC at 0", chunked.EStargz, stargzFooter(t, 0, false), 52,
			chunked.Footer{Size: 51, TOC: byterange.Range{Offset: 0, Length: 1}}},
		{"legacy stargz", chunked.EStargz, stargzFooter(t, 1000, true), 5000,
			chunked.Footer{Size: 47, TOC: byterange.Range{Offset: 1000, Length: 5000 - 47 - 1000}}},
		{"legacy stargz after data", chunked.EStargz, withPrefix(4, stargzFooter(t, 1000, true)), 5000,
			chunked.Footer{Size: 47, TOC: byterange.Range{Offset: 1000, Length: 5000 - 47 - 1000}}},
		{"stargz-zstd", chunked.StargzZstd, zstdFooter(false, 100, 50, 300, 1), 1000,
			chunked.Footer{Size: 48, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 300}},
		{"legacy zstd:chunked", chunked.ZstdChunkedLegacy, withPrefix(24, zstdFooter(false, 100, 50, 300, 1)), 1000,
			chunked.Footer{Size: 48, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 300}},
		{"zstd TOC up to the footer", chunked.ZstdChunkedLegacy, zstdFooter(false, 900, 52, 0, 1), 1000,
			chunked.Footer{Size: 48, TOC: byterange.Range{Offset: 900, Length: 52}}},
		{"zstd:chunked", chunked.ZstdChunked, zstdFooter(true, 100, 50, 300, 1, 158, 20, 400), 1000,
			chunked.Footer{Size: 72, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 300,
				TarSplit: byterange.Range{Offset: 158, Length: 20}, TarSplitUncompressed: 400, TarSplitFields: true}},
		{"zstd:chunked without tar-split", chunked.ZstdChunked, zstdFooter(true, 100, 50, 300, 1, 0, 0, 0), 1000,
			chunked.Footer{Size: 72, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 300, TarSplitFields: true}},
		{"zstd:chunked tar-split of length 0 ignored", chunked.ZstdChunked, zstdFooter(true, 100, 50, 300, 1, 999, 0, 999), 1000,
			chunked.Footer{Size: 72, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 300, TarSplitFields: true}},
		{"zstd:chunked with the 56-byte footer of c/storage 1.47", chunked.ZstdChunked,
			withPrefix(8, append(append([]byte{0x50, 0x2a, 0x4d, 0x18, 56, 0, 0, 0}, zstdFooter(false, 100, 50, 300, 1)[8:]...), make([]byte, 16)...)), 1000,
			chunked.Footer{Size: 64, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 300}},
		{"zstd:chunked with the 40-byte footer", chunked.ZstdChunked, withPrefix(24, zstdFooter(false, 100, 50, 300, 1)), 1000,
			chunked.Footer{Size: 48, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 300}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chunked.ParseFooter(tc.format, tc.tail, tc.size)
			if err != nil || got != tc.want {
				t.Errorf("ParseFooter = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseFooterRejects(t *testing.T) {
	modern := func(v ...uint64) []byte { return zstdFooter(true, v...) }
	legacy := func(v ...uint64) []byte { return zstdFooter(false, v...) }
	patch := func(b []byte, i int, v byte) []byte { b = bytes.Clone(b); b[i] = v; return b }
	for _, tc := range []struct {
		name   string
		format chunked.Format
		tail   []byte
		size   int64
		msg    string
	}{
		{"unknown format", chunked.FormatUnknown, legacy(100, 50, 300, 1), 1000, "unknown format"},
		{"unknown format number", chunked.Format(9), legacy(100, 50, 300, 1), 1000, "unknown format"},
		{"tail longer than the blob", chunked.EStargz, stargzFooter(t, 0, false), 50, "tail bytes"},
		{"negative blob size", chunked.ZstdChunked, nil, -1, "tail bytes"},
		{"empty tail", chunked.EStargz, nil, 1000, "too small"},
		{"empty zstd tail", chunked.ZstdChunked, nil, 1000, "too small"},
		{"eStargz tail too short", chunked.EStargz, stargzFooter(t, 0, false)[5:], 1000, ""},
		{"eStargz TOC at the data end", chunked.EStargz, stargzFooter(t, 949, false), 1000, "past the data end"},
		{"eStargz TOC past the blob", chunked.EStargz, stargzFooter(t, 1<<40, false), 1000, "past the data end"},
		{"eStargz TOC offset over int63", chunked.EStargz, stargzFooterExtra(t, sgSubfield("8000000000000000STARGZ")), 1000, "TOC offset"},
		{"eStargz TOC offset with a sign", chunked.EStargz, stargzFooterExtra(t, sgSubfield("+000000000000001STARGZ")), 1000, "TOC offset"},
		{"eStargz TOC offset not hex", chunked.EStargz, stargzFooterExtra(t, sgSubfield("000000000000000gSTARGZ")), 1000, "TOC offset"},
		{"eStargz TOC offset with spaces", chunked.EStargz, stargzFooterExtra(t, sgSubfield("             3e8STARGZ")), 5000, "TOC offset"},
		{"eStargz uppercase hex", chunked.EStargz, stargzFooterExtra(t, sgSubfield("00000000000003E8STARGZ")), 5000, "canonical"},
		{"eStargz mtime set", chunked.EStargz, patch(stargzFooter(t, 1000, false), 4, 1), 5000, "canonical"},
		{"eStargz OS byte", chunked.EStargz, patch(stargzFooter(t, 1000, false), 9, 3), 5000, "canonical"},
		{"legacy stargz OS byte", chunked.EStargz, patch(stargzFooter(t, 1000, true), 9, 3), 5000, "canonical"},
		{"eStargz no STARGZ marker", chunked.EStargz, stargzFooterExtra(t, sgSubfield("0000000000000000STARGX")), 1000, "STARGZ"},
		{"eStargz wrong subfield id", chunked.EStargz, patch(stargzFooter(t, 0, false), 12, 'X'), 1000, "SG subfield"},
		{"eStargz subfield length 21", chunked.EStargz, patch(stargzFooter(t, 0, false), 14, 21), 1000, "SG subfield"},
		{"eStargz not gzip", chunked.EStargz, bytes.Repeat([]byte("x"), 51), 1000, "eStargz footer"},
		{"eStargz footer with content", chunked.EStargz, nonEmptyFooter(t), 1000, "eStargz footer"},
		{"eStargz bad CRC", chunked.EStargz, patch(stargzFooter(t, 0, false), 44, 1), 1000, "eStargz footer"},
		{"eStargz footer for a zstd format", chunked.ZstdChunked, withPrefix(21, stargzFooter(t, 0, false)), 1000, "skippable frame"},
		{"zstd tail too short", chunked.StargzZstd, legacy(100, 50, 300, 1)[1:], 1000, "too small"},
		{"zstd bad skippable magic", chunked.StargzZstd, patch(legacy(100, 50, 300, 1), 0, 0x51), 1000, "skippable frame"},
		{"zstd other skippable frame", chunked.StargzZstd, patch(legacy(100, 50, 300, 1), 0, 0x5f), 1000, "skippable frame"},
		{"zstd wrong frame length", chunked.ZstdChunkedLegacy, patch(legacy(100, 50, 300, 1), 4, 41), 1000, "skippable frame"},
		{"zstd bad magic", chunked.ZstdChunkedLegacy, patch(legacy(100, 50, 300, 1), 47, 'y'), 1000, "magic"},
		{"zstd modern magic in the 40-byte footer", chunked.ZstdChunkedLegacy, patch(legacy(100, 50, 300, 1), 41, 'N'), 1000, "magic"},
		{"zstd manifest type 0", chunked.ZstdChunkedLegacy, legacy(100, 50, 300, 0), 1000, "manifest type 0"},
		{"zstd manifest type 2", chunked.StargzZstd, legacy(100, 50, 300, 2), 1000, "manifest type 2"},
		{"zstd TOC offset past the blob", chunked.ZstdChunkedLegacy, legacy(1001, 50, 300, 1), 1000, "exceeds the blob size"},
		{"zstd TOC length past the blob", chunked.ZstdChunkedLegacy, legacy(100, 1001, 300, 1), 1000, "exceeds the blob size"},
		{"zstd TOC offset of 2^64-1", chunked.ZstdChunkedLegacy, legacy(math.MaxUint64, 50, 300, 1), 1000, "exceeds the blob size"},
		{"zstd empty TOC", chunked.ZstdChunkedLegacy, legacy(100, 0, 300, 1), 1000, "outside the data end"},
		{"zstd TOC over the footer", chunked.ZstdChunkedLegacy, legacy(900, 53, 300, 1), 1000, "outside the data end"},
		{"zstd TOC at the blob end", chunked.StargzZstd, legacy(1000, 1, 300, 1), 1000, "outside the data end"},
		{"zstd:chunked TOC over the footer", chunked.ZstdChunked, modern(900, 29, 300, 1, 0, 0, 0), 1000, "outside the data end"},
		{"zstd:chunked tar-split over the footer", chunked.ZstdChunked, modern(100, 50, 300, 1, 900, 29, 400), 1000, "tar-split"},
		{"zstd:chunked tar-split past the blob", chunked.ZstdChunked, modern(100, 50, 300, 1, 1001, 1, 400), 1000, "exceeds the blob size"},
		{"zstd:chunked manifest type 0", chunked.ZstdChunked, modern(100, 50, 300, 0, 0, 0, 0), 1000, "manifest type"},
		{"modern footer for stargz-zstd", chunked.StargzZstd, modern(100, 50, 300, 1, 0, 0, 0), 1000, "skippable frame"},
		{"modern footer for legacy zstd:chunked", chunked.ZstdChunkedLegacy, modern(100, 50, 300, 1, 0, 0, 0), 1000, "skippable frame"},
		{"zstd:chunked legacy magic in the 64-byte footer", chunked.ZstdChunked, patch(modern(100, 50, 300, 1, 0, 0, 0), 65, 'n'), 1000, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chunked.ParseFooter(tc.format, tc.tail, tc.size)
			if !errors.Is(err, chunked.ErrInvalid) {
				t.Fatalf("ParseFooter = %+v, %v; want ErrInvalid", got, err)
			}
			if got != (chunked.Footer{}) {
				t.Errorf("ParseFooter returned %+v with its error", got)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("ParseFooter error %q, want it to mention %q", err, tc.msg)
			}
		})
	}
}

// nonEmptyFooter returns a 51-byte gzip member shaped like the eStargz footer but holding one
// byte of content.
func nonEmptyFooter(t *testing.T) []byte {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.NoCompression)
	if err != nil {
		t.Fatal(err)
	}
	zw.Header.Extra = sgSubfield("0000000000000000STARGZ")
	if _, err := zw.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	return b[len(b)-51:]
}

// TestParseFooterOverflow: a range whose end overflows int64 must not pass the bounds check.
func TestParseFooterOverflow(t *testing.T) {
	const size = math.MaxInt64
	for _, tc := range []struct {
		name   string
		format chunked.Format
		tail   []byte
	}{
		{"TOC", chunked.ZstdChunkedLegacy, zstdFooter(false, size-100, 1000, 0, 1)},
		{"TOC modern", chunked.ZstdChunked, zstdFooter(true, size-100, 1000, 0, 1, 0, 0, 0)},
		{"tar-split", chunked.ZstdChunked, zstdFooter(true, 100, 50, 0, 1, size-100, 1000, 0)},
	} {
		ft, err := chunked.ParseFooter(tc.format, tc.tail, size)
		if !errors.Is(err, chunked.ErrInvalid) {
			t.Errorf("%s: ParseFooter = %+v, %v; want ErrInvalid", tc.name, ft, err)
		}
		l := &chunked.Layout{Format: tc.format, BlobSize: size}
		if err := l.ApplyFooter(tc.tail); !errors.Is(err, chunked.ErrInvalid) {
			t.Errorf("%s: ApplyFooter = %v (TOC %+v); want ErrInvalid", tc.name, err, l.TOC)
		}
	}
}

// TestParseFooterLargeUncompressedSizes: the uncompressed sizes of the TOC and of the tar-split
// are not blob offsets; metadata compresses well, so they can exceed the blob's size.
func TestParseFooterLargeUncompressedSizes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format chunked.Format
		tail   []byte
		want   chunked.Footer
	}{
		{"TOC", chunked.ZstdChunkedLegacy, zstdFooter(false, 100, 50, 1<<20, 1),
			chunked.Footer{Size: 48, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 1 << 20}},
		{"stargz-zstd TOC", chunked.StargzZstd, zstdFooter(false, 100, 50, 5000, 1),
			chunked.Footer{Size: 48, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 5000}},
		{"tar-split", chunked.ZstdChunked, zstdFooter(true, 100, 50, 300, 1, 150, 200, 1<<30),
			chunked.Footer{Size: 72, TOC: byterange.Range{Offset: 100, Length: 50}, TOCUncompressed: 300,
				TarSplit: byterange.Range{Offset: 150, Length: 200}, TarSplitUncompressed: 1 << 30, TarSplitFields: true}},
	} {
		got, err := chunked.ParseFooter(tc.format, tc.tail, 1000)
		if err != nil || got != tc.want {
			t.Errorf("%s: ParseFooter = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

// classified returns a fixture's layout from its descriptor.
func classified(t *testing.T, d chunked.Descriptor) *chunked.Layout {
	t.Helper()
	l, err := chunked.Classify(d)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestFooterByteFlips flips each byte of each fixture's tail: ApplyFooter must then fail, or
// give exactly the same layout when the byte is one the format ignores (none since the
// eStargz footer must be byte for byte the canonical one, gzip MTIME, XFL and OS included).
func TestFooterByteFlips(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			orig := classified(t, f.Desc)
			tail := f.Blob[len(f.Blob)-int(chunked.TailSize(orig.Format)):]
			want := *orig
			if err := want.ApplyFooter(tail); err != nil {
				t.Fatal(err)
			}
			ft, err := chunked.ParseFooter(orig.Format, tail, orig.BlobSize)
			if err != nil {
				t.Fatal(err)
			}
			start := len(tail) - int(ft.Size) // where the footer starts in the tail
			// The layouts of eStargz and of annotated zstd layers know where the TOC is, or the
			// footer spells it in a way that no single flip keeps valid. The footer of a
			// stargz-zstd layer without annotations is all there is: a flipped offset is found
			// only later, when the TOC fails its digest.
			authenticated := orig.Format == chunked.EStargz || orig.TOC.Length > 0
			var detected, unauthenticated int
			var ignored []int
			for i := range tail {
				flipped := bytes.Clone(tail)
				flipped[i] ^= 0xff
				l := *orig
				err := l.ApplyFooter(flipped)
				switch {
				case err != nil:
					if !errors.Is(err, chunked.ErrInvalid) {
						t.Errorf("byte %d: error %v does not wrap ErrInvalid", i, err)
					}
					if i < start {
						t.Errorf("byte %d, before the footer: %v", i, err)
					}
					detected++
				case l == want:
					if i >= start {
						ignored = append(ignored, i-start)
					}
				case !authenticated && i >= start:
					unauthenticated++
				default:
					t.Errorf("byte %d: layout\n %+v\nwant\n %+v", i, l, want)
				}
			}
			t.Logf("%d-byte footer: %d flips detected, %d ignored (%v), %d changed the unauthenticated TOC position",
				ft.Size, detected, len(ignored), ignored, unauthenticated)
			if detected == 0 {
				t.Errorf("no flip detected")
			}
			if len(ignored) != 0 {
				t.Errorf("flips of footer bytes %v ignored, want every one detected", ignored)
			}
		})
	}
}

func TestApplyFooterFixtures(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l := classified(t, f.Desc)
			before := *l
			tail := f.Blob[len(f.Blob)-int(chunked.TailSize(l.Format)):]
			if err := l.ApplyFooter(tail); err != nil {
				t.Fatal(err)
			}
			ft, _ := chunked.ParseFooter(l.Format, tail, l.BlobSize)
			if l.TOC != ft.TOC || l.TarSplit != ft.TarSplit || l.TarSplitUncompressed != ft.TarSplitUncompressed {
				t.Errorf("layout %+v, footer %+v", l, ft)
			}
			if ft.TOCUncompressed != 0 && l.TOCUncompressed != ft.TOCUncompressed {
				t.Errorf("TOC uncompressed size %d, footer %d", l.TOCUncompressed, ft.TOCUncompressed)
			}
			if before.TOC.Length > 0 && before.TOC != l.TOC {
				t.Errorf("ApplyFooter moved the annotated TOC %+v to %+v", before.TOC, l.TOC)
			}
			if l.Format != before.Format || l.TOCDigest != before.TOCDigest || l.BlobDigest != before.BlobDigest || l.LegacyChecksum != before.LegacyChecksum {
				t.Errorf("ApplyFooter changed the identity: %+v -> %+v", before, l)
			}
			// The footer alone (no annotations) finds the same TOC.
			bare := &chunked.Layout{Format: l.Format, BlobSize: l.BlobSize}
			if err := bare.ApplyFooter(tail); err != nil || bare.TOC != l.TOC || bare.TarSplit != l.TarSplit {
				t.Errorf("from the footer alone: %+v, %v", bare, err)
			}
			if err := (&chunked.Layout{Format: l.Format, BlobSize: l.BlobSize}).ApplyFooter(make([]byte, len(tail))); !errors.Is(err, chunked.ErrInvalid) {
				t.Errorf("ApplyFooter(zeros) = %v, want ErrInvalid", err)
			}
		})
	}
}

func fixtureNamed(t *testing.T, name string) (chunked.Descriptor, []byte) {
	t.Helper()
	for _, f := range fixtures(t) {
		if f.Name == name {
			d := f.Desc
			d.Annotations = maps.Clone(d.Annotations)
			return d, f.Blob[len(f.Blob)-72:]
		}
	}
	t.Fatalf("no fixture %s", name)
	return chunked.Descriptor{}, nil
}

func TestApplyFooterDisagreement(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fixture string
		change  func(l *chunked.Layout)
		ok      bool
	}{
		{"TOC offset", "zstdchunked-modern", func(l *chunked.Layout) { l.TOC.Offset++ }, false},
		{"TOC length", "zstdchunked-modern", func(l *chunked.Layout) { l.TOC.Length-- }, false},
		{"TOC uncompressed size", "zstdchunked-modern", func(l *chunked.Layout) { l.TOCUncompressed++ }, false},
		{"TOC uncompressed size unknown", "zstdchunked-modern", func(l *chunked.Layout) { l.TOCUncompressed = 0 }, true},
		{"tar-split offset", "zstdchunked-modern", func(l *chunked.Layout) { l.TarSplit.Offset-- }, false},
		{"tar-split length", "zstdchunked-modern", func(l *chunked.Layout) { l.TarSplit.Length++ }, false},
		{"tar-split uncompressed size", "zstdchunked-modern", func(l *chunked.Layout) { l.TarSplitUncompressed-- }, false},
		{"tar-split unknown", "zstdchunked-modern", func(l *chunked.Layout) { l.TarSplit, l.TarSplitUncompressed = byterange.Range{}, 0 }, true},
		// A 40- or 56-byte footer has no tar-split fields to compare (c/storage 1.47-1.49 gave
		// the tar-split position only in the annotation).
		{"tar-split the footer cannot state", "zstdchunked-notarsplit", func(l *chunked.Layout) { l.TarSplit = byterange.Range{Offset: 100, Length: 10} }, true},
		{"legacy TOC offset", "zstdchunked-legacy", func(l *chunked.Layout) { l.TOC.Offset-- }, false},
		{"legacy TOC uncompressed size", "zstdchunked-legacy", func(l *chunked.Layout) { l.TOCUncompressed = 1 }, false},
		{"stargz-zstd TOC", "estargz-zstd-annotated", func(l *chunked.Layout) { l.TOC.Length++ }, false},
		{"format", "zstdchunked-modern", func(l *chunked.Layout) { l.Format = chunked.ZstdChunkedLegacy }, false},
		{"eStargz blob size", "estargz", func(l *chunked.Layout) { l.BlobSize = 1000 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, tail := fixtureNamed(t, tc.fixture)
			l := classified(t, d)
			tc.change(l)
			tail = tail[72-chunked.TailSize(l.Format):]
			err := l.ApplyFooter(tail)
			if tc.ok && err != nil {
				t.Errorf("ApplyFooter = %v, want success", err)
			}
			if !tc.ok && !errors.Is(err, chunked.ErrInvalid) {
				t.Errorf("ApplyFooter = %v (layout %+v), want ErrInvalid", err, l)
			}
		})
	}
	// The same through the annotation: a position inside the blob that is not the footer's.
	d, tail := fixtureNamed(t, "zstdchunked-modern")
	d.Annotations[chunked.AnnotationPosition] = "699315:2218:7691:1"
	if err := classified(t, d).ApplyFooter(tail); !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("ApplyFooter with a moved position annotation = %v, want ErrInvalid", err)
	}
	d, tail = fixtureNamed(t, "zstdchunked-legacy")
	d.Annotations[chunked.AnnotationLegacyPosition] = "743290:2214:10193:1"
	if err := classified(t, d).ApplyFooter(tail); !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("ApplyFooter with a wrong uncompressed size annotation = %v, want ErrInvalid", err)
	}
}

type positionCase struct {
	s        string
	manifest bool
	size     int64
	want     byterange.Range
	wantU    int64
	ok       bool
}

var positionCases = []positionCase{
	{s: "699314:2219:7691:1", manifest: true, size: 703932, want: byterange.Range{Offset: 699314, Length: 2219}, wantU: 7691, ok: true},
	{s: "701541:2319:40183", size: 703932, want: byterange.Range{Offset: 701541, Length: 2319}, wantU: 40183, ok: true},
	{s: "0:1:0:1", manifest: true, size: 1, want: byterange.Range{Offset: 0, Length: 1}, ok: true},
	{s: "10:90:0", size: 100, want: byterange.Range{Offset: 10, Length: 90}, ok: true},
	{s: "007:3:0", size: 100, want: byterange.Range{Offset: 7, Length: 3}, ok: true},
	{s: "9223372036854775806:1:9223372036854775807", size: math.MaxInt64, want: byterange.Range{Offset: math.MaxInt64 - 1, Length: 1}, wantU: math.MaxInt64, ok: true},
	{s: "1:2:3", manifest: true, size: 100},
	{s: "1:2:3:1:5", manifest: true, size: 100},
	{s: "1:2:3:1", size: 100},
	{s: "1:2", size: 100},
	{s: "", size: 100},
	{s: ":::", manifest: true, size: 100},
	{s: "1:2:3:", manifest: true, size: 100},
	{s: "1::3:1", manifest: true, size: 100},
	{s: "+1:2:3:1", manifest: true, size: 100},
	{s: "1:-2:3:1", manifest: true, size: 100},
	{s: "1:2:-3", size: 100},
	{s: " 1:2:3:1", manifest: true, size: 100},
	{s: "1:2 :3:1", manifest: true, size: 100},
	{s: "1:2:3:1\n", manifest: true, size: 100},
	{s: "0x1:2:3:1", manifest: true, size: 100},
	{s: "1e2:2:3:1", manifest: true, size: 100},
	{s: "1.0:2:3:1", manifest: true, size: 100},
	{s: "1_0:2:3:1", manifest: true, size: 100},
	{s: "１:2:3:1", manifest: true, size: 100},
	{s: "9223372036854775808:1:0", size: math.MaxInt64},
	{s: "99999999999999999999:1:0", size: math.MaxInt64},
	{s: "00000000000000000001:1:0", size: 100},
	{s: "1:9223372036854775808:0", size: math.MaxInt64},
	{s: "1:1:18446744073709551616", size: 100},
	{s: "1:2:3:0", manifest: true, size: 100},
	{s: "1:2:3:2", manifest: true, size: 100},
	{s: "1:2:3:01", manifest: true, size: 100, want: byterange.Range{Offset: 1, Length: 2}, wantU: 3, ok: true},
	{s: "101:1:0", size: 100},
	{s: "100:1:0", size: 100},
	{s: "99:2:0", size: 100},
	{s: "99:1:0", size: 100, want: byterange.Range{Offset: 99, Length: 1}, ok: true},
	{s: "0:0:0", size: 100},
	{s: "0:101:0", size: 100},
	{s: "1:9223372036854775807:0", size: math.MaxInt64},
	{s: "9223372036854775807:9223372036854775807:0", size: math.MaxInt64},
	{s: "0:1:0", size: 0},
	{s: "0:1:0", size: -1},
}

func TestParsePosition(t *testing.T) {
	for _, tc := range positionCases {
		r, u, err := chunked.ParsePosition(tc.s, tc.manifest, tc.size)
		if !tc.ok {
			if !errors.Is(err, chunked.ErrInvalid) {
				t.Errorf("ParsePosition(%q, %v, %d) = %+v, %d, %v; want ErrInvalid", tc.s, tc.manifest, tc.size, r, u, err)
			} else if !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.s)) {
				t.Errorf("ParsePosition(%q) error %q does not quote the position", tc.s, err)
			}
			continue
		}
		if err != nil || r != tc.want || u != tc.wantU {
			t.Errorf("ParsePosition(%q, %v, %d) = %+v, %d, %v; want %+v, %d", tc.s, tc.manifest, tc.size, r, u, err, tc.want, tc.wantU)
		}
	}
}

func TestClassifyFixtures(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, err := chunked.Classify(f.Desc)
			if err != nil {
				t.Fatal(err)
			}
			if l.Format != f.Format || l.BlobDigest != f.Desc.Digest || l.BlobSize != f.Desc.Size {
				t.Errorf("layout %+v, want format %v", l, f.Format)
			}
			a := f.Desc.Annotations
			wantTOC := a[chunked.AnnotationStargzTOCDigest]
			switch f.Format {
			case chunked.ZstdChunked:
				wantTOC = a[chunked.AnnotationChecksum]
			case chunked.ZstdChunkedLegacy:
				wantTOC = a[chunked.AnnotationLegacyChecksum]
			}
			if string(l.TOCDigest) != wantTOC || wantTOC == "" {
				t.Errorf("TOCDigest = %q, want %q", l.TOCDigest, wantTOC)
			}
			wantLegacy := ""
			if f.Format == chunked.StargzZstd {
				wantLegacy = a[chunked.AnnotationLegacyChecksum]
			}
			if string(l.LegacyChecksum) != wantLegacy {
				t.Errorf("LegacyChecksum = %q, want %q", l.LegacyChecksum, wantLegacy)
			}
			pos := a[chunked.AnnotationLegacyPosition]
			if f.Format == chunked.ZstdChunked {
				pos = a[chunked.AnnotationPosition]
			}
			if got := (l.TOC.Length > 0); got != (pos != "") {
				t.Errorf("TOC %+v from position %q", l.TOC, pos)
			}
			if got := (l.TarSplit.Length > 0); got != (f.Name == "zstdchunked-modern") {
				t.Errorf("tar-split %+v", l.TarSplit)
			}
			if s := l.String(); !strings.Contains(s, f.Format.String()) || !strings.Contains(s, string(f.Desc.Digest)) {
				t.Errorf("String() = %q", s)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	const (
		ociGzip    = "application/vnd.oci.image.layer.v1.tar+gzip"
		ociZstd    = "application/vnd.oci.image.layer.v1.tar+zstd"
		dockerGzip = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	)
	blob := digest.FromString("blob")
	toc := digest.FromString("toc").String()
	other := digest.FromString("other").String()
	for _, tc := range []struct {
		name      string
		mediaType string
		digest    digest.Digest
		ann       map[string]string
		zeroSize  bool
		format    chunked.Format // FormatUnknown: ErrNotLazy expected
		invalid   bool           // the error must also wrap ErrInvalid
		check     func(*chunked.Layout) bool
	}{
		{name: "eStargz", mediaType: ociGzip, ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}, format: chunked.EStargz},
		{name: "eStargz on a docker media type", mediaType: dockerGzip, ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}, format: chunked.EStargz},
		{name: "eStargz on a foreign docker media type", mediaType: "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip", ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}, format: chunked.EStargz},
		{name: "eStargz ignores positions", mediaType: ociGzip, ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc, chunked.AnnotationLegacyPosition: "1:2:3:1", chunked.AnnotationLegacyChecksum: other}, format: chunked.EStargz,
			check: func(l *chunked.Layout) bool { return l.TOC == byterange.Range{} && l.LegacyChecksum == "" }},
		{name: "stargz-zstd", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}, format: chunked.StargzZstd},
		{name: "stargz-zstd annotated", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc, chunked.AnnotationLegacyChecksum: other, chunked.AnnotationLegacyPosition: "10:20:30:1"}, format: chunked.StargzZstd,
			check: func(l *chunked.Layout) bool {
				return string(l.TOCDigest) == toc && string(l.LegacyChecksum) == other && l.TOC == byterange.Range{Offset: 10, Length: 20} && l.TOCUncompressed == 30
			}},
		{name: "legacy zstd:chunked", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationLegacyChecksum: toc, chunked.AnnotationLegacyPosition: "10:20:30:1"}, format: chunked.ZstdChunkedLegacy,
			check: func(l *chunked.Layout) bool { return l.TOC == byterange.Range{Offset: 10, Length: 20} }},
		{name: "legacy zstd:chunked ignores a tar-split position", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationLegacyChecksum: toc, chunked.AnnotationTarSplitPosition: "1:2:3"}, format: chunked.ZstdChunkedLegacy,
			check: func(l *chunked.Layout) bool { return l.TarSplit == byterange.Range{} }},
		{name: "zstd:chunked", mediaType: "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd", ann: map[string]string{chunked.AnnotationChecksum: toc}, format: chunked.ZstdChunked},
		{name: "zstd:chunked with positions", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationPosition: "10:20:30:1", chunked.AnnotationTarSplitPosition: "40:50:60"}, format: chunked.ZstdChunked,
			check: func(l *chunked.Layout) bool {
				return l.TOC == byterange.Range{Offset: 10, Length: 20} && l.TarSplit == byterange.Range{Offset: 40, Length: 50} && l.TarSplitUncompressed == 60
			}},
		{name: "zstd:chunked wins over legacy keys", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationLegacyChecksum: other, chunked.AnnotationLegacyPosition: "10:20:30:1"}, format: chunked.ZstdChunked,
			check: func(l *chunked.Layout) bool { return string(l.TOCDigest) == toc && l.TOC == byterange.Range{} }},

		{name: "plain gzip", mediaType: ociGzip},
		{name: "plain zstd", mediaType: ociZstd, ann: map[string]string{"org.opencontainers.image.title": "x"}},
		{name: "docker media type with zstd:chunked annotations", mediaType: dockerGzip, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationPosition: "10:20:30:1"}},
		{name: "docker media type with legacy zstd:chunked annotations", mediaType: dockerGzip, ann: map[string]string{chunked.AnnotationLegacyChecksum: toc}},
		{name: "gzip media type with zstd:chunked annotations", mediaType: ociGzip, ann: map[string]string{chunked.AnnotationChecksum: toc}},
		{name: "both stargz and zstd:chunked keys", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationStargzTOCDigest: toc}},
		{name: "both keys on gzip", mediaType: ociGzip, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationStargzTOCDigest: toc}},
		{name: "unknown media type", mediaType: "application/vnd.oci.image.layer.v1.tar", ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}},
		{name: "media type in capitals", mediaType: "application/vnd.oci.image.layer.v1.tar+GZIP", ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}},
		{name: "media type with parameters", mediaType: ociZstd + "; chunked=true", ann: map[string]string{chunked.AnnotationChecksum: toc}},
		{name: "empty media type", ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}},
		{name: "empty blob digest", mediaType: ociGzip, digest: "none", ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}},
		{name: "malformed blob digest", mediaType: ociGzip, digest: "sha256:xyz", ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}},
		{name: "uppercase blob digest", mediaType: ociGzip, digest: digest.Digest(strings.ToUpper(string(blob))), ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}},
		{name: "sha512 blob digest", mediaType: ociGzip, digest: digest.SHA512.FromString("blob"), ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}},
		{name: "zero size", mediaType: ociGzip, zeroSize: true, ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc}},
		{name: "malformed TOC digest", mediaType: ociGzip, ann: map[string]string{chunked.AnnotationStargzTOCDigest: "sha256:abc"}, invalid: true},
		{name: "empty TOC digest", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: ""}, invalid: true},
		{name: "sha512 TOC digest", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationLegacyChecksum: digest.SHA512.FromString("toc").String()}, invalid: true},
		{name: "malformed legacy checksum on stargz-zstd", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc, chunked.AnnotationLegacyChecksum: "md5:00"}, invalid: true},
		{name: "TOC position with 3 fields", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationPosition: "10:20:30"}, invalid: true},
		{name: "TOC position outside the blob", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationPosition: "990:20:30:1"}, invalid: true},
		{name: "TOC position of type 2", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationPosition: "10:20:30:2"}, invalid: true},
		{name: "legacy TOC position with a sign", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationLegacyChecksum: toc, chunked.AnnotationLegacyPosition: "+10:20:30:1"}, invalid: true},
		{name: "stargz-zstd position empty", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationStargzTOCDigest: toc, chunked.AnnotationLegacyPosition: ""}, invalid: true},
		{name: "tar-split position with 4 fields", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationTarSplitPosition: "10:20:30:1"}, invalid: true},
		{name: "tar-split position outside the blob", mediaType: ociZstd, ann: map[string]string{chunked.AnnotationChecksum: toc, chunked.AnnotationTarSplitPosition: "1000:1:1"}, invalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := chunked.Descriptor{MediaType: tc.mediaType, Digest: tc.digest, Size: 1000, Annotations: tc.ann}
			switch d.Digest {
			case "":
				d.Digest = blob
			case "none":
				d.Digest = ""
			}
			if tc.zeroSize {
				d.Size = 0
			}
			l, err := chunked.Classify(d)
			if tc.format == chunked.FormatUnknown {
				if !errors.Is(err, chunked.ErrNotLazy) {
					t.Fatalf("Classify = %+v, %v; want ErrNotLazy", l, err)
				}
				if l != nil {
					t.Errorf("Classify returned a layout with its error")
				}
				if got := errors.Is(err, chunked.ErrInvalid); got != tc.invalid {
					t.Errorf("Classify error %v: wraps ErrInvalid %v, want %v", err, got, tc.invalid)
				}
				return
			}
			if err != nil {
				t.Fatalf("Classify: %v", err)
			}
			if l.Format != tc.format || l.BlobDigest != d.Digest || l.BlobSize != d.Size {
				t.Errorf("layout %+v, want format %v", l, tc.format)
			}
			if tc.check != nil && !tc.check(l) {
				t.Errorf("layout %+v", l)
			}
		})
	}
	// A negative size is refused too.
	if _, err := chunked.Classify(chunked.Descriptor{MediaType: ociGzip, Digest: blob, Size: -1,
		Annotations: map[string]string{chunked.AnnotationStargzTOCDigest: toc}}); !errors.Is(err, chunked.ErrNotLazy) {
		t.Errorf("Classify with size -1 = %v, want ErrNotLazy", err)
	}
}
