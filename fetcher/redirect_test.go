package fetcher

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/byterange"
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
	b, _ := newTestBlob(t, reg, Config{MaxAttempts: 2})
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

func TestRedirectPolicy(t *testing.T) {
	a := netip.MustParseAddr
	public, private, loop := a("203.0.113.7"), a("10.1.2.3"), a("127.0.0.1")
	cases := []struct {
		origin []netip.Addr
		target string
		ok     bool
	}{
		{[]netip.Addr{public}, "198.51.100.1", true},
		{[]netip.Addr{public}, "2001:db8::1", true},
		{[]netip.Addr{public}, "127.0.0.1", false},
		{[]netip.Addr{public}, "127.1.2.3", false},
		{[]netip.Addr{public}, "::1", false},
		{[]netip.Addr{public}, "::ffff:127.0.0.1", false},
		{[]netip.Addr{public}, "64:ff9b::a9fe:a9fe", false}, // NAT64 of 169.254.169.254
		{[]netip.Addr{public}, "169.254.169.254", false},
		{[]netip.Addr{public}, "fe80::1", false},
		{[]netip.Addr{public}, "0.0.0.0", false},
		{[]netip.Addr{public}, "0.1.2.3", false},
		{[]netip.Addr{public}, "::", false},
		{[]netip.Addr{public}, "10.0.0.1", false},
		{[]netip.Addr{public}, "172.16.0.1", false},
		{[]netip.Addr{public}, "192.168.1.1", false},
		{[]netip.Addr{public}, "100.64.0.1", false},
		{[]netip.Addr{public}, "fd00::1", false},
		{[]netip.Addr{public}, "::ffff:10.0.0.1", false},
		{[]netip.Addr{public}, "224.0.0.1", false},
		{[]netip.Addr{public}, "255.255.255.255", false},
		{nil, "127.0.0.1", false}, // the registry's addresses unknown
		{nil, "198.51.100.1", true},
		{[]netip.Addr{loop}, "127.0.0.1", true},
		{[]netip.Addr{a("::1")}, "127.0.0.1", true},
		{[]netip.Addr{loop}, "::ffff:127.0.0.1", true},
		{[]netip.Addr{loop}, "169.254.169.254", false},
		{[]netip.Addr{loop}, "10.0.0.1", false},
		{[]netip.Addr{loop}, "198.51.100.1", true},
		{[]netip.Addr{private}, "192.168.0.9", true},
		{[]netip.Addr{private}, "127.0.0.1", false},
		{[]netip.Addr{private, loop}, "127.0.0.1", true},
		{[]netip.Addr{a("169.254.1.1")}, "169.254.169.254", true},
	}
	for _, c := range cases {
		err := checkHopAddr(c.origin, a(c.target))
		if (err == nil) != c.ok {
			t.Errorf("registry at %v, hop to %s: error %v, want allowed=%v", c.origin, c.target, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrBadResponse) {
			t.Errorf("error %v does not wrap ErrBadResponse", err)
		}
	}
	for _, c := range []struct {
		secure bool
		to     string
		ok     bool
	}{
		{true, "https://storage.example/b", true},
		{true, "http://storage.example/b", false},
		{false, "http://storage.example/b", true},
		{false, "https://storage.example/b", true},
	} {
		u, _ := url.Parse(c.to)
		if err := checkHopScheme(c.secure, u); (err == nil) != c.ok {
			t.Errorf("from https=%v to %s: error %v, want allowed=%v", c.secure, c.to, err, c.ok)
		}
	}
}

// lookupAs makes names resolve as addrs says when hops are checked (dials are not affected).
func lookupAs(addrs map[string]string) func(ctx context.Context, host string) ([]netip.Addr, error) {
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		if a, ok := addrs[host]; ok {
			return []netip.Addr{netip.MustParseAddr(a)}, nil
		}
		return lookupAddrs(ctx, host)
	}
}

// TestRedirectToLoopbackRefused: a registry that appears to be at a public address redirects
// a blob request to a service on 127.0.0.1, by address and by a name that resolves to a public
// address when checked and to 127.0.0.1 when dialed. Both are refused without a request
// reaching the service, and the registry is not asked again.
func TestRedirectToLoopbackRefused(t *testing.T) {
	data := testBlob(1000)
	st := newStorage(t, data, 100)
	_, stPort, _ := net.SplitHostPort(strings.TrimPrefix(st.srv.URL, "http://"))
	rebind := &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			addr = strings.Replace(addr, "storage.test", "127.0.0.1", 1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}
	t.Cleanup(rebind.CloseIdleConnections)
	for _, c := range []struct {
		name, target string
		storage      *http.Transport
	}{
		{"by address", st.srv.URL, plainTransport(t)},
		{"by a rebinding name, dialed by the transport's DialContext", "http://storage.test:" + stPort, rebind},
		{"by a rebinding name, dialed by the default dialer", "http://localhost:" + stPort, plainTransport(t)},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := newTestRegistry(t, data)
			reg.fault = func(w http.ResponseWriter, r *http.Request, n int) bool {
				http.Redirect(w, r, c.target+"/blob?sig=secret-"+strconv.Itoa(n), http.StatusTemporaryRedirect)
				return true
			}
			blobURL := strings.Replace(reg.blobURL, "127.0.0.1", "localhost", 1)
			b, err := newURLBlob(authTransport{plainTransport(t)}, blobURL, int64(len(data)), Config{
				limiter: newHostLimiter(8), storageTransport: guardDials(c.storage),
				lookup: lookupAs(map[string]string{"localhost": "203.0.113.7", "storage.test": "203.0.113.8"})})
			if err != nil {
				t.Fatal(err)
			}
			before, _ := st.stats()
			_, err = b.ReadAt(t.Context(), make([]byte, 10), 0)
			if !errors.Is(err, ErrBadResponse) || !strings.Contains(err.Error(), "is a loopback address and the registry is not at one") {
				t.Fatalf("error = %v, want ErrBadResponse refusing the loopback address", err)
			}
			t.Log(err)
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q quotes the signed URL's query", err)
			}
			if after, _ := st.stats(); after != before {
				t.Errorf("the loopback service saw %d requests, want none", after-before)
			}
			if got := reg.count(); got != 1 {
				t.Errorf("registry saw %d requests, want 1 (no retries)", got)
			}
		})
	}
}

// TestRedirectHTTPSToHTTPRefused: a registry on https redirecting to plain http is refused.
func TestRedirectHTTPSToHTTPRefused(t *testing.T) {
	data := testBlob(1000)
	st := newStorage(t, data, 100)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, st.srv.URL+"/blob?sig=secret", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	b, err := newURLBlob(srv.Client().Transport, srv.URL+"/v2/r/blobs/sha256:"+strings.Repeat("0", 64), int64(len(data)),
		Config{limiter: newHostLimiter(8), storageTransport: guardDials(plainTransport(t))})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.ReadAt(t.Context(), make([]byte, 10), 0)
	if !errors.Is(err, ErrBadResponse) || !strings.Contains(err.Error(), "from https to plain http") {
		t.Fatalf("error = %v, want ErrBadResponse refusing the hop to plain http", err)
	}
	if n, _ := st.stats(); n != 0 {
		t.Errorf("the http service saw %d requests, want none", n)
	}
}

// TestRedirectPoolsApart: a connection to storage opened for a hop away from a registry on
// loopback is not reused for a hop away from a registry at a public address.
func TestRedirectPoolsApart(t *testing.T) {
	data := testBlob(1000)
	st := newStorage(t, data, 100)
	_, stPort, _ := net.SplitHostPort(strings.TrimPrefix(st.srv.URL, "http://"))
	rebind := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, strings.Replace(addr, "storage.test", "127.0.0.1", 1))
	}}
	storage := guardDials(rebind) // one transport, one set of pools, for both blobs
	reg := newTestRegistry(t, data)
	reg.fault = func(w http.ResponseWriter, r *http.Request, n int) bool {
		http.Redirect(w, r, "http://storage.test:"+stPort+"/blob?sig=s"+strconv.Itoa(n), http.StatusTemporaryRedirect)
		return true
	}
	local, err := newURLBlob(authTransport{plainTransport(t)}, reg.blobURL, int64(len(data)), Config{limiter: newHostLimiter(8), storageTransport: storage})
	if err != nil {
		t.Fatal(err)
	}
	checkFetch(t, local, data, byterange.Range{Offset: 0, Length: 10}) // allowed: the registry is on loopback
	public, err := newURLBlob(authTransport{plainTransport(t)}, strings.Replace(reg.blobURL, "127.0.0.1", "localhost", 1), int64(len(data)),
		Config{limiter: newHostLimiter(8), storageTransport: storage,
			lookup: lookupAs(map[string]string{"localhost": "203.0.113.7", "storage.test": "203.0.113.8"})})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := st.stats()
	if _, err := public.ReadAt(t.Context(), make([]byte, 10), 0); !errors.Is(err, ErrBadResponse) {
		t.Fatalf("error = %v, want ErrBadResponse refusing the loopback address", err)
	}
	if after, _ := st.stats(); after != before {
		t.Errorf("the loopback service saw %d requests from the public registry's hop, want none", after-before)
	}
}

// TestFollowedRedirectsChecked: the hops an http.Client follows by itself (manifests,
// configs, tokens, behind go-containerregistry) obey the same rules as blob redirects: a
// registry that appears public cannot send the daemon to loopback, and https never leads to
// plain http; a registry on loopback may redirect to loopback.
func TestFollowedRedirectsChecked(t *testing.T) {
	var hits atomic.Int64
	inside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "metadata")
	}))
	t.Cleanup(inside.Close)
	redirector := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, inside.URL+"/latest/meta-data", http.StatusFound)
	})
	plain := httptest.NewServer(redirector)
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(redirector)
	t.Cleanup(secure.Close)

	base := secure.Client().Transport.(*http.Transport).Clone()
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		addr = strings.Replace(addr, "registry.test", "127.0.0.1", 1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	t.Cleanup(base.CloseIdleConnections)
	publicRegistry := func(_ context.Context, host string) ([]netip.Addr, error) {
		if host == "registry.test" {
			return []netip.Addr{netip.MustParseAddr("203.0.113.7")}, nil
		}
		return lookupAddrs(context.Background(), host)
	}
	_, plainPort, _ := net.SplitHostPort(strings.TrimPrefix(plain.URL, "http://"))
	for _, c := range []struct {
		name, url, refusal string
	}{
		{"public registry to loopback", "http://registry.test:" + plainPort + "/v2/r/manifests/t", "is a loopback address and the registry is not at one"},
		{"https to http", secure.URL + "/v2/r/manifests/t", "from https to plain http"},
		{"loopback registry to loopback", plain.URL + "/v2/r/manifests/t", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := &http.Client{Transport: &boundedTransport{inner: base, lookup: publicRegistry}}
			before := hits.Load()
			resp, err := client.Get(c.url)
			if c.refusal == "" {
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if hits.Load() != before+1 {
					t.Error("the allowed hop did not arrive")
				}
				return
			}
			if err == nil {
				resp.Body.Close()
			}
			if !errors.Is(err, ErrBadResponse) || !strings.Contains(err.Error(), c.refusal) {
				t.Fatalf("error %v, want a refusal: %s", err, c.refusal)
			}
			if hits.Load() != before {
				t.Error("the refused hop reached the service")
			}
		})
	}
}
