package verify_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// pipedSource streams every range through a pipe the test writes: the bytes arrive when, and
// as, the test says.
type pipedSource struct {
	testlayer.BlobSource
	pipes []*io.PipeWriter
	done  chan struct{}
	err   error // what wait returns, once done is closed
}

func (s *pipedSource) Fetch(ctx context.Context, ranges []byterange.Range) ([][]byte, error) {
	out := make([][]byte, len(ranges))
	for i, r := range ranges {
		out[i] = make([]byte, r.Length)
		if _, err := s.ReadAt(ctx, out[i], r.Offset); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *pipedSource) Stream(_ context.Context, ranges []byterange.Range) ([]io.Reader, func() error, error) {
	parts := make([]io.Reader, len(ranges))
	for i := range ranges {
		pr, pw := io.Pipe()
		parts[i], s.pipes = pr, append(s.pipes, pw)
	}
	return parts, func() error { <-s.done; return s.err }, nil
}

// TestReadChunksStreamed: from a source that streams, each chunk is verified from its bytes as
// they arrive: a chunk verifies while the ones after it have not come yet; a chunk whose bytes
// stop coming fails with the read's error, not as corrupt; tampered bytes are refused as ever.
func TestReadChunksStreamed(t *testing.T) {
	l, f, id := manyChunks(t, 3<<20, 1<<20)
	x := l.Index()
	if x.NumChunks(id) != 3 {
		t.Fatalf("%d chunks, want 3", x.NumChunks(id))
	}
	src := &pipedSource{BlobSource: testlayer.BlobSource(f.Blob), done: make(chan struct{})}
	ids := []verify.ChunkID{{File: id, I: 0}, {File: id, I: 1}, {File: id, I: 2}}
	got, err := l.ReadChunks(t.Context(), src, ids)
	if err != nil {
		t.Fatal(err)
	}
	raw := func(i int) []byte {
		c, _ := x.Chunk(id, i)
		return f.Blob[c.Offset:c.End()]
	}
	write := func(i int, b []byte, err error) {
		go func() {
			_, _ = src.pipes[i].Write(b)
			_ = src.pipes[i].CloseWithError(err)
		}()
	}

	write(0, raw(0), nil)
	c, err := got.Verify(0)
	if err != nil || int64(len(c.Bytes())) != c.Ref().Size {
		t.Fatalf("chunk 0, before the others came: %v", err)
	}

	boom := errors.New("connection reset")
	write(1, raw(1)[:len(raw(1))/2], boom)
	if c, err := got.Verify(1); !errors.Is(err, boom) || errors.Is(err, verify.ErrCorrupt) || c.Bytes() != nil {
		t.Errorf("chunk 1, cut short: %v, want the read's error alone", err)
	}

	tampered := append([]byte(nil), raw(2)...)
	tampered[len(tampered)/2] ^= 0xff
	write(2, tampered, nil)
	if c, err := got.Verify(2); err == nil || c.Bytes() != nil {
		t.Error("chunk 2, tampered: verified")
	} else if errors.Is(err, boom) {
		t.Errorf("chunk 2, tampered: %v, the read's error", err)
	}

	src.err = boom
	close(src.done)
	if _, err := got.Wait(); !errors.Is(err, boom) {
		t.Errorf("Wait: %v, want the read's error", err)
	}
}
