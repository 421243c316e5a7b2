package verify_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/verify"
)

// TestTOCStreamed: an eStargz TOC is read in pieces as it is parsed, never whole, into the
// index its bytes read whole make; a source that fails part way through is reported as
// such, not as an invalid TOC; one that stalls is left when the context ends.
func TestTOCStreamed(t *testing.T) {
	const piece = 512
	verify.SetStreamPiece(t, piece)
	n := 0
	for _, f := range fixtures(t) {
		if f.Format != chunked.EStargz {
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
			if r.Offset < toc.End() && r.End() > toc.Offset {
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
