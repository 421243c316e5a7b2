package verify_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

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
		// Every look at the context, the last ones being the tar-split comparison's.
		all := &lookCounter{Context: t.Context()}
		l, err := verify.Open(all, f.Desc, f.DiffID, src)
		if err != nil {
			t.Fatal(err)
		}
		if !l.CanProveDiffID() {
			t.Fatalf("%s has no tar-split", f.Name)
		}
		if _, err := verify.Open(&lookCounter{Context: t.Context(), cancelAt: all.looks}, f.Desc, f.DiffID, src); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: Open canceled at its last look at the context = %v, want context.Canceled", f.Name, err)
		}
	}
}
