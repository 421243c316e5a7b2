package fetcher

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/layerstore/layerstore/chunked"
	digest "github.com/opencontainers/go-digest"
)

// fleet is the world of mirrors.conf: a registry, its P2P agent, a pull-through cache, a tag
// mirror, and pinned.example.com.
type fleet struct {
	*world
	registry, p2p, cache, tags, pinned *fakeRegistry
}

func newFleet(t *testing.T) *fleet {
	w := newWorld(t)
	return &fleet{world: w,
		registry: w.registry("registry.example.com", tlsTrusted),
		p2p:      w.registry("p2p.example.com", tlsTrusted),
		cache:    w.registry("cache.example.com", tlsTrusted),
		tags:     w.registry("tags.example.com", tlsTrusted),
		pinned:   w.registry("pinned.example.com", tlsTrusted),
	}
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func TestRegistriesFedoraDefault(t *testing.T) {
	isolate(t)
	w := newWorld(t)
	reg := w.registry("registry.example.com", tlsTrusted)
	img := testImage(t, 1)
	reg.push(t, "team/app:v1", img)
	c := w.client(t, filepath.Join("testdata", "registries", "fedora.conf"),
		filepath.Join("testdata", "registries", "fedora.conf.d"))

	got, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest.String() != digestOf(t, img) {
		t.Errorf("digest %s, want %s", got.Digest, digestOf(t, img))
	}
	if hosts := w.contacted(); !slices.Equal(hosts, []string{"registry.example.com"}) {
		t.Errorf("contacted %v, want only the registry (no entry: no mirror)", hosts)
	}
	// Short names, even with an alias, are the runtime's to resolve: refused, no request.
	before := w.requests()
	for _, ref := range []string{"app:v1", "fedora", "docker.io/fedora:latest"} {
		if _, err := c.Resolve(t.Context(), ref); err == nil {
			t.Errorf("short name %q resolved", ref)
		}
	}
	if n := w.requests() - before; n != 0 {
		t.Errorf("short names cost %d requests", n)
	}
}

func TestRegistriesMirrorOrder(t *testing.T) {
	isolate(t)
	img := testImage(t, 1)
	for _, tc := range []struct {
		name   string
		ref    func(dgst string) string
		want   []string // hosts contacted, in order
		unused *fakeRegistry
	}{
		{"tag: digest-only mirror skipped",
			func(string) string { return "registry.example.com/team/app:v1" },
			[]string{"p2p.example.com", "tags.example.com", "registry.example.com"}, nil},
		{"digest: tag-only mirror skipped",
			func(d string) string { return "registry.example.com/team/app@" + d },
			[]string{"p2p.example.com", "cache.example.com", "registry.example.com"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			f.registry.push(t, "team/app:v1", img)
			c := f.client(t, filepath.Join("testdata", "registries", "mirrors.conf"), t.TempDir())
			got, err := c.Resolve(t.Context(), tc.ref(digestOf(t, img)))
			if err != nil {
				t.Fatal(err)
			}
			if hosts := f.contacted(); !slices.Equal(hosts, tc.want) {
				t.Errorf("contacted %v, want %v", hosts, tc.want)
			}
			if got.Digest.String() != digestOf(t, img) {
				t.Errorf("digest %s, want %s", got.Digest, digestOf(t, img))
			}
			// The cache is asked under its namespace.
			for _, r := range f.cache.requests() {
				if requestKind(r) == "manifest" && !strings.HasPrefix(r.URL.Path, "/v2/registry/team/app/") {
					t.Errorf("cache asked for %s, want /v2/registry/team/app/...", r.URL.Path)
				}
			}
			// Blobs come from the source that served the manifest.
			readLayer(t, c, got, 0, layerBytes(t, img, 0))
			for _, m := range []*fakeRegistry{f.p2p, f.cache, f.tags} {
				if n := m.count("blob"); n != 0 {
					t.Errorf("%s: %d blob requests, want 0", m.host, n)
				}
			}
			if n := f.registry.count("blob"); n == 0 {
				t.Error("no blob request to the registry")
			}
		})
	}
}

func TestRegistriesMirrorServes(t *testing.T) {
	isolate(t)
	f := newFleet(t)
	img := testImage(t, 2)
	f.p2p.push(t, "team/app:v1", img)
	c := f.client(t, filepath.Join("testdata", "registries", "mirrors.conf"), t.TempDir())
	got, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Ref != "registry.example.com/team/app:v1" {
		t.Errorf("Ref = %q, want the reference as asked", got.Ref)
	}
	for i := range 2 {
		readLayer(t, c, got, i, layerBytes(t, img, i))
	}
	if hosts := f.contacted(); !slices.Equal(hosts, []string{"p2p.example.com"}) {
		t.Errorf("contacted %v, want the P2P mirror only", hosts)
	}
	if n := f.p2p.count("ping"); n != 1 {
		t.Errorf("the mirror was pinged %d times, want once per resolution", n)
	}
}

func TestRegistriesMirrorFallback(t *testing.T) {
	isolate(t)
	img := testImage(t, 1)
	for _, tc := range []struct {
		name    string
		breakIt func(f *fleet)
	}{
		{"404", func(f *fleet) { f.p2p.setFault(notFound("manifest")) }},
		{"500", func(f *fleet) { f.p2p.setFault(statusFor("manifest", 500)) }},
		{"connection refused", func(f *fleet) { f.down("p2p.example.com") }},
		{"401", func(f *fleet) { f.p2p.setAuth(basicAuth("someone", map[string]string{"": "else"})) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			f.p2p.push(t, "team/app:v1", img)
			f.tags.push(t, "team/app:v1", img)
			f.registry.push(t, "team/app:v1", img)
			tc.breakIt(f)
			c := f.client(t, filepath.Join("testdata", "registries", "mirrors.conf"), t.TempDir())
			got, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1")
			if err != nil {
				t.Fatal(err)
			}
			if n := f.p2p.count("manifest"); n > 1 {
				t.Errorf("the failing mirror got %d manifest requests, want at most 1 (no retries on mirrors)", n)
			}
			if n := f.registry.count(""); n != 0 {
				t.Errorf("the registry got %d requests; the second mirror should have served", n)
			}
			readLayer(t, c, got, 0, layerBytes(t, img, 0))
			if n := f.tags.count("blob"); n == 0 {
				t.Error("the blob was not read from the mirror that served the manifest")
			}
		})
	}
}

func TestRegistriesAllSourcesFail(t *testing.T) {
	isolate(t)
	f := newFleet(t)
	f.down("p2p.example.com")
	c := f.client(t, filepath.Join("testdata", "registries", "mirrors.conf"), t.TempDir())
	_, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1")
	// The registry's own answer is the error; the mirrors' failures are quoted.
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "mirrors also failed") {
		t.Fatalf("err = %v, want ErrNotFound (the registry's) quoting the mirrors", err)
	}
	if hosts := f.contacted(); !slices.Equal(hosts, []string{"tags.example.com", "registry.example.com"}) {
		t.Errorf("contacted %v", hosts) // p2p is down: it never sees a request
	}
}

func TestRegistriesMirrorByDigestOnly(t *testing.T) {
	isolate(t)
	f := newFleet(t)
	img := testImage(t, 1)
	f.pinned.push(t, "app:v1", img)
	f.cache.push(t, "pinned/app:v1", img)
	c := f.client(t, filepath.Join("testdata", "registries", "mirrors.conf"), t.TempDir())
	if _, err := c.Resolve(t.Context(), "pinned.example.com/app:v1"); err != nil {
		t.Fatal(err)
	}
	if hosts := f.contacted(); !slices.Equal(hosts, []string{"pinned.example.com"}) {
		t.Errorf("by tag: contacted %v, want the registry only", hosts)
	}
	got, err := c.Resolve(t.Context(), "pinned.example.com/app@"+digestOf(t, img))
	if err != nil {
		t.Fatal(err)
	}
	readLayer(t, c, got, 0, layerBytes(t, img, 0))
	if n := f.cache.count("manifest"); n == 0 || f.cache.count("blob") == 0 {
		t.Errorf("by digest: the mirror got %d manifest and %d blob requests", n, f.cache.count("blob"))
	}
}

func TestRegistriesBlobFallback(t *testing.T) {
	isolate(t)
	img := testImage(t, 1)
	layer, ld := layerBytes(t, img, 0), layerDigest(t, img, 0)
	for _, code := range []int{404, 503} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			f := newFleet(t)
			f.p2p.push(t, "team/app:v1", img)
			f.registry.push(t, "team/app:v1", img)
			f.p2p.setFault(statusForPath(ld, code))
			c := f.client(t, filepath.Join("testdata", "registries", "mirrors.conf"), t.TempDir())
			got, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1")
			if err != nil {
				t.Fatal(err)
			}
			if f.tags.count("") != 0 || f.registry.count("") != 0 {
				t.Fatalf("manifest: tags %d, registry %d requests; want the P2P mirror to serve", f.tags.count(""), f.registry.count(""))
			}
			b := readLayer(t, c, got, 0, layer)
			// p2p fails, tags does not have the blob, the registry serves.
			p2p := f.p2p.countPath(ld)
			if p2p == 0 || f.tags.countPath(ld) != 1 || f.registry.countPath(ld) != 1 {
				t.Fatalf("layer requests: p2p %d, tags %d, registry %d; want p2p tried, then tags 1, registry 1",
					p2p, f.tags.countPath(ld), f.registry.countPath(ld))
			}
			if code == 503 && p2p != DefaultMaxAttempts {
				t.Errorf("p2p: %d attempts, want %d (retried before passing on)", p2p, DefaultMaxAttempts)
			}
			// The next read starts where the last one succeeded.
			p := make([]byte, 10)
			if _, err := b.ReadAt(t.Context(), p, 5); err != nil {
				t.Fatal(err)
			}
			if f.p2p.countPath(ld) != p2p || f.tags.countPath(ld) != 1 || f.registry.countPath(ld) != 2 {
				t.Errorf("second read: p2p %d, tags %d, registry %d layer requests; want only the registry asked",
					f.p2p.countPath(ld), f.tags.countPath(ld), f.registry.countPath(ld))
			}
		})
	}
}

func TestRegistriesBlobAllSourcesFail(t *testing.T) {
	isolate(t)
	f := newFleet(t)
	img := testImage(t, 1)
	ld := layerDigest(t, img, 0)
	f.registry.push(t, "team/app:v1", img)
	c := f.client(t, filepath.Join("testdata", "registries", "mirrors.conf"), t.TempDir())
	got, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	f.registry.setFault(statusForPath(ld, 404))
	b, err := c.Blob(t.Context(), got, &got.Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.ReadAt(t.Context(), make([]byte, 10), 0)
	var fe *Error
	if !errors.Is(err, ErrNotFound) || !errors.As(err, &fe) || !strings.Contains(fe.URL, "registry.example.com") ||
		!strings.Contains(err.Error(), "other sources also failed") {
		t.Fatalf("err = %v, want the registry's ErrNotFound (*Error) first, the others quoted", err)
	}
	if f.p2p.countPath(ld) != 1 || f.tags.countPath(ld) != 1 || f.registry.countPath(ld) != 1 {
		t.Errorf("layer requests: p2p %d, tags %d, registry %d; want each source asked once",
			f.p2p.countPath(ld), f.tags.countPath(ld), f.registry.countPath(ld))
	}
}

func TestRegistriesWildcardAndRewrite(t *testing.T) {
	isolate(t)
	w := newWorld(t)
	cache := w.registry("cache.example.com", tlsTrusted)
	team := w.registry("team.example.com", tlsTrusted)
	reg := w.registry("registry.example.com", tlsTrusted)
	img := testImage(t, 1)
	team.push(t, "app:v1", img)
	reg.push(t, "legacy/team/app:v1", img)
	c := w.client(t, filepath.Join("testdata", "registries", "rewrite.conf"), t.TempDir())

	// *.example.com: the cache first (under its namespace, the host dropped), then the
	// reference's own registry.
	if _, err := c.Resolve(t.Context(), "team.example.com/app:v1"); err != nil {
		t.Fatal(err)
	}
	if hosts := w.contacted(); !slices.Equal(hosts, []string{"cache.example.com", "team.example.com"}) {
		t.Errorf("wildcard: contacted %v", hosts)
	}
	var paths []string
	for _, r := range cache.requests() {
		if requestKind(r) == "manifest" {
			paths = append(paths, r.URL.Path)
		}
	}
	if !slices.Equal(paths, []string{"/v2/any/app/manifests/v1"}) {
		t.Errorf("cache manifest requests %v, want [/v2/any/app/manifests/v1]", paths)
	}

	// The longest prefix wins: old.example.com/team is rewritten, without the wildcard's mirror.
	before := cache.count("")
	got, err := c.Resolve(t.Context(), "old.example.com/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	readLayer(t, c, got, 0, layerBytes(t, img, 0))
	if cache.count("") != before {
		t.Error("the rewritten reference went to the wildcard's mirror")
	}
	for _, r := range reg.requests() {
		if k := requestKind(r); k != "ping" && !strings.HasPrefix(r.URL.Path, "/v2/legacy/team/app/") {
			t.Errorf("rewritten request %s, want /v2/legacy/team/app/...", r.URL.Path)
		}
	}
}

func TestRegistriesBlocked(t *testing.T) {
	isolate(t)
	w := newWorld(t)
	w.registry("blocked.example.com", tlsTrusted).push(t, "app:v1", testImage(t, 1))
	c := w.client(t, filepath.Join("testdata", "registries", "rewrite.conf"), t.TempDir())
	for _, ref := range []string{
		"blocked.example.com/app:v1",
		"blocked.example.com/app@sha256:0123456789012345678901234567890123456789012345678901234567890123",
	} {
		if _, err := c.Resolve(t.Context(), ref); !errors.Is(err, ErrBlocked) {
			t.Errorf("%s: err = %v, want ErrBlocked", ref, err)
		}
	}
	if n := w.requests(); n != 0 {
		t.Errorf("blocked registry: %d requests sent, want none", n)
	}
}

func TestRegistriesInsecure(t *testing.T) {
	isolate(t)
	w := newWorld(t)
	img := testImage(t, 1)
	hosts := []struct {
		host string
		kind serverKind
		ok   bool
	}{
		{"plain.example.com", plainHTTP, true},          // insecure = true: plain http allowed
		{"selfsigned.example.com", tlsUntrusted, true},  // insecure = true: certificate not verified
		{"strictplain.example.com", plainHTTP, false},   // no entry: https only
		{"strictself.example.com", tlsUntrusted, false}, // no entry: certificate verified
		{"registry.example.com", tlsTrusted, true},      // no entry, a valid certificate
	}
	for _, h := range hosts {
		w.registry(h.host, h.kind).push(t, "app:v1", img)
	}
	// One client for all: the insecure endpoints' settings must not leak to the others.
	c := w.client(t, filepath.Join("testdata", "registries", "insecure.conf"), t.TempDir())
	for _, h := range hosts {
		got, err := c.Resolve(t.Context(), h.host+"/app:v1")
		if !h.ok {
			if err == nil {
				t.Errorf("%s: resolved without insecure = true", h.host)
			}
			if h.kind == tlsUntrusted && !errors.Is(err, ErrBadResponse) {
				t.Errorf("%s: %v, want ErrBadResponse (a certificate refused is not retried)", h.host, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", h.host, err)
			continue
		}
		readLayer(t, c, got, 0, layerBytes(t, img, 0))
	}
}

// TestRegistriesLoopbackPlainHTTP: go-containerregistry alone lets a registry on 127.0.0.1 (or
// localhost, or a private address) answer over plain http; the Client allows it only with
// insecure = true, as podman does. (A Resolver, given its transport, keeps go-containerregistry's
// behaviour: the Resolver tests use such registries.)
func TestRegistriesLoopbackPlainHTTP(t *testing.T) {
	isolate(t)
	reg := newManifestRegistry(t)
	img := testImage(t, 1)
	reg.push(t, "app:v1", img)
	w := newWorld(t)

	path, dropIn := writeConf(t, "")
	c := w.client(t, path, dropIn)
	if _, err := c.Resolve(t.Context(), reg.host+"/app:v1"); err == nil || !strings.Contains(err.Error(), "plain http") {
		t.Fatalf("plain http to %s without insecure = true: %v, want a refusal", reg.host, err)
	}

	path, dropIn = writeConf(t, fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", reg.host))
	c = w.client(t, path, dropIn)
	got, err := c.Resolve(t.Context(), reg.host+"/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	readLayer(t, c, got, 0, layerBytes(t, img, 0))
}

func TestRegistriesDropIn(t *testing.T) {
	isolate(t)
	f := newFleet(t)
	img := testImage(t, 1)
	f.registry.push(t, "team/app:v1", img)
	f.tags.push(t, "app:v1", img)
	c := f.client(t, filepath.Join("testdata", "registries", "dropin", "registries.conf"),
		filepath.Join("testdata", "registries", "dropin", "registries.conf.d"))
	if _, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1"); err != nil {
		t.Fatal(err)
	}
	if hosts := f.contacted(); !slices.Equal(hosts, []string{"cache.example.com", "registry.example.com"}) {
		t.Errorf("contacted %v, want the drop-in's mirror then the registry (not the main file's)", hosts)
	}
	if _, err := c.Resolve(t.Context(), "tags.example.com/app:v1"); err != nil {
		t.Errorf("a registry the main file blocks and a drop-in unblocks: %v", err)
	}
}

func TestRegistriesReload(t *testing.T) {
	isolate(t)
	f := newFleet(t)
	img := testImage(t, 1)
	f.registry.push(t, "team/app:v1", img)
	f.registry.push(t, "team/app:v2", img)
	path, dropIn := writeConf(t, "[[registry]]\nlocation = \"registry.example.com\"\n")
	c := f.client(t, path, dropIn)
	if _, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1"); err != nil {
		t.Fatal(err)
	}
	// The file changes; until Reload, the configuration read at start stays.
	if err := os.WriteFile(path, []byte("[[registry]]\nlocation = \"registry.example.com\"\nblocked = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolve(t.Context(), "registry.example.com/team/app:v2"); err != nil {
		t.Fatalf("before Reload: %v", err)
	}
	if err := c.Reload(); err != nil {
		t.Fatal(err)
	}
	// Reload forgets resolutions too: even the reference resolved before is now blocked.
	if _, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1"); !errors.Is(err, ErrBlocked) {
		t.Fatalf("after Reload: %v, want ErrBlocked", err)
	}
	// An invalid file is refused, and the configuration in force stays.
	if err := os.WriteFile(path, []byte("[registries.search]\nregistries = ['x']\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Reload(); err == nil {
		t.Fatal("Reload accepted a v1 registries.conf")
	}
	if _, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1"); !errors.Is(err, ErrBlocked) {
		t.Fatalf("after a failed Reload: %v, want the previous configuration (ErrBlocked)", err)
	}
	// Another Client, on another file, is not affected by this one's.
	path2, dropIn2 := writeConf(t, "")
	c2 := f.client(t, path2, dropIn2)
	if _, err := c2.Resolve(t.Context(), "registry.example.com/team/app:v1"); err != nil {
		t.Fatalf("a client with its own file: %v", err)
	}
}

func TestRegistriesNamespaceProxy(t *testing.T) {
	isolate(t)
	w := newWorld(t)
	proxy := w.registry("proxy.example.com", tlsTrusted)
	img := testImage(t, 1)
	proxy.push(t, "team/app:v1", img)
	path, dropIn := writeConf(t, `
[[registry]]
location = "registry.example.com"

[[registry.mirror]]
location = "proxy.example.com"
namespace-proxy = "registry.example.com"
`)
	c := w.client(t, path, dropIn)
	got, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	readLayer(t, c, got, 0, layerBytes(t, img, 0))
	for _, r := range proxy.requests() {
		if ns := r.URL.Query().Get("ns"); ns != "registry.example.com" {
			t.Errorf("%s %s: ns = %q, want registry.example.com", r.Method, r.URL.Path, ns)
		}
	}
}

func TestClientConfigErrors(t *testing.T) {
	isolate(t)
	if _, err := NewClient(Config{RegistriesConf: filepath.Join(t.TempDir(), "missing.conf"), RegistriesConfDir: t.TempDir()}); err == nil {
		t.Error("a missing registries.conf was accepted")
	}
	path, dropIn := writeConf(t, "[[registry]]\nprefix = \"example.com\"\nlocation = \"https://example.com\"\n")
	if _, err := NewClient(Config{RegistriesConf: path, RegistriesConfDir: dropIn}); err == nil {
		t.Error("a location with a scheme was accepted")
	}
	path, dropIn = writeConf(t, "")
	if _, err := NewClient(Config{RegistriesConf: path, RegistriesConfDir: dropIn, MaxSpan: -1}); err == nil {
		t.Error("an invalid blob setting was accepted")
	}
	c, err := NewClient(Config{RegistriesConf: path, RegistriesConfDir: dropIn})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Blob(t.Context(), &Image{}, &ImageLayer{Descriptor: chunked.Descriptor{Digest: digest.Digest("sha256:" + strings.Repeat("0", 64))}}); err == nil {
		t.Error("Blob of an image with no source succeeded")
	}
}

// TestRegistriesRetryLastSource: a mirror failing transiently is passed over at once; the
// registry itself, the last source, is asked again after a pause.
func TestRegistriesRetryLastSource(t *testing.T) {
	isolate(t)
	f := newFleet(t)
	img := testImage(t, 1)
	f.registry.push(t, "team/app:v1", img)
	f.p2p.setFault(statusFor("manifest", http.StatusServiceUnavailable))
	var n atomic.Int32
	f.registry.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		if requestKind(r) != "manifest" || n.Add(1) > 2 {
			return false
		}
		return statusFor("manifest", http.StatusServiceUnavailable)(w, r)
	})
	path, dropIn := writeConf(t, "[[registry]]\nlocation = \"registry.example.com\"\n[[registry.mirror]]\nlocation = \"p2p.example.com\"\n")
	c := f.client(t, path, dropIn, Config{manifestAttempts: 3})
	sr := &sleepRecorder{}
	c.res.sleep = sr.sleep
	if _, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1"); err != nil {
		t.Fatal(err)
	}
	if got := f.p2p.count("manifest"); got != 1 {
		t.Errorf("the mirror got %d manifest requests, want 1", got)
	}
	if got := f.registry.count("manifest"); got < 3 {
		t.Errorf("the registry got %d manifest requests, want 2 failures and a success", got)
	}
	// The pauses of a blob read's retries.
	if d := sr.delays(); len(d) != 2 || d[0] > DefaultInitialBackoff || d[1] > 2*DefaultInitialBackoff || d[1] < DefaultInitialBackoff/2 {
		t.Errorf("pauses %v, want 2, about %v then %v", d, DefaultInitialBackoff, 2*DefaultInitialBackoff)
	}
	// With one attempt, the registry's failure is the answer.
	n.Store(0)
	c = f.client(t, path, dropIn, Config{manifestAttempts: 1})
	if _, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1"); !errors.Is(err, ErrTransient) {
		t.Errorf("err = %v, want ErrTransient", err)
	}
}
