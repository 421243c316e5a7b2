package fetcher

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// world is a small internet on 127.0.0.1: registries, mirrors and token servers known by host
// names under example.com (which httptest's certificate covers), reached through a transport
// whose dialer maps those names to the test servers and refuses every other address, so that
// no test can reach the real network.
type world struct {
	t    *testing.T
	pool *x509.CertPool // trusts httptest's certificate

	mu    sync.Mutex
	hosts map[string]string // host name -> 127.0.0.1:port
	log   []string          // "host METHOD path", every request of every server, in order
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, hosts: map[string]string{}}
	// Every test server shares httptest's certificate: trust it once.
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	w.pool = x509.NewCertPool()
	w.pool.AddCert(srv.Certificate())
	srv.Close()
	return w
}

// transport returns a base transport for a Client: it dials the world's hosts only and trusts
// httptest's certificate.
func (w *world) transport() *http.Transport {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			w.mu.Lock()
			target, ok := w.hosts[host]
			w.mu.Unlock()
			if !ok {
				if host != "127.0.0.1" {
					return nil, fmt.Errorf("test world: no host %q", host)
				}
				target = addr
			}
			var d net.Dialer
			return d.DialContext(ctx, network, target)
		},
		TLSClientConfig:     &tls.Config{RootCAs: w.pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 16,
	}
	w.t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func (w *world) record(host string, r *http.Request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, host+" "+r.Method+" "+r.URL.Path)
}

// contacted returns the hosts in the order they were first contacted.
func (w *world) contacted() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	seen := map[string]bool{}
	for _, l := range w.log {
		h, _, _ := strings.Cut(l, " ")
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

func (w *world) requests() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.log)
}

// down makes host refuse connections.
func (w *world) down(host string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	w.mu.Lock()
	w.hosts[host] = addr
	w.mu.Unlock()
}

type serverKind int

const (
	tlsTrusted   serverKind = iota // https with a certificate the world trusts
	plainHTTP                      // http only
	tlsUntrusted                   // https with a self-signed certificate nobody trusts
)

// fakeRegistry is go-containerregistry's registry behind a host name. Requests can be made to
// need credentials (auth) or be answered by a fault; they are counted. Images are pushed
// through a separate plain server that bypasses both.
type fakeRegistry struct {
	host  string
	w     *world
	inner http.Handler
	admin *httptest.Server
	srv   *httptest.Server

	mu    sync.Mutex
	reqs  []*http.Request
	auth  func(w http.ResponseWriter, r *http.Request) bool // false: it answered (refused)
	fault func(w http.ResponseWriter, r *http.Request) bool // true: it answered
}

func (w *world) registry(host string, kind serverKind) *fakeRegistry {
	fr := &fakeRegistry{host: host, w: w, inner: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	fr.admin = httptest.NewServer(fr.inner)
	w.t.Cleanup(fr.admin.Close)
	fr.srv = httptest.NewUnstartedServer(fr)
	fr.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	switch kind {
	case tlsTrusted:
		fr.srv.StartTLS()
	case plainHTTP:
		fr.srv.Start()
	case tlsUntrusted:
		fr.srv.TLS = &tls.Config{Certificates: []tls.Certificate{selfSigned(w.t)}, MinVersion: tls.VersionTLS12}
		fr.srv.StartTLS()
	}
	w.t.Cleanup(fr.srv.Close)
	w.mu.Lock()
	w.hosts[host] = fr.srv.Listener.Addr().String()
	w.mu.Unlock()
	return fr
}

func (fr *fakeRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fr.w.record(fr.host, r)
	fr.mu.Lock()
	fr.reqs = append(fr.reqs, r.Clone(context.Background()))
	auth, fault := fr.auth, fr.fault
	fr.mu.Unlock()
	if auth != nil && !auth(w, r) {
		return
	}
	if fault != nil && fault(w, r) {
		return
	}
	fr.inner.ServeHTTP(w, r)
}

func (fr *fakeRegistry) setAuth(f func(w http.ResponseWriter, r *http.Request) bool) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fr.auth = f
}

func (fr *fakeRegistry) setFault(f func(w http.ResponseWriter, r *http.Request) bool) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fr.fault = f
}

// countPath returns how many requests the registry received for a path containing s.
func (fr *fakeRegistry) countPath(s string) int {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	n := 0
	for _, r := range fr.reqs {
		if strings.Contains(r.URL.Path, s) {
			n++
		}
	}
	return n
}

// count returns how many requests of a kind ("ping", "manifest", "blob", or "" for all) the
// registry received.
func (fr *fakeRegistry) count(kind string) int {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	n := 0
	for _, r := range fr.reqs {
		if kind == "" || requestKind(r) == kind {
			n++
		}
	}
	return n
}

func (fr *fakeRegistry) requests() []*http.Request {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return append([]*http.Request(nil), fr.reqs...)
}

func requestKind(r *http.Request) string {
	switch {
	case r.URL.Path == "/v2/":
		return "ping"
	case strings.Contains(r.URL.Path, "/manifests/"):
		return "manifest"
	case strings.Contains(r.URL.Path, "/blobs/"):
		return "blob"
	}
	return "other"
}

// repoOf returns the repository a /v2/ path is about, or "".
func repoOf(path string) string {
	p := strings.TrimPrefix(path, "/v2/")
	for _, sep := range []string{"/manifests/", "/blobs/"} {
		if i := strings.Index(p, sep); i >= 0 {
			return p[:i]
		}
	}
	return ""
}

// push stores img as repoTag ("team/app:v1") in the registry.
func (fr *fakeRegistry) push(t *testing.T, repoTag string, img v1.Image) {
	t.Helper()
	ref, err := name.ParseReference(strings.TrimPrefix(fr.admin.URL, "http://") + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
}

// Faults.

// notFound answers requests of a kind with 404.
func notFound(kind string) func(http.ResponseWriter, *http.Request) bool {
	return statusFor(kind, http.StatusNotFound)
}

// statusForPath answers requests for paths containing s with code.
func statusForPath(s string, code int) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.Contains(r.URL.Path, s) {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"errors":[{"code":"UNKNOWN","message":"fault %d"}]}`, code)
		return true
	}
}

func statusFor(kind string, code int) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		if requestKind(r) != kind {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"errors":[{"code":"UNKNOWN","message":"fault %d"}]}`, code)
		return true
	}
}

// Authentication.

// basicAuth makes a registry ask for HTTP Basic credentials: user and, per repository, the
// password in passwords (the "" entry for the others).
func basicAuth(user string, passwords map[string]string) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		want, ok := passwords[repoOf(r.URL.Path)]
		if !ok {
			want = passwords[""]
		}
		u, p, has := r.BasicAuth()
		if has && u == user && p == want {
			return true
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="registry"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`))
		return false
	}
}

// tokenServer hands out bearer tokens for repositories, to the user with that repository's
// password (GET with Basic auth) or with the refresh token (POST, OAuth2 refresh_token grant).
type tokenServer struct {
	host      string
	user      string
	passwords map[string]string // per repository; "" for the others
	refresh   string            // accepted refresh token, "" for none

	mu     sync.Mutex
	tokens map[string]string // token -> repository
	n      int               // token requests
}

func (w *world) tokenServer(host, user string, passwords map[string]string) *tokenServer {
	ts := &tokenServer{host: host, user: user, passwords: passwords, tokens: map[string]string{}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.record(host, r)
		ts.serve(rw, r)
	}))
	w.t.Cleanup(srv.Close)
	w.mu.Lock()
	w.hosts[host] = srv.Listener.Addr().String()
	w.mu.Unlock()
	return ts
}

func (ts *tokenServer) serve(w http.ResponseWriter, r *http.Request) {
	ts.mu.Lock()
	ts.n++
	ts.mu.Unlock()
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	repo := ""
	if scope := r.Form.Get("scope"); strings.HasPrefix(scope, "repository:") {
		repo = strings.TrimPrefix(scope, "repository:")
		repo = repo[:strings.LastIndexByte(repo, ':')]
	}
	ok := false
	if r.Method == http.MethodPost {
		ok = ts.refresh != "" && r.PostForm.Get("grant_type") == "refresh_token" && r.PostForm.Get("refresh_token") == ts.refresh
	} else {
		want, found := ts.passwords[repo]
		if !found {
			want = ts.passwords[""]
		}
		u, p, has := r.BasicAuth()
		ok = has && u == ts.user && p == want
	}
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}`))
		return
	}
	tok := base64.RawURLEncoding.EncodeToString(randomBytes(12))
	ts.mu.Lock()
	ts.tokens[tok] = repo
	ts.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"token": tok, "expires_in": 300})
}

func (ts *tokenServer) requests() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.n
}

// bearerAuth makes a registry ask for a token from ts.
func (ts *tokenServer) bearerAuth(service string) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		repo := repoOf(r.URL.Path)
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			ts.mu.Lock()
			granted, known := ts.tokens[tok]
			ts.mu.Unlock()
			if known && (repo == "" || granted == repo) {
				return true
			}
		}
		challenge := fmt.Sprintf(`Bearer realm="https://%s/token",service=%q`, ts.host, service)
		if repo != "" {
			challenge += fmt.Sprintf(`,scope="repository:%s:pull"`, repo)
		}
		w.Header().Set("WWW-Authenticate", challenge)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`))
		return false
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// selfSigned returns a certificate for *.example.com that nothing trusts.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "self-signed"},
		DNSNames:     []string{"*.example.com"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Client set-up.

// isolate points every place credentials and registries.conf are searched at empty temporary
// directories, so that the machine's own files are never read or written. It returns the home.
func isolate(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	t.Setenv("DOCKER_CONFIG", "")
	t.Setenv("REGISTRY_AUTH_FILE", "")
	t.Setenv("CONTAINERS_REGISTRIES_CONF", "")
	t.Setenv("CONTAINERS_REGISTRIES_CONF_OVERRIDE", "")
	return home
}

// conf returns the path of a testdata registries.conf and an empty drop-in directory (so that
// the system's drop-ins are not read).
func conf(t *testing.T, file string) (string, string) {
	t.Helper()
	return filepath.Join("testdata", "registries", file), t.TempDir()
}

// writeConf writes a registries.conf into a temporary directory.
func writeConf(t *testing.T, text string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, filepath.Join(dir, "registries.conf.d")
}

// client returns a Client reading registries.conf path and dropIn through the world, without
// sleeping between attempts and trying each manifest source once unless cfg (at most one)
// says otherwise.
func (w *world) client(t *testing.T, path, dropIn string, cfg ...Config) *Client {
	t.Helper()
	var c Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.RegistriesConf, c.RegistriesConfDir = path, dropIn
	c.Transport = w.transport()
	c.sleep = (&sleepRecorder{}).sleep
	c.limiter = newHostLimiter(8)
	c.manifestAttempts = or(c.manifestAttempts, 1)
	client, err := NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// writeJSON writes v as JSON to path, creating its directory.
func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// authEntry is an "auths" entry of an auth file.
func authEntry(user, password string) map[string]string {
	return map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))}
}

// layerDigest returns the digest of img's layer i.
func layerDigest(t *testing.T, img v1.Image, i int) string {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ls[i].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// layerBytes returns the compressed bytes of img's layer i.
func layerBytes(t *testing.T, img v1.Image, i int) []byte {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := ls[i].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readLayer reads layer i of img through c, whole, and compares it with want.
func readLayer(t *testing.T, c *Client, img *Image, i int, want []byte) *Blob {
	t.Helper()
	b, err := c.Blob(t.Context(), img, &img.Layers[i])
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, b.Size())
	if _, err := b.ReadAt(t.Context(), got, 0); err != nil {
		t.Fatalf("reading layer %d: %v", i, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("layer %d: bytes differ from the pushed layer's", i)
	}
	return b
}
