package fetcher

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/layerstore/layerstore/internal/byterange"
)

const testRepo = "test/layer"

// testBlob returns n deterministic pseudo-random bytes.
func testBlob(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{1, 2, 3}).Read(b)
	return b
}

// faultHandler wraps go-containerregistry's registry: blob GETs are counted and may be answered
// by a fault, or served from data with http.ServeContent (which does multi-range) when
// serveRanges is set; everything else goes to the registry.
type faultHandler struct {
	inner       http.Handler
	data        []byte
	path        string // /v2/<repo>/blobs/<digest>
	serveRanges bool
	fault       func(w http.ResponseWriter, r *http.Request, n int) bool
	gate        chan struct{} // when non-nil, blob GETs wait for it to be closed

	mu       sync.Mutex
	n        int
	ranges   []string
	auth     []string
	inflight int
	peak     int
}

func (f *faultHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/v2/"+testRepo+"/blobs/") {
		f.inner.ServeHTTP(w, r)
		return
	}
	f.mu.Lock()
	f.n++
	n := f.n
	f.ranges = append(f.ranges, r.Header.Get("Range"))
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	f.inflight++
	f.peak = max(f.peak, f.inflight)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second):
		}
	}
	if f.fault != nil && f.fault(w, r, n) {
		return
	}
	if f.serveRanges && r.URL.Path == f.path {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.data))
		return
	}
	f.inner.ServeHTTP(w, r)
}

func (f *faultHandler) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func (f *faultHandler) rangeHeaders() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ranges...)
}

type testRegistry struct {
	*faultHandler
	srv     *httptest.Server
	blobURL string
}

// newTestRegistry starts a registry holding data as a blob of testRepo.
func newTestRegistry(t testing.TB, data []byte) *testRegistry {
	t.Helper()
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	sum := sha256.Sum256(data)
	dgst := "sha256:" + hex.EncodeToString(sum[:])
	req := httptest.NewRequest(http.MethodPost, "/v2/"+testRepo+"/blobs/uploads/?digest="+dgst, bytes.NewReader(data))
	rec := httptest.NewRecorder()
	inner.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		t.Fatalf("pushing blob: status %d: %s", rec.Code, rec.Body)
	}
	f := &faultHandler{inner: inner, data: data, path: "/v2/" + testRepo + "/blobs/" + dgst}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return &testRegistry{faultHandler: f, srv: srv, blobURL: srv.URL + f.path}
}

// authTransport plays an authenticated registry transport that adds its credentials to every
// request it is given, so that a Blob must keep it away from other hosts.
type authTransport struct{ rt http.RoundTripper }

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer registry-secret")
	return a.rt.RoundTrip(r)
}

// plainTransport returns a transport without keep-alives, so that a reset connection is never
// retried by net/http itself and request counts are exact.
func plainTransport(t *testing.T) *http.Transport {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// sleepRecorder replaces real sleeps between attempts.
type sleepRecorder struct {
	mu sync.Mutex
	ds []time.Duration
}

func (s *sleepRecorder) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.ds = append(s.ds, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleepRecorder) delays() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.ds...)
}

// newTestBlob returns a Blob for reg's blob with a private limiter and recorded sleeps, unless
// cfg (at most one) sets them.
func newTestBlob(t *testing.T, reg *testRegistry, cfg ...Config) (*Blob, *sleepRecorder) {
	t.Helper()
	var c Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	sr := &sleepRecorder{}
	if c.sleep == nil {
		c.sleep = sr.sleep
	}
	if c.limiter == nil {
		c.limiter = newHostLimiter(8)
	}
	if c.storageTransport == nil {
		c.storageTransport = guardDials(plainTransport(t))
	}
	b, err := newURLBlob(authTransport{plainTransport(t)}, reg.blobURL, int64(len(reg.data)), c)
	if err != nil {
		t.Fatal(err)
	}
	return b, sr
}

// newURLBlob returns a Blob reading the blob at blobURL (https://host/v2/<repo>/blobs/<digest>),
// whose size is size bytes, through rt, a transport already authenticated to the registry.
func newURLBlob(rt http.RoundTripper, blobURL string, size int64, cfg Config) (*Blob, error) {
	o, err := cfg.options()
	if err != nil {
		return nil, err
	}
	ep, err := newEndpoint(rt, blobURL)
	if err != nil {
		return nil, err
	}
	return newBlob([]*endpoint{ep}, size, o)
}

// checkFetch fetches ranges and compares each with data.
func checkFetch(t *testing.T, b *Blob, data []byte, ranges ...byterange.Range) {
	t.Helper()
	got, err := b.Fetch(t.Context(), ranges)
	if err != nil {
		t.Fatalf("Fetch(%v): %v", ranges, err)
	}
	if len(got) != len(ranges) {
		t.Fatalf("Fetch(%v) returned %d slices, want %d", ranges, len(got), len(ranges))
	}
	for i, r := range ranges {
		if !bytes.Equal(got[i], data[r.Offset:r.End()]) {
			t.Errorf("Fetch range %v: bytes differ from the blob's", r)
		}
	}
}

// waitFor polls cond until it holds; it fails the test after 10 s. It bounds waits for
// goroutines to reach a state and asserts nothing about durations.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Faults.

// failStatus answers the first k blob GETs with code and the given headers.
func failStatus(k, code int, hdr ...string) func(http.ResponseWriter, *http.Request, int) bool {
	return func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n > k {
			return false
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.WriteHeader(code)
		return true
	}
}

// resetConn closes the connection of the first k blob GETs without answering.
func resetConn(k int) func(http.ResponseWriter, *http.Request, int) bool {
	return func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n > k {
			return false
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		_ = conn.Close()
		return true
	}
}

// serveRecorded answers with what ServeContent would, passed through edit.
func serveRecorded(w http.ResponseWriter, r *http.Request, data []byte, edit func(h http.Header, body []byte) []byte) {
	rec := httptest.NewRecorder()
	http.ServeContent(rec, r, "", time.Time{}, bytes.NewReader(data))
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	body := edit(w.Header(), rec.Body.Bytes())
	w.WriteHeader(rec.Code)
	_, _ = w.Write(body)
}

// truncateBody sends only half of the body of the first k blob GETs (Content-Length stays).
func truncateBody(k int, data []byte) func(http.ResponseWriter, *http.Request, int) bool {
	return func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n > k {
			return false
		}
		serveRecorded(w, r, data, func(_ http.Header, body []byte) []byte { return body[:len(body)/2] })
		return true
	}
}

// hangBody sends the headers and a few bytes of the first k blob GETs, then stalls until the
// client goes away (at most 10 s).
func hangBody(k int, data []byte) func(http.ResponseWriter, *http.Request, int) bool {
	return func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n > k {
			return false
		}
		serveRecorded(w, r, data, func(_ http.Header, body []byte) []byte { return body[:min(len(body), 3)] })
		_ = http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return true
	}
}

// fullBodyForMulti answers multi-range requests with 200 and the whole blob.
func fullBodyForMulti(data []byte) func(http.ResponseWriter, *http.Request, int) bool {
	return func(w http.ResponseWriter, r *http.Request, _ int) bool {
		if !strings.Contains(r.Header.Get("Range"), ",") {
			return false
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		_, _ = w.Write(data)
		return true
	}
}
