package verify_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// TestTOCStreamed: an eStargz TOC, and a zstd:chunked TOC of more than two pieces, is read in
// pieces as it is parsed, never whole, into the index its bytes read whole make; a source that
// fails part way through is reported as such, not as an invalid TOC; one that stalls is left
// when the context ends; one over a limit is refused for it. A zstd:chunked TOC, whose digest covers its compressed bytes, with a
// byte changed anywhere is reported as not matching its digest, however its parse ended.
func TestTOCStreamed(t *testing.T) {
	const piece = 512
	verify.SetStreamPiece(t, piece)
	n := 0
	for _, f := range fixtures(t) {
		if f.Format != chunked.EStargz && f.Format != chunked.ZstdChunked && f.Format != chunked.ZstdChunkedLegacy {
			continue
		}
		n++
		src := &countingSource{Source: source(f.Blob)}
		l, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{})
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		layout := l.Layout()
		toc := layout.TOC
		if toc.Length < 3*piece {
			t.Fatalf("%s: a TOC of %d bytes: too small to stream in pieces", f.Name, toc.Length)
		}
		var pieces []byterange.Range
		for _, r := range src.read {
			if r.Offset >= toc.Offset && r.End() <= toc.End() { // not the footer's read, which may hold the TOC's end
				pieces = append(pieces, r)
			}
		}
		for i, r := range pieces {
			if r.Length > piece || r.Offset != toc.Offset+int64(i)*piece {
				t.Fatalf("%s: the TOC's read %d is %d+%d, want pieces of %d in order", f.Name, i, r.Offset, r.Length, piece)
			}
		}
		if end := pieces[len(pieces)-1].End(); end != toc.End() {
			t.Fatalf("%s: the TOC read to %d of %d", f.Name, end, toc.End())
		}
		whole, err := chunked.ParseCompressed(t.Context(), &layout, f.Blob[toc.Offset:toc.End()], chunked.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(whole.Binary(), l.Index().Binary()) {
			t.Fatalf("%s: the TOC read as a stream makes another index", f.Name)
		}
		// A limit the TOC is over stops its parse early: it is the verdict, not a mismatch.
		_, err = verify.Open(t.Context(), f.Desc, f.DiffID, source(f.Blob), verify.Config{Limits: chunked.Limits{MaxEntries: 2}})
		if !errors.Is(err, chunked.ErrLimit) || errors.Is(err, verify.ErrDigestMismatch) {
			t.Errorf("%s: a TOC over the entry limit: %v, want the limit", f.Name, err)
		}
		if f.Format != chunked.EStargz {
			for _, p := range []int64{0, 1, toc.Length / 3, toc.Length / 2, toc.Length - 2, toc.Length - 1} {
				_, err := verify.Open(t.Context(), f.Desc, f.DiffID, source(flip(f.Blob, int(toc.Offset+p))), verify.Config{})
				if !errors.Is(err, verify.ErrDigestMismatch) {
					t.Errorf("%s: TOC byte %d flipped: %v, want a digest mismatch", f.Name, p, err)
				}
			}
		}

		// The registry fails half way through the TOC.
		broken := errors.New("connection reset")
		failing := &failingAt{Source: source(f.Blob), at: toc.Offset + toc.Length/2, err: broken}
		_, err = verify.Open(t.Context(), f.Desc, f.DiffID, failing, verify.Config{})
		if !errors.Is(err, broken) || errors.Is(err, chunked.ErrInvalid) {
			t.Errorf("%s: a source failing in the TOC: %v, want its own error, not an invalid TOC", f.Name, err)
		}

		// It stalls there instead: the lookup ends with its context.
		stalling := &failingAt{Source: source(f.Blob), at: toc.Offset + toc.Length/2}
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		_, err = verify.Open(ctx, f.Desc, f.DiffID, stalling, verify.Config{})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: a source stalling in the TOC: %v, want the context's deadline", f.Name, err)
		}
	}
	if n == 0 {
		t.Fatal("no eStargz fixture")
	}
}

// failingAt serves a blob but for the reads that reach at: those fail with err, or, when
// err is nil, wait for their context to end.
type failingAt struct {
	verify.Source
	at  int64
	err error
}

func (s *failingAt) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off+int64(len(p)) > s.at && off <= s.at {
		if s.err != nil {
			return 0, s.err
		}
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return s.Source.ReadAt(ctx, p, off)
}

// TestTOCStreamedLimit: a large zstd:chunked TOC, streamed, that is over a limit stops its
// parse early and is refused for the limit, not as a TOC that does not match its digest (the
// rest of it is still read and hashed).
func TestTOCStreamedLimit(t *testing.T) {
	verify.SetStreamPiece(t, 4096)
	f, err := testlayer.SyntheticZstdChunked(20_000, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := verify.Open(t.Context(), f.Desc, f.DiffID, source(f.Blob), verify.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if toc := l.Layout().TOC; toc.Length < 64*4096 {
		t.Fatalf("a TOC of %d bytes: too small to be read far ahead of its parse", toc.Length)
	}
	_, err = verify.Open(t.Context(), f.Desc, f.DiffID, source(f.Blob), verify.Config{Limits: chunked.Limits{MaxEntries: 100}})
	if !errors.Is(err, chunked.ErrLimit) || errors.Is(err, verify.ErrDigestMismatch) {
		t.Fatalf("a TOC over the entry limit: %v, want the limit", err)
	}
}
