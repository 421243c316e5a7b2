package chunked_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/layerstore/layerstore/chunked"
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
