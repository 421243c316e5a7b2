package fetcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/byterange"
)

// TestStreamBytesBeforeTheEnd: a range's bytes can be read as soon as they have arrived, while
// the rest of the request is still on its way (a reader's chunk is decompressed while the
// read-ahead behind it comes in).
func TestStreamBytesBeforeTheEnd(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	const half = 100_000
	release := make(chan struct{})
	reg.fault = func(w http.ResponseWriter, r *http.Request, _ int) bool {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", 2*half-1, len(data)))
		w.Header().Set("Content-Length", strconv.Itoa(2*half))
		w.WriteHeader(http.StatusPartialContent)
		_, _ = w.Write(data[:half])
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return true
		}
		_, _ = w.Write(data[half : 2*half])
		return true
	}
	b, _ := newTestBlob(t, reg)
	parts, wait, err := b.Stream(t.Context(), []byterange.Range{{Offset: 0, Length: half}, {Offset: half, Length: half}})
	if err != nil {
		t.Fatal(err)
	}
	if reg.count() > 1 {
		t.Fatalf("%d requests for two adjacent ranges, want 1", reg.count())
	}
	got, err := io.ReadAll(parts[0])
	if err != nil || !bytes.Equal(got, data[:half]) {
		t.Fatalf("first range before the rest came: %d bytes, %v", len(got), err)
	}
	close(release)
	got, err = io.ReadAll(parts[1])
	if err != nil || !bytes.Equal(got, data[half:2*half]) {
		t.Fatalf("second range: %d bytes, %v", len(got), err)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if n := reg.count(); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

// TestStreamBytesNeverChange: a body cut short is asked for again, and the bytes that had come
// are kept, not written again: a reader may be decompressing them. A retry that answers other
// bytes for them (a hostile or broken registry) changes nothing a reader has seen; the
// verification of what they decompress to decides.
func TestStreamBytesNeverChange(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.fault = func(w http.ResponseWriter, r *http.Request, n int) bool {
		serveRecorded(w, r, data, func(_ http.Header, body []byte) []byte {
			if n == 1 {
				return body[:len(body)/2] // cut short
			}
			body = bytes.Clone(body)
			clear(body[:len(body)/2]) // other bytes where the first answer had come
			return body
		})
		return true
	}
	b, _ := newTestBlob(t, reg)
	r := byterange.Range{Offset: 1000, Length: 300_000}
	parts, wait, err := b.Stream(t.Context(), []byterange.Range{r})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(parts[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data[r.Offset:r.End()]) {
		t.Error("the bytes that came before the body was cut changed")
	}
	whole, err := parts[0].(*Part).Bytes()
	if err != nil || !bytes.Equal(whole, got) {
		t.Errorf("Bytes: %v, or bytes that changed once read", err)
	}
	if n := reg.count(); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

// TestStreamFailureReachesReaders: a reader waiting for bytes that will not come gets the
// fetch's error, the one wait returns: never blocks for good.
func TestStreamFailureReachesReaders(t *testing.T) {
	data := testBlob(1 << 20)
	t.Run("not found", func(t *testing.T) {
		reg := newTestRegistry(t, data)
		reg.fault = failStatus(100, http.StatusNotFound)
		b, _ := newTestBlob(t, reg)
		parts, wait, err := b.Stream(t.Context(), []byterange.Range{{Offset: 0, Length: 10}, {Offset: 500_000, Length: 10}})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			if _, err := io.ReadAll(p); !errors.Is(err, ErrNotFound) {
				t.Errorf("reader: %v, want ErrNotFound", err)
			}
		}
		if err := wait(); !errors.Is(err, ErrNotFound) {
			t.Errorf("wait: %v, want ErrNotFound", err)
		}
	})
	t.Run("canceled mid-body", func(t *testing.T) {
		reg := newTestRegistry(t, data)
		reg.fault = hangBody(100, data)
		b, _ := newTestBlob(t, reg)
		ctx, cancel := context.WithCancel(t.Context())
		parts, wait, err := b.Stream(ctx, []byterange.Range{{Offset: 0, Length: 100}})
		if err != nil {
			t.Fatal(err)
		}
		p := parts[0].(*Part)
		if c, err := p.ReadByte(); err != nil || c != data[0] {
			t.Fatalf("first byte: %v", err)
		}
		time.AfterFunc(50*time.Millisecond, cancel)
		if _, err := io.ReadAll(p); !errors.Is(err, context.Canceled) {
			t.Errorf("reader: %v, want context.Canceled", err)
		}
		if err := wait(); !errors.Is(err, context.Canceled) {
			t.Errorf("wait: %v, want context.Canceled", err)
		}
	})
}

// TestStreamJoinsARequest: a stream of a span another caller is fetching waits for that
// request and reads its bytes, without a request of its own; a range longer than the maximum
// span is read across spans.
func TestStreamJoinsARequest(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.gate = make(chan struct{})
	b, _ := newTestBlob(t, reg, Config{MaxSpan: 64 << 10})
	r := byterange.Range{Offset: 10, Length: 200_000} // four spans
	fetched := make(chan error, 1)
	go func() {
		_, err := b.Fetch(t.Context(), []byterange.Range{r})
		fetched <- err
	}()
	waitFor(t, "the first caller's requests", func() bool { return reg.count() >= 1 })
	parts, wait, err := b.Stream(t.Context(), []byterange.Range{r})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream to join", func() bool { return b.waiting.Load() == 1 })
	close(reg.gate)
	got, err := io.ReadAll(parts[0])
	if err != nil || !bytes.Equal(got, data[r.Offset:r.End()]) {
		t.Fatalf("joined stream: %d bytes, %v", len(got), err)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if err := <-fetched; err != nil {
		t.Fatal(err)
	}
	if n, spans := reg.count(), len(coalesce([]byterange.Range{r}, b.o.maxGap, b.o.maxSpan)); n > spans {
		t.Errorf("%d requests for %d spans fetched twice, want at most %d", n, spans, spans)
	}
}
