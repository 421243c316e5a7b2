package fetcher

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// storage plays blob storage behind a registry: it serves the blob at /blob?sig=<signature>,
// and a signature expires (403) after maxUses requests.
type storage struct {
	data    []byte
	maxUses int
	srv     *httptest.Server

	mu       sync.Mutex
	n        int
	uses     map[string]int
	withAuth int // requests that carried an Authorization header
}

func newStorage(t *testing.T, data []byte, maxUses int) *storage {
	s := &storage{data: data, maxUses: maxUses, uses: make(map[string]int)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sig := r.URL.Query().Get("sig")
		s.mu.Lock()
		s.n++
		s.uses[sig]++
		uses := s.uses[sig]
		if r.Header.Get("Authorization") != "" {
			s.withAuth++
		}
		s.mu.Unlock()
		if r.URL.Path != "/blob" || sig == "" {
			http.NotFound(w, r)
			return
		}
		if uses > s.maxUses {
			http.Error(w, "Request has expired", http.StatusForbidden)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(s.data))
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *storage) stats() (requests, withAuth int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.withAuth
}

// redirectTo makes the registry redirect blob GETs to a freshly signed storage URL.
func redirectTo(s *storage) func(http.ResponseWriter, *http.Request, int) bool {
	return func(w http.ResponseWriter, r *http.Request, n int) bool {
		http.Redirect(w, r, s.srv.URL+"/blob?sig=secret-"+strconv.Itoa(n), http.StatusTemporaryRedirect)
		return true
	}
}

// TestRedirectCachedAndRefreshed: the redirect target is cached; when its signature expires,
// the registry is asked exactly once more. Storage never sees the registry's credentials and
// serves multi-range requests.
func TestRedirectCachedAndRefreshed(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	st := newStorage(t, data, 2)
	reg.fault = redirectTo(st)
	b, _ := newTestBlob(t, reg)

	checkFetch(t, b, data, near1, far1) // registry, storage sig 1 (use 1)
	checkFetch(t, b, data, far2, far3)  // storage sig 1 (use 2), from the cache
	if got := reg.count(); got != 1 {
		t.Errorf("registry saw %d requests before expiry, want 1", got)
	}
	checkFetch(t, b, data, near1, far3) // sig 1 expired (403), registry again, sig 2
	checkFetch(t, b, data, far1)        // sig 2 from the cache
	if got := reg.count(); got != 2 {
		t.Errorf("registry saw %d requests, want 2 (one refresh after expiry)", got)
	}
	requests, withAuth := st.stats()
	if requests != 5 {
		t.Errorf("storage saw %d requests, want 5", requests)
	}
	if withAuth != 0 {
		t.Errorf("storage saw the registry's Authorization header %d times", withAuth)
	}
	reg.mu.Lock()
	auth := append([]string(nil), reg.auth...)
	reg.mu.Unlock()
	for i, a := range auth {
		if a == "" {
			t.Errorf("registry request %d had no Authorization header", i+1)
		}
	}
	if got := b.Stats().Requests; got != 7 {
		t.Errorf("Stats().Requests = %d, want 7", got)
	}
	if got := b.Stats().Retries; got != 0 {
		t.Errorf("Stats().Retries = %d, want 0", got)
	}
}

// TestRedirectFreshTargetForbidden: a 403 from storage right after the registry's redirect is
// an authorization failure, not a loop, and the error does not quote the signature.
func TestRedirectFreshTargetForbidden(t *testing.T) {
	data := testBlob(1000)
	reg := newTestRegistry(t, data)
	st := newStorage(t, data, 0)
	reg.fault = redirectTo(st)
	b, _ := newTestBlob(t, reg)
	_, err := b.ReadAt(t.Context(), make([]byte, 10), 0)
	var fe *Error
	if !errors.Is(err, ErrUnauthorized) || !errors.As(err, &fe) || fe.StatusCode != http.StatusForbidden {
		t.Fatalf("error = %v, want an *Error wrapping ErrUnauthorized with status 403", err)
	}
	if strings.Contains(err.Error(), "secret") || strings.Contains(fe.URL, "?") {
		t.Errorf("error %q quotes the signed URL's query", err)
	}
	if !strings.HasPrefix(fe.URL, st.srv.URL+"/blob") {
		t.Errorf("error URL = %q, want the storage URL without its query", fe.URL)
	}
	if got := reg.count(); got != 1 {
		t.Errorf("registry saw %d requests, want 1", got)
	}
}

// TestRedirectStorageErrorsRedacted: a connection failure at storage is retried (through the
// registry, since the target was not cached yet) and the error never carries the query string.
func TestRedirectStorageErrorsRedacted(t *testing.T) {
	data := testBlob(1000)
	reg := newTestRegistry(t, data)
	reg.fault = func(w http.ResponseWriter, r *http.Request, n int) bool {
		// A storage host that refuses connections.
		http.Redirect(w, r, "http://127.0.0.1:1/blob?sig=secret-"+strconv.Itoa(n), http.StatusFound)
		return true
	}
	b, _ := newTestBlob(t, reg, WithMaxAttempts(2))
	_, err := b.ReadAt(t.Context(), make([]byte, 10), 0)
	if !errors.Is(err, ErrTransient) {
		t.Fatalf("error = %v, want ErrTransient", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error %q quotes the signed URL's query", err)
	}
	if got := reg.count(); got != 2 {
		t.Errorf("registry saw %d requests, want 2", got)
	}
}

func TestTooManyRedirects(t *testing.T) {
	data := testBlob(1000)
	reg := newTestRegistry(t, data)
	reg.fault = func(w http.ResponseWriter, r *http.Request, _ int) bool {
		http.Redirect(w, r, r.URL.Path, http.StatusFound) // to itself
		return true
	}
	b, _ := newTestBlob(t, reg)
	if _, err := b.ReadAt(t.Context(), make([]byte, 10), 0); !errors.Is(err, ErrBadResponse) {
		t.Fatalf("error = %v, want ErrBadResponse", err)
	}
	if got := reg.count(); got != maxRedirects+1 {
		t.Errorf("registry saw %d requests, want %d", got, maxRedirects+1)
	}
}
