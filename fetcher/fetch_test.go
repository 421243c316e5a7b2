package fetcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/verify"
)

var _ verify.Source = (*Blob)(nil)

// Ranges more than the default gap apart.
var (
	near1 = byterange.Range{Offset: 1000, Length: 100}
	far1  = byterange.Range{Offset: 500_000, Length: 200}
	far2  = byterange.Range{Offset: 700_000, Length: 50}
	far3  = byterange.Range{Offset: 900_000, Length: 4096}
)

func hasComma(hs []string) []bool {
	out := make([]bool, len(hs))
	for i, h := range hs {
		out[i] = strings.Contains(h, ",")
	}
	return out
}

// TestReadAtRegistry reads from go-containerregistry's registry, which serves single ranges.
func TestReadAtRegistry(t *testing.T) {
	data := testBlob(300_000)
	reg := newTestRegistry(t, data)
	b, _ := newTestBlob(t, reg)
	ctx := t.Context()
	for _, r := range []byterange.Range{{Offset: 0, Length: 1}, {Offset: 0, Length: 300_000}, {Offset: 123_456, Length: 7}, {Offset: 299_999, Length: 1}} {
		p := make([]byte, r.Length)
		n, err := b.ReadAt(ctx, p, r.Offset)
		if err != nil || n != len(p) {
			t.Fatalf("ReadAt(%d bytes at %d) = %d, %v", r.Length, r.Offset, n, err)
		}
		if !bytes.Equal(p, data[r.Offset:r.End()]) {
			t.Errorf("ReadAt(%d bytes at %d): bytes differ", r.Length, r.Offset)
		}
	}
	if got := reg.count(); got != 4 {
		t.Errorf("registry saw %d requests, want 4", got)
	}
	if st := b.Stats(); st.Requests != 4 || st.BytesReceived != 1+300_000+7+1 {
		t.Errorf("Stats = %+v, want 4 requests and %d bytes", st, 1+300_000+7+1)
	}

	// Past the end: the bytes up to the end and io.EOF, without asking for more.
	p := make([]byte, 10)
	n, err := b.ReadAt(ctx, p, 299_995)
	if n != 5 || !errors.Is(err, io.EOF) || !bytes.Equal(p[:5], data[299_995:]) {
		t.Errorf("ReadAt across the end = %d, %v; want 5, io.EOF and the last bytes", n, err)
	}
	if n, err := b.ReadAt(ctx, p, 300_000); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("ReadAt at the end = %d, %v; want 0, io.EOF", n, err)
	}
}

type readerAt struct{ b *Blob }

func (r readerAt) ReadAt(p []byte, off int64) (int, error) {
	return r.b.ReadAt(context.Background(), p, off)
}

func TestIOTestReader(t *testing.T) {
	data := testBlob(300)
	reg := newTestRegistry(t, data)
	reg.serveRanges = true
	b, _ := newTestBlob(t, reg)
	if err := iotest.TestReader(io.NewSectionReader(readerAt{b}, 0, b.Size()), data); err != nil {
		t.Fatal(err)
	}
}

func TestFetchAdjacentRangesOneRequest(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	b, _ := newTestBlob(t, reg)
	checkFetch(t, b, data, byterange.Range{Offset: 2000, Length: 100}, byterange.Range{Offset: 0, Length: 1000}, byterange.Range{Offset: 1000, Length: 1000})
	if got, want := reg.rangeHeaders(), []string{"bytes=0-2099"}; !equalStrings(got, want) {
		t.Errorf("Range headers = %q, want %q", got, want)
	}
}

func TestFetchNearRangesOneRequest(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	b, _ := newTestBlob(t, reg)
	checkFetch(t, b, data, byterange.Range{Offset: 0, Length: 10}, byterange.Range{Offset: 60_000, Length: 10}, byterange.Range{Offset: 30_000, Length: 10})
	if got, want := reg.rangeHeaders(), []string{"bytes=0-60009"}; !equalStrings(got, want) {
		t.Errorf("Range headers = %q, want %q", got, want)
	}
}

// TestFetchMultiRange: a Distribution-style server answers distant ranges with one
// 206 multipart/byteranges response.
func TestFetchMultiRange(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.serveRanges = true
	b, _ := newTestBlob(t, reg)
	checkFetch(t, b, data, far1, near1)
	want := []string{"bytes=1000-1099,500000-500199"}
	if got := reg.rangeHeaders(); !equalStrings(got, want) {
		t.Errorf("Range headers = %q, want %q", got, want)
	}
	// Later calls keep using multi-range requests.
	checkFetch(t, b, data, far2, far3)
	if got := reg.count(); got != 2 {
		t.Errorf("registry saw %d requests, want 2", got)
	}
}

func TestFetchMaxRangesPerRequest(t *testing.T) {
	data := testBlob(2 << 20)
	reg := newTestRegistry(t, data)
	reg.serveRanges = true
	b, _ := newTestBlob(t, reg)
	var ranges []byterange.Range
	for i := range 20 {
		ranges = append(ranges, byterange.Range{Offset: int64(i) * 100_000, Length: 10})
	}
	checkFetch(t, b, data, ranges...)
	if got := reg.count(); got != 2 {
		t.Errorf("20 distant ranges took %d requests, want 2 (16 ranges each at most)", got)
	}
	for _, h := range reg.rangeHeaders() {
		if n := strings.Count(h, ",") + 1; n > 16 {
			t.Errorf("request asked for %d ranges, want at most 16", n)
		}
	}
}

// TestFetchRegistryMultiRangeFallback: go-containerregistry's registry answers a multi-range
// request with the first range only; the rest is asked for alone, and later calls send single
// ranges from the start.
func TestFetchRegistryMultiRangeFallback(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	b, _ := newTestBlob(t, reg)
	checkFetch(t, b, data, near1, far1)
	checkFetch(t, b, data, far2, far3)
	got := hasComma(reg.rangeHeaders())
	if want := []bool{true, false, false, false}; !equalBools(got, want) {
		t.Errorf("multi-range requests: %v, want %v (%q)", got, want, reg.rangeHeaders())
	}
}

func TestFetchMultiRangeRefused(t *testing.T) {
	for _, code := range []int{http.StatusBadRequest, http.StatusRequestedRangeNotSatisfiable} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			data := testBlob(1 << 20)
			reg := newTestRegistry(t, data)
			reg.serveRanges = true
			reg.fault = func(w http.ResponseWriter, r *http.Request, _ int) bool {
				if strings.Contains(r.Header.Get("Range"), ",") {
					w.WriteHeader(code)
					return true
				}
				return false
			}
			b, _ := newTestBlob(t, reg)
			checkFetch(t, b, data, near1, far1)
			if got := reg.count(); got != 3 {
				t.Errorf("first Fetch: %d requests, want 3 (refused multi-range, then 2 single)", got)
			}
			checkFetch(t, b, data, far2, far3)
			got := hasComma(reg.rangeHeaders())
			if want := []bool{true, false, false, false, false}; !equalBools(got, want) {
				t.Errorf("multi-range requests: %v, want %v", got, want)
			}
			if st := b.Stats(); st.Retries != 0 {
				t.Errorf("Retries = %d, want 0", st.Retries)
			}
		})
	}
}

// TestFetchMultiRangeAnsweredWithFullBody: a 200 answer to a multi-range request is used
// (read only up to the last needed byte) and not asked again; later calls use single ranges.
func TestFetchMultiRangeAnsweredWithFullBody(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.serveRanges = true
	reg.fault = fullBodyForMulti(data)
	b, _ := newTestBlob(t, reg)
	checkFetch(t, b, data, near1, far1)
	if got := reg.count(); got != 1 {
		t.Errorf("first Fetch: %d requests, want 1", got)
	}
	if got, limit := b.Stats().BytesReceived, far1.End()+drainLimit; got > limit {
		t.Errorf("read %d bytes of the full body, want at most %d", got, limit)
	}
	checkFetch(t, b, data, far2, far3)
	got := hasComma(reg.rangeHeaders())
	if want := []bool{true, false, false}; !equalBools(got, want) {
		t.Errorf("multi-range requests: %v, want %v", got, want)
	}
}

// TestReadAtRangeIgnored: a server without range support answers 200; one request, right bytes.
func TestReadAtRangeIgnored(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.fault = func(w http.ResponseWriter, r *http.Request, _ int) bool {
		_, _ = w.Write(data)
		return true
	}
	b, _ := newTestBlob(t, reg)
	checkFetch(t, b, data, far1)
	if got := reg.count(); got != 1 {
		t.Errorf("%d requests, want 1", got)
	}
}

func TestWrongContentRange(t *testing.T) {
	data := testBlob(1 << 20)
	for _, tt := range []struct {
		name  string
		fault func(w http.ResponseWriter, r *http.Request, n int) bool
		get   []byterange.Range
	}{
		{"single range shifted", func(w http.ResponseWriter, r *http.Request, _ int) bool {
			w.Header().Set("Content-Range", "bytes 1001-1100/1048576")
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(data[1001:1101])
			return true
		}, []byterange.Range{near1}},
		{"single range elsewhere", func(w http.ResponseWriter, r *http.Request, _ int) bool {
			w.Header().Set("Content-Range", "bytes 5000-5099/1048576")
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(data[5000:5100])
			return true
		}, []byterange.Range{near1}},
		{"multi-range answered with an unasked single range", func(w http.ResponseWriter, r *http.Request, _ int) bool {
			w.Header().Set("Content-Range", "bytes 5000-5099/1048576")
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(data[5000:5100])
			return true
		}, []byterange.Range{near1, far1}},
		{"wrong blob size", func(w http.ResponseWriter, r *http.Request, _ int) bool {
			w.Header().Set("Content-Range", "bytes 1000-1099/5000000")
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(data[1000:1100])
			return true
		}, []byterange.Range{near1}},
		{"multipart part not asked for", func(w http.ResponseWriter, r *http.Request, _ int) bool {
			r.Header.Set("Range", "bytes=1001-1100,500000-500199")
			http.ServeContent(w, r, "", zeroTime, bytes.NewReader(data))
			return true
		}, []byterange.Range{near1, far1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reg := newTestRegistry(t, data)
			reg.fault = tt.fault
			b, _ := newTestBlob(t, reg)
			_, err := b.Fetch(t.Context(), tt.get)
			var fe *Error
			if !errors.Is(err, ErrBadResponse) || !errors.As(err, &fe) {
				t.Fatalf("Fetch error = %v, want an *Error wrapping ErrBadResponse", err)
			}
			if got := reg.count(); got != 1 {
				t.Errorf("%d requests, want 1", got)
			}
		})
	}
}

func TestTypedErrors(t *testing.T) {
	data := testBlob(1000)
	tests := []struct {
		name   string
		fault  func(w http.ResponseWriter, r *http.Request, n int) bool
		url    func(string) string
		want   error
		status int
	}{
		{"unknown blob", nil, func(u string) string { return u[:len(u)-4] + "0000" }, ErrNotFound, 404},
		{"401", failStatus(99, 401), nil, ErrUnauthorized, 401},
		{"403", failStatus(99, 403), nil, ErrUnauthorized, 403},
		{"single range refused", failStatus(99, 416), nil, ErrRangeUnsupported, 416},
		{"unexpected status", failStatus(99, 204), nil, ErrBadResponse, 204},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newTestRegistry(t, data)
			reg.fault = tt.fault
			if tt.url != nil {
				reg.blobURL = tt.url(reg.blobURL)
			}
			b, _ := newTestBlob(t, reg)
			_, err := b.ReadAt(t.Context(), make([]byte, 10), 0)
			var fe *Error
			if !errors.Is(err, tt.want) || !errors.As(err, &fe) || fe.StatusCode != tt.status {
				t.Fatalf("ReadAt error = %v, want an *Error with status %d wrapping %v", err, tt.status, tt.want)
			}
			if got := reg.count(); got != 1 {
				t.Errorf("%d requests, want 1 (no retry)", got)
			}
		})
	}
}

func TestInvalidRange(t *testing.T) {
	data := testBlob(1000)
	reg := newTestRegistry(t, data)
	b, _ := newTestBlob(t, reg)
	for _, r := range []byterange.Range{{Offset: -1, Length: 5}, {Offset: 0, Length: -1}, {Offset: 999, Length: 2}, {Offset: 1001, Length: 0}} {
		if _, err := b.Fetch(t.Context(), []byterange.Range{r}); !errors.Is(err, ErrInvalidRange) {
			t.Errorf("Fetch(%v) error = %v, want ErrInvalidRange", r, err)
		}
	}
	if _, err := b.ReadAt(t.Context(), make([]byte, 1), -1); !errors.Is(err, ErrInvalidRange) {
		t.Errorf("ReadAt at -1: error = %v, want ErrInvalidRange", err)
	}
	got, err := b.Fetch(t.Context(), []byterange.Range{{Offset: 1000, Length: 0}, {Offset: 5, Length: 0}})
	if err != nil || len(got) != 2 || len(got[0]) != 0 || len(got[1]) != 0 {
		t.Errorf("Fetch of empty ranges = %v, %v; want two empty slices", got, err)
	}
	if n := reg.count(); n != 0 {
		t.Errorf("%d requests, want 0", n)
	}
}

func TestCanceledContext(t *testing.T) {
	data := testBlob(1000)
	reg := newTestRegistry(t, data)
	b, _ := newTestBlob(t, reg)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := b.ReadAt(ctx, make([]byte, 10), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadAt error = %v, want context.Canceled", err)
	}
	if n := reg.count(); n != 0 {
		t.Errorf("%d requests, want 0", n)
	}
}

// TestSingleflight: concurrent fetches of the same range share one request.
func TestSingleflight(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.gate = make(chan struct{})
	b, _ := newTestBlob(t, reg)
	const readers = 5
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() {
			got, err := b.Fetch(t.Context(), []byterange.Range{far1})
			if err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(got[0], data[far1.Offset:far1.End()]) {
				t.Error("bytes differ")
			}
		})
	}
	waitFor(t, "one request and the other readers waiting on it", func() bool {
		return reg.count() == 1 && b.waiting.Load() == readers-1
	})
	close(reg.gate)
	wg.Wait()
	if got := reg.count(); got != 1 {
		t.Errorf("%d requests for %d concurrent fetches of one range, want 1", got, readers)
	}
}

// TestSingleflightOwnerCanceled: when the caller that sent the shared request gives up, a
// waiting caller asks again itself and gets the bytes.
func TestSingleflightOwnerCanceled(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.gate = make(chan struct{})
	b, _ := newTestBlob(t, reg)
	first := []byterange.Range{{Offset: 0, Length: 10}}
	ownerCtx, cancelOwner := context.WithCancel(t.Context())
	ownerDone := make(chan error, 1)
	go func() {
		_, err := b.Fetch(ownerCtx, first)
		ownerDone <- err
	}()
	waitFor(t, "the first request", func() bool { return reg.count() == 1 })
	waiterDone := make(chan error, 1)
	var got [][]byte
	go func() {
		var err error
		got, err = b.Fetch(t.Context(), first)
		waiterDone <- err
	}()
	waitFor(t, "the second reader to wait", func() bool { return b.waiting.Load() == 1 })
	cancelOwner()
	if err := <-ownerDone; !errors.Is(err, context.Canceled) {
		t.Errorf("owner error = %v, want context.Canceled", err)
	}
	waitFor(t, "the second request", func() bool { return reg.count() == 2 })
	close(reg.gate)
	if err := <-waiterDone; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if !bytes.Equal(got[0], data[:10]) {
		t.Error("waiter's bytes differ")
	}
}

// TestReadAtIntoCallersBuffer: ReadAt reads the spans straight into the caller's buffer,
// allocating no buffer of their size (a TOC read in pieces left each piece's buffer to the
// collector), however the registry answers: one span, several in one multi-range request,
// several after a refused multi-range request, a whole body for a range. Concurrent ReadAts of
// one range share no request: each owner may overwrite its buffer.
func TestReadAtIntoCallersBuffer(t *testing.T) {
	data := testBlob(8 << 20)
	const off, n = 12_345, 6 << 20
	for _, c := range []struct {
		name  string
		cfg   Config
		fault func(w http.ResponseWriter, r *http.Request, _ int) bool
	}{
		{name: "one span"},
		{name: "multi-range", cfg: Config{MaxSpan: 1 << 20}},
		{name: "multi-range refused", cfg: Config{MaxSpan: 1 << 20}, fault: func(w http.ResponseWriter, r *http.Request, _ int) bool {
			if strings.Contains(r.Header.Get("Range"), ",") {
				w.WriteHeader(http.StatusBadRequest)
				return true
			}
			return false
		}},
		{name: "range ignored", fault: func(w http.ResponseWriter, r *http.Request, _ int) bool {
			_, _ = w.Write(data)
			return true
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := newTestRegistry(t, data)
			reg.serveRanges = true
			reg.fault = c.fault
			b, _ := newTestBlob(t, reg, c.cfg)
			p := make([]byte, n)
			if _, err := b.ReadAt(t.Context(), make([]byte, 10), 0); err != nil { // the connection, once
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			got, err := b.ReadAt(t.Context(), p, off)
			runtime.ReadMemStats(&after)
			if err != nil || got != n || !bytes.Equal(p, data[off:off+n]) {
				t.Fatalf("ReadAt = %d, %v, bytes equal %v", got, err, bytes.Equal(p, data[off:off+n]))
			}
			// The server runs in this process: what it allocates counts too.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > n/4 {
				t.Errorf("ReadAt of %d bytes allocated %d bytes", n, alloc)
			}
		})
	}

	reg := newTestRegistry(t, data)
	reg.serveRanges = true
	reg.gate = make(chan struct{})
	b, _ := newTestBlob(t, reg)
	var wg sync.WaitGroup
	bufs := [][]byte{make([]byte, far1.Length), make([]byte, far1.Length)}
	for _, p := range bufs {
		wg.Go(func() {
			if _, err := b.ReadAt(t.Context(), p, far1.Offset); err != nil || !bytes.Equal(p, data[far1.Offset:far1.End()]) {
				t.Errorf("ReadAt: %v, bytes equal %v", err, bytes.Equal(p, data[far1.Offset:far1.End()]))
			}
			clear(p) // its owner's to overwrite
		})
	}
	waitFor(t, "a request of each reader", func() bool { return reg.count() == 2 })
	close(reg.gate)
	wg.Wait()
}

func equalStrings(a, b []string) bool { return strings.Join(a, "|") == strings.Join(b, "|") }

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var zeroTime time.Time

// TestFetchResultsAreViews: results within one span are views of it, cut so that appending to
// one cannot overwrite another; a range across two spans (longer than the maximum span) is
// copied together.
func TestFetchResultsAreViews(t *testing.T) {
	data := testBlob(300_000)
	reg := newTestRegistry(t, data)
	b, _ := newTestBlob(t, reg, Config{MaxSpan: 100_000})
	ranges := []byterange.Range{{Offset: 0, Length: 10}, {Offset: 10, Length: 10}, {Offset: 5, Length: 10}, {Offset: 99_990, Length: 20}, {Offset: 0, Length: 0}}
	got, err := b.Fetch(t.Context(), ranges)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(got[0], 0xff, 0xff)
	for i, r := range ranges {
		if !bytes.Equal(got[i], data[r.Offset:r.End()]) {
			t.Errorf("range %v: bytes differ", r)
		}
	}
	if got[4] == nil {
		t.Error("an empty range returned nil")
	}
}

// TestReadAtAcrossSpans: a range longer than the maximum span is read in spans, their bytes
// gathered into the caller's buffer, up to the end of the blob.
func TestReadAtAcrossSpans(t *testing.T) {
	data := testBlob(300_000)
	reg := newTestRegistry(t, data)
	b, _ := newTestBlob(t, reg, Config{MaxSpan: 100_000})
	for _, r := range []byterange.Range{{Offset: 0, Length: 300_000}, {Offset: 99_999, Length: 100_002}, {Offset: 12_345, Length: 250_000}} {
		p := make([]byte, r.Length)
		if n, err := b.ReadAt(t.Context(), p, r.Offset); err != nil || n != len(p) {
			t.Fatalf("ReadAt(%d bytes at %d) = %d, %v", r.Length, r.Offset, n, err)
		}
		if !bytes.Equal(p, data[r.Offset:r.End()]) {
			t.Errorf("ReadAt(%d bytes at %d): bytes differ", r.Length, r.Offset)
		}
	}
	p := make([]byte, 250_000)
	if n, err := b.ReadAt(t.Context(), p, 150_000); n != 150_000 || !errors.Is(err, io.EOF) || !bytes.Equal(p[:n], data[150_000:]) {
		t.Errorf("ReadAt across the end = %d, %v; want 150000, io.EOF and the last bytes", n, err)
	}
}

// TestFetchFarRangesOneRequest: two ranges too far apart to be merged into one span are asked
// for in one multi-range request, of a server answering Range requests as net/http does.
func TestFetchFarRangesOneRequest(t *testing.T) {
	blob := bytes.Repeat([]byte("."), 200<<10)
	copy(blob[0:], "hello")
	copy(blob[150_000:], "world")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(blob))
	}))
	t.Cleanup(srv.Close)
	b, err := newURLBlob(srv.Client().Transport, srv.URL+"/v2/app/blobs/sha256:"+strings.Repeat("0", 64), int64(len(blob)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Fetch(t.Context(), []byterange.Range{{Offset: 0, Length: 5}, {Offset: 150_000, Length: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if s := fmt.Sprintf("%s %s", got[0], got[1]); s != "hello world" {
		t.Errorf("fetched %q, want \"hello world\"", s)
	}
	if n := b.Stats().Requests; n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}
