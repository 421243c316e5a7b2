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

// TestOpenCanceled: a lookup whose context is done stops parsing the TOC, with the context's
// error, even when every read is already done; so does the tar-split comparison, and a
// canceled comparison is not a verdict: the next one runs.
func TestOpenCanceled(t *testing.T) {
	for _, f := range fixtures(t) {
		src := ignoringSource{bytes.NewReader(f.Blob)}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := verify.Open(ctx, f.Desc, f.DiffID, src, verify.Config{}); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: Open with a canceled context = %v, want context.Canceled", f.Name, err)
		}
		if f.Name != "zstdchunked-modern" {
			continue
		}
		l, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{})
		if err != nil {
			t.Fatal(err)
		}
		looks := &lookCounter{Context: t.Context()}
		if err := l.CheckTarSplit(looks, src); err != nil {
			t.Fatal(err)
		}
		if looks.looks == 0 {
			t.Fatal("the tar-split comparison never looked at its context")
		}
		l, err = verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{})
		if err != nil {
			t.Fatal(err)
		}
		for _, at := range []int{1, looks.looks} {
			err := l.CheckTarSplit(&lookCounter{Context: t.Context(), cancelAt: at}, src)
			if !errors.Is(err, context.Canceled) || l.Err() != nil || l.TarSize() != -1 {
				t.Fatalf("comparison canceled at look %d = %v (Err %v, TarSize %d), want context.Canceled and no verdict",
					at, err, l.Err(), l.TarSize())
			}
		}
		if err := l.CheckTarSplit(t.Context(), src); err != nil || l.TarSize() <= 0 {
			t.Fatalf("comparison after canceled ones = %v, TarSize %d", err, l.TarSize())
		}
	}
}
