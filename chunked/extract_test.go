package chunked_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

var (
	fixturesOnce sync.Once
	fixturesVal  []testlayer.Fixture
	fixturesErr  error
)

// fixtures returns testlayer.Fixtures(), built once per test binary.
func fixtures(t testing.TB) []testlayer.Fixture {
	t.Helper()
	fixturesOnce.Do(func() { fixturesVal, fixturesErr = testlayer.Fixtures() })
	if fixturesErr != nil {
		t.Fatal(fixturesErr)
	}
	return fixturesVal
}

// fixtureTOC returns a fixture's layout (classified and completed by its footer), its raw TOC
// bytes and its TOC JSON.
func fixtureTOC(t testing.TB, f testlayer.Fixture) (*chunked.Layout, []byte, []byte) {
	t.Helper()
	l, err := chunked.Classify(f.Desc)
	if err != nil {
		t.Fatalf("%s: Classify: %v", f.Name, err)
	}
	if err := l.ApplyFooter(f.Blob[len(f.Blob)-int(chunked.TailSize(l.Format)):]); err != nil {
		t.Fatalf("%s: ApplyFooter: %v", f.Name, err)
	}
	raw := f.Blob[l.TOC.Offset:l.TOC.End()]
	js, err := chunked.ExtractTOC(l, raw, chunked.Limits{})
	if err != nil {
		t.Fatalf("%s: ExtractTOC: %v", f.Name, err)
	}
	return l, raw, js
}

func TestParseFixtures(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, _, js := fixtureTOC(t, f)
			x, err := chunked.Parse(context.Background(), l, js, chunked.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			checkIndex(t, x)
			for p, typ := range map[string]chunked.Type{
				"usr/bin/tool": chunked.TypeReg, "usr/bin/tool-hardlink": chunked.TypeHardlink, "etc/removed": chunked.TypeReg,
				"usr/bin/abs": chunked.TypeSymlink, "opaque": chunked.TypeDir, "etc/null": chunked.TypeChar, "tmp/fifo": chunked.TypeFifo,
			} {
				if e := x.Entry(lookup(t, x, p)); e.Type != typ {
					t.Errorf("%s: type %v, want %v", p, e.Type, typ)
				}
			}
			if got := x.Entry(lookup(t, x, "usr/bin/tool")).Nlink; got != 2 {
				t.Errorf("Nlink(usr/bin/tool) = %d, want 2", got)
			}
			if got := len(x.Chunks(lookup(t, x, "usr/share/big.bin"))); got < 2 {
				t.Errorf("usr/share/big.bin has %d chunks, want several", got)
			}
			wantPrefetch := f.Name == "estargz-prioritized"
			if got := x.PrefetchEnd() >= 0; got != wantPrefetch {
				t.Errorf("PrefetchEnd = %d, want a landmark: %v", x.PrefetchEnd(), wantPrefetch)
			}
			if got := !x.TarSplitDigest().IsZero(); got != (f.Name == "zstdchunked-modern") {
				t.Errorf("TarSplitDigest = %v", x.TarSplitDigest())
			}
		})
	}
}

func TestExtractTOC(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, raw, js := fixtureTOC(t, f)
			if !bytes.HasPrefix(js, []byte("{")) {
				t.Errorf("TOC JSON starts with %.20q", js)
			}
			// Over the limit: ErrLimit (see TestExtractZstdTOCOverLimit for the zstd formats).
			_, err := chunked.ExtractTOC(l, raw, chunked.Limits{MaxTOCSize: int64(len(js)) - 1})
			if !errors.Is(err, chunked.ErrLimit) && !(l.Format.Zstd() && errors.Is(err, chunked.ErrInvalid)) {
				t.Errorf("ExtractTOC with MaxTOCSize %d = %v, want ErrLimit", len(js)-1, err)
			}
			if _, err := chunked.ExtractTOC(l, raw, chunked.Limits{MaxTOCSize: int64(len(raw)) - 1}); !errors.Is(err, chunked.ErrLimit) {
				t.Errorf("ExtractTOC with MaxTOCSize %d (under the compressed size) = %v, want ErrLimit", len(raw)-1, err)
			}
			if _, err := chunked.ExtractTOC(l, raw[:len(raw)/2], chunked.Limits{}); !errors.Is(err, chunked.ErrInvalid) {
				t.Errorf("ExtractTOC of half the TOC = %v, want ErrInvalid", err)
			}
			if l.Format.Zstd() {
				l2 := *l
				l2.TOCUncompressed = int64(len(js)) + 1
				if _, err := chunked.ExtractTOC(&l2, raw, chunked.Limits{}); !errors.Is(err, chunked.ErrInvalid) {
					t.Errorf("ExtractTOC with a wrong uncompressed size = %v, want ErrInvalid", err)
				}
			}
		})
	}
}

// TestExtractZstdTOCOverLimit: a zstd TOC that decompresses to more than MaxTOCSize exceeds a
// limit, as an eStargz one does.
func TestExtractZstdTOCOverLimit(t *testing.T) {
	for _, f := range fixtures(t) {
		l, raw, js := fixtureTOC(t, f)
		if !l.Format.Zstd() {
			continue
		}
		if _, err := chunked.ExtractTOC(l, raw, chunked.Limits{MaxTOCSize: int64(len(js)) - 1}); !errors.Is(err, chunked.ErrLimit) {
			t.Errorf("%s: ExtractTOC with MaxTOCSize %d = %v, want ErrLimit", f.Name, len(js)-1, err)
		}
	}
}

// stargzMember returns a gzip member holding a tar entry.
func stargzMember(t testing.TB, h *tar.Header, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestExtractStargzTOC(t *testing.T) {
	l := &chunked.Layout{Format: chunked.EStargz}
	js := []byte(tocOf())
	raw := stargzMember(t, &tar.Header{Name: "stargz.index.json", Typeflag: tar.TypeReg, Size: int64(len(js)), Mode: 0o644}, js)
	if got, err := chunked.ExtractTOC(l, raw, chunked.Limits{}); err != nil || !bytes.Equal(got, js) {
		t.Errorf("ExtractTOC = %q, %v; want %q", got, err, js)
	}
	for _, tc := range []struct {
		name string
		h    tar.Header
		want error
	}{
		{"other name", tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Size: int64(len(js))}, chunked.ErrTOCNotFound},
		{"directory", tar.Header{Name: "stargz.index.json", Typeflag: tar.TypeDir}, chunked.ErrTOCNotFound},
		{"symlink", tar.Header{Name: "stargz.index.json", Typeflag: tar.TypeSymlink, Linkname: "x"}, chunked.ErrTOCNotFound},
	} {
		var data []byte
		if tc.h.Typeflag == tar.TypeReg {
			data = js
		}
		_, err := chunked.ExtractTOC(l, stargzMember(t, &tc.h, data), chunked.Limits{})
		if !errors.Is(err, tc.want) || !errors.Is(err, chunked.ErrInvalid) {
			t.Errorf("%s: ExtractTOC = %v, want ErrInvalid wrapping %v", tc.name, err, tc.want)
		}
	}
	big := stargzMember(t, &tar.Header{Name: "stargz.index.json", Typeflag: tar.TypeReg, Size: 1 << 20, Mode: 0o644}, make([]byte, 1<<20))
	if _, err := chunked.ExtractTOC(l, big, chunked.Limits{MaxTOCSize: 1<<20 - 1}); !errors.Is(err, chunked.ErrLimit) {
		t.Errorf("TOC over MaxTOCSize: ExtractTOC = %v, want ErrLimit", err)
	}
	for _, raw := range [][]byte{nil, []byte("not gzip"), raw[:20]} {
		if _, err := chunked.ExtractTOC(l, raw, chunked.Limits{}); !errors.Is(err, chunked.ErrInvalid) {
			t.Errorf("ExtractTOC(%q) = %v, want ErrInvalid", raw, err)
		}
	}
}

// TestExtractTOCAllocationBounded: a tiny TOC member must not make ExtractTOC allocate what its
// tar header claims before any of it has been decompressed.
func TestExtractTOCAllocationBounded(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	// The header alone: WriteHeader writes it through, the content never comes.
	if err := tw.WriteHeader(&tar.Header{Name: "stargz.index.json", Typeflag: tar.TypeReg, Size: 400 << 20, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := chunked.ExtractTOC(&chunked.Layout{Format: chunked.EStargz}, buf.Bytes(), chunked.Limits{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("ExtractTOC of a truncated TOC = %v, want ErrInvalid", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Errorf("ExtractTOC of a %d-byte member allocated %d MiB", buf.Len(), got>>20)
	}
}

// TestParseHashed: ParseHashed builds the index Parse builds from the extracted JSON, and
// hashes exactly that JSON; when the JSON is invalid, the whole of it is still hashed (so a
// caller can report a TOC that is not the one its digest names as such); when the
// decompression fails, it says the hash is incomplete.
func TestParseHashed(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, raw, js := fixtureTOC(t, f)
			want, err := chunked.Parse(t.Context(), l, js, chunked.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			x, hashed, err := chunked.ParseHashed(t.Context(), l, raw, chunked.Limits{}, h)
			if err != nil || !hashed {
				t.Fatalf("ParseHashed = %v (hashed %v)", err, hashed)
			}
			if got, w := h.Sum(nil), sha256.Sum256(js); !bytes.Equal(got, w[:]) {
				t.Errorf("hash %x, want that of the JSON, %x", got, w)
			}
			if !bytes.Equal(x.Binary(), want.Binary()) {
				t.Errorf("ParseHashed's index differs from Parse's")
			}
			h.Reset()
			if _, hashed, err := chunked.ParseHashed(t.Context(), l, raw[:len(raw)/2], chunked.Limits{}, h); err == nil || hashed {
				t.Errorf("ParseHashed of half the TOC = %v (hashed %v), want an error and an incomplete hash", err, hashed)
			}
		})
	}
	l := &chunked.Layout{Format: chunked.EStargz, TOC: byterange.Range{Offset: 1 << 20}}
	for name, js := range map[string]string{
		"bad entry":    tocOf(`{"type":"bogus","name":"a"}`, `{"type":"reg","name":"b"}`) + strings.Repeat(" ", 1<<20),
		"not JSON":     "{" + strings.Repeat("x", 1<<20),
		"bad version":  `{"version":2,"entries":[]}`,
		"trailing end": tocOf() + "}",
	} {
		raw := stargzMember(t, &tar.Header{Name: "stargz.index.json", Typeflag: tar.TypeReg, Size: int64(len(js)), Mode: 0o644}, []byte(js))
		h := sha256.New()
		_, hashed, err := chunked.ParseHashed(t.Context(), l, raw, chunked.Limits{}, h)
		if !errors.Is(err, chunked.ErrInvalid) || !hashed {
			t.Errorf("%s: ParseHashed = %v (hashed %v), want ErrInvalid with the whole JSON hashed", name, err, hashed)
		}
		if got, w := h.Sum(nil), sha256.Sum256([]byte(js)); !bytes.Equal(got, w[:]) {
			t.Errorf("%s: hash %x, want that of the whole JSON, %x", name, got, w)
		}
	}
}

// TestParseCompressedStargzStreams: an eStargz TOC is parsed as it is decompressed, never held
// whole, like a zstd one: a TOC of 64 MiB (a field unknown to the parser, mostly) costs less
// memory than its JSON.
func TestParseCompressedStargzStreams(t *testing.T) {
	const n = 1 << 16
	pad := strings.Repeat("x", 1<<10)
	entries := make([]string, n)
	for i := range entries {
		entries[i] = `{"type":"dir","name":"d` + strconv.Itoa(i) + `/","comment":"` + pad + `"}`
	}
	js := tocOf(entries...)
	raw := stargzMember(t, &tar.Header{Name: "stargz.index.json", Typeflag: tar.TypeReg, Size: int64(len(js)), Mode: 0o644}, []byte(js))
	l := &chunked.Layout{Format: chunked.EStargz, TOC: byterange.Range{Offset: 1 << 20}}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	x, err := chunked.ParseCompressed(t.Context(), l, raw, chunked.Limits{})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if x.Len() != n+1 {
		t.Errorf("%d entries, want %d", x.Len(), n+1)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(len(js)) {
		t.Errorf("parsing a TOC of %d MiB (%d KiB compressed) allocated %d MiB", len(js)>>20, len(raw)>>10, got>>20)
	}
}

// TestParseStream: ParseStream builds from a reader, whatever the size of its reads, the
// index ParseHashed builds from the bytes; it refuses bytes after the TOC (where the bytes
// were refused alike) and a stream that ends too soon, and passes on the reader's error.
func TestParseStream(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, raw, _ := fixtureTOC(t, f)
			want, _, err := chunked.ParseHashed(t.Context(), l, raw, chunked.Limits{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			for name, r := range map[string]io.Reader{
				"one byte": iotest.OneByteReader(bytes.NewReader(raw)),
				"half":     iotest.HalfReader(bytes.NewReader(raw)),
			} {
				x, hashed, err := chunked.ParseStream(t.Context(), l, r, int64(len(raw)), chunked.Limits{}, sha256.New())
				if err != nil || !hashed || !bytes.Equal(x.Binary(), want.Binary()) {
					t.Errorf("%s reads: ParseStream = %v (hashed %v), or another index", name, err, hashed)
				}
			}
			more := append(bytes.Clone(raw), 0)
			_, _, errBytes := chunked.ParseHashed(t.Context(), l, more, chunked.Limits{}, nil)
			_, _, errStream := chunked.ParseStream(t.Context(), l, bytes.NewReader(more), int64(len(more)), chunked.Limits{}, nil)
			if !errors.Is(errStream, chunked.ErrInvalid) || !errors.Is(errBytes, chunked.ErrInvalid) {
				t.Errorf("a byte after the TOC: ParseStream = %v, ParseHashed = %v; want ErrInvalid", errStream, errBytes)
			}
			if _, _, err := chunked.ParseStream(t.Context(), l, bytes.NewReader(raw[:len(raw)-1]), int64(len(raw)), chunked.Limits{}, nil); !errors.Is(err, chunked.ErrInvalid) {
				t.Errorf("a TOC one byte short: ParseStream = %v, want ErrInvalid", err)
			}
			broken := errors.New("connection reset")
			r := io.MultiReader(bytes.NewReader(raw[:len(raw)/2]), iotest.ErrReader(broken))
			if _, _, err := chunked.ParseStream(t.Context(), l, r, int64(len(raw)), chunked.Limits{}, nil); err == nil {
				t.Error("a reader failing half way: no error")
			}
		})
	}
}
