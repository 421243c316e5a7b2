package verify_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/verify"
)

// ignoringSource serves a blob without looking at the context, as a source whose reads are
// already done would.
type ignoringSource struct{ r *bytes.Reader }

func (s ignoringSource) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	return s.r.ReadAt(p, off)
}

// lookCounter is a context that counts the looks at its Err, and is canceled from the
// cancelAt-th on (never when cancelAt is 0).
type lookCounter struct {
	context.Context
	looks, cancelAt int
}

func (c *lookCounter) Err() error {
	if c.looks++; c.cancelAt > 0 && c.looks >= c.cancelAt {
		return context.Canceled
	}
	return nil
}

// TestOpenCanceled: a lookup whose context is done stops parsing the TOC and comparing the
// tar-split with it, with the context's error, even when every read is already done.
func TestOpenCanceled(t *testing.T) {
	for _, f := range fixtures(t) {
		src := ignoringSource{bytes.NewReader(f.Blob)}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := verify.Open(ctx, f.Desc, f.DiffID, src); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: Open with a canceled context = %v, want context.Canceled", f.Name, err)
		}
		if f.Name != "zstdchunked-modern" {
			continue
		}
		// The looks at the context beyond the TOC parse's are the tar-split comparison's.
		lay, err := chunked.Classify(f.Desc)
		if err != nil {
			t.Fatal(err)
		}
		if err := lay.ApplyFooter(f.Blob[f.Desc.Size-chunked.TailSize(lay.Format):]); err != nil {
			t.Fatal(err)
		}
		js, err := chunked.ExtractTOC(lay, f.Blob[lay.TOC.Offset:lay.TOC.End()], chunked.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		parse := &lookCounter{Context: t.Context()}
		if _, err := chunked.Parse(parse, lay, js, chunked.Limits{}); err != nil {
			t.Fatal(err)
		}
		all := &lookCounter{Context: t.Context()}
		l, err := verify.Open(all, f.Desc, f.DiffID, src)
		if err != nil {
			t.Fatal(err)
		}
		if !l.CanProveDiffID() || all.looks <= parse.looks {
			t.Fatalf("%s: Open looked at its context %d times, the TOC parse %d; want more for the tar-split comparison",
				f.Name, all.looks, parse.looks)
		}
		if _, err := verify.Open(&lookCounter{Context: t.Context(), cancelAt: parse.looks + 1}, f.Desc, f.DiffID, src); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: Open canceled while comparing the tar-split = %v, want context.Canceled", f.Name, err)
		}
	}
}
