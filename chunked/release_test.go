package chunked

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/layerstore/layerstore/internal/byterange"
)

// released returns a channel closed once the allocation b starts is collected.
func released(b []byte) <-chan struct{} {
	ch := make(chan struct{})
	runtime.AddCleanup(&b[0], func(ch chan struct{}) { close(ch) }, ch)
	return ch
}

// collected reports whether ch closes within a few collections.
func collected(ch <-chan struct{}) bool {
	for range 20 {
		runtime.GC()
		select {
		case <-ch:
			return true
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false
}

// tocJSONOf returns a TOC of n directories of random names: n = 300k compresses to more than
// 5 MB, which the zstd decoder decodes as a stream, as it does a large TOC.
func tocJSONOf(n int) []byte {
	rnd := rand.New(rand.NewPCG(1, 2))
	var b bytes.Buffer
	b.WriteString(`{"version":1,"entries":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"%016x%016x%08x","type":"dir"}`, rnd.Uint64(), rnd.Uint64(), rnd.Uint32())
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// TestTOCReleasedAtEnd checks that the readers of a compressed TOC let go of its bytes once
// they have read it to its end, while the parse still holds them: the parse then builds the
// index (as large as the TOC for a million entries) without the compressed TOC beside it.
func TestTOCReleasedAtEnd(t *testing.T) {
	js := tocJSONOf(300_000)

	t.Run("zstd", func(t *testing.T) {
		enc, err := zstd.NewWriter(nil)
		if err != nil {
			t.Fatal(err)
		}
		raw := enc.EncodeAll(js, nil)
		if len(raw) < 5<<20 {
			t.Fatalf("the compressed TOC is %d bytes: too small for the stream decoder", len(raw))
		}
		gone := released(raw)
		l := &Layout{Format: ZstdChunked}
		r, err := newTOCReader(l, &consumed{b: raw}, Limits{}.WithDefaults())
		if err != nil {
			t.Fatal(err)
		}
		raw = nil
		if n, err := io.Copy(io.Discard, r); err != nil || n != int64(len(js)) {
			t.Fatalf("read %d bytes of %d: %v", n, len(js), err)
		}
		if !collected(gone) {
			t.Error("the compressed TOC is still held once read")
		}
		if n, err := r.Read(make([]byte, 10)); n != 0 || err != io.EOF {
			t.Errorf("a read after the end: %d, %v", n, err)
		}
		runtime.KeepAlive(r)
		r.release()
		if n, err := r.Read(make([]byte, 10)); n != 0 || err != io.EOF {
			t.Errorf("a read after the release: %d, %v", n, err)
		}
	})

	t.Run("estargz", func(t *testing.T) {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		if err := tw.WriteHeader(&tar.Header{Name: tocTarName, Typeflag: tar.TypeReg, Size: int64(len(js)), Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(js); err != nil {
			t.Fatal(err)
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		raw := buf.Bytes()
		gone := released(raw)
		m, err := openStargzTOC(&consumed{b: raw}, int64(len(raw)), Limits{}.WithDefaults().MaxTOCSize)
		if err != nil {
			t.Fatal(err)
		}
		raw, buf = nil, bytes.Buffer{}
		s := newStargzStream(m, nil)
		m = nil
		if n, err := io.Copy(io.Discard, s); err != nil || n != int64(len(js)) {
			t.Fatalf("read %d bytes of %d: %v", n, len(js), err)
		}
		if !collected(gone) {
			t.Error("the compressed TOC is still held once read")
		}
		runtime.KeepAlive(s)
		s.Close()
	})
}

// TestParseLetsGoOfItsReaderBeforeTheTree: a parse lets go of what reads its TOC (the zstd
// decoder's windows) once the JSON is read whole, before the tree's steps, where its peak
// is: a tree step's error comes after the release; a decoding error, before it.
func TestParseLetsGoOfItsReaderBeforeTheTree(t *testing.T) {
	layout := &Layout{Format: ZstdChunked, TOC: byterange.Range{Offset: 1000, Length: 1}}
	for _, tc := range []struct {
		toc      string
		released bool
	}{
		{`{"version":1,"entries":[{"type":"reg","name":"f","mode":420},{"type":"reg","name":"f/g","mode":420}]}`, true},
		{`{"version":1,"entries":[{"type":"reg","name":"f","mode":420},{"type":"reg","name":"f"`, false},
	} {
		released := false
		_, err := parse(context.Background(), layout, strings.NewReader(tc.toc), Limits{}.WithDefaults(), func() { released = true })
		if !errors.Is(err, ErrInvalid) || released != tc.released {
			t.Errorf("%s: %v, reader let go of: %v, want %v", tc.toc, err, released, tc.released)
		}
	}
}
