package fetcher

import (
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// manifestRegistry is go-containerregistry's registry counting manifest GETs, refusing requests to
// repositories under "private/".
type manifestRegistry struct {
	srv       *httptest.Server
	host      string
	manifests atomic.Int64
}

func newManifestRegistry(t *testing.T) *manifestRegistry {
	t.Helper()
	r := &manifestRegistry{}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasPrefix(req.URL.Path, "/v2/private/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}`))
			return
		}
		if strings.Contains(req.URL.Path, "/manifests/") && req.Method == http.MethodGet {
			r.manifests.Add(1)
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// image returns an OCI image of n random layers, each annotated with its index.
func testImage(t *testing.T, n int) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for i := range n {
		l, err := random.Layer(256, types.OCILayer)
		if err != nil {
			t.Fatal(err)
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
			Annotations: map[string]string{"test.layer": string(rune('a' + i))}})
		if err != nil {
			t.Fatal(err)
		}
	}
	return img
}

func (r *manifestRegistry) push(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	parsed, err := name.ParseReference(r.host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img); err != nil {
		t.Fatal(err)
	}
}

func TestResolveImage(t *testing.T) {
	reg := newManifestRegistry(t)
	img, err := mutate.Config(testImage(t, 3), v1.Config{Entrypoint: []string{"/usr/bin/app", "--serve"},
		Cmd: []string{"x"}, Env: []string{"HOME=/root", "PATH=/app/bin:/usr/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	reg.push(t, "app:v1", img)
	res, err := NewResolver(http.DefaultTransport, Config{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := res.Resolve(t.Context(), reg.host+"/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Start{Program: "/usr/bin/app", Path: "/app/bin:/usr/bin"}); got.Start != want {
		t.Errorf("start = %+v, want %+v", got.Start, want)
	}
	d, _ := img.Digest()
	if got.Digest.String() != d.String() || got.Manifest.Digest.String() != d.String() {
		t.Errorf("digest = %s / %s, want %s", got.Digest, got.Manifest.Digest, d)
	}
	layers, _ := img.Layers()
	if len(got.Layers) != 3 {
		t.Fatalf("%d layers, want 3", len(got.Layers))
	}
	for i, l := range layers {
		dg, _ := l.Digest()
		diffID, _ := l.DiffID()
		size, _ := l.Size()
		g := got.Layers[i]
		if g.Digest.String() != dg.String() || g.DiffID.String() != diffID.String() || g.Size != size ||
			g.MediaType != string(types.OCILayer) || g.Annotations["test.layer"] != string(rune('a'+i)) {
			t.Errorf("layer %d = %+v, want digest %s diffID %s size %d", i, g, dg, diffID, size)
		}
	}
}

// TestStartOf: the program is the Entrypoint's first word, else the Cmd's; the PATH is the
// environment's last; a program or PATH longer than maxStartLen is dropped.
func TestStartOf(t *testing.T) {
	long := strings.Repeat("a", maxStartLen+1)
	for _, c := range []struct {
		cfg  v1.Config
		want Start
	}{
		{v1.Config{}, Start{}},
		{v1.Config{Cmd: []string{"python3", "-c", "x"}}, Start{Program: "python3"}},
		{v1.Config{Entrypoint: []string{"/init"}, Cmd: []string{"python3"}}, Start{Program: "/init"}},
		{v1.Config{Entrypoint: []string{}, Cmd: []string{"sh"}, Env: []string{"PATH=/a", "PATHX=/b", "PATH=/c"}}, Start{Program: "sh", Path: "/c"}},
		{v1.Config{Cmd: []string{long}, Env: []string{"PATH=" + long}}, Start{}},
	} {
		if got := startOf(c.cfg); got != c.want {
			t.Errorf("%+v: %+v, want %+v", c.cfg, got, c.want)
		}
	}
}

func TestResolveIndexPlatforms(t *testing.T) {
	reg := newManifestRegistry(t)
	amd, arm := testImage(t, 1), testImage(t, 2)
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
	)
	multi, err := name.ParseReference(reg.host + "/multi:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(multi, idx); err != nil {
		t.Fatal(err)
	}
	idxDigest, _ := idx.Digest()
	armDigest, _ := arm.Digest()
	amdDigest, _ := amd.Digest()
	res, _ := NewResolver(http.DefaultTransport, Config{Platform: v1.Platform{OS: "linux", Architecture: "arm64"}})
	got, err := res.Resolve(t.Context(), reg.host+"/multi:latest")
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest.String() != idxDigest.String() || got.Manifest.Digest.String() != armDigest.String() || len(got.Layers) != 2 {
		t.Fatalf("resolved %s / %s with %d layers, want index %s, arm64 manifest %s with 2 layers",
			got.Digest, got.Manifest.Digest, len(got.Layers), idxDigest, armDigest)
	}
	if got.Platform == nil || got.Platform.Architecture != "arm64" {
		t.Errorf("platform = %v", got.Platform)
	}
	others, err := res.Platforms(t.Context(), got)
	if err != nil {
		t.Fatal(err)
	}
	if len(others) != 1 || others[0].Digest.String() != amdDigest.String() || len(others[0].Layers) != 1 {
		t.Fatalf("other platforms = %+v, want the amd64 manifest", others)
	}

	s390, _ := NewResolver(http.DefaultTransport, Config{Platform: v1.Platform{OS: "linux", Architecture: "s390x"}})
	if _, err := s390.Resolve(t.Context(), reg.host+"/multi:latest"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("resolve for a missing platform = %v, want ErrNotFound", err)
	}
}

func TestResolveTagTTL(t *testing.T) {
	reg := newManifestRegistry(t)
	v1img, v2img := testImage(t, 1), testImage(t, 1)
	reg.push(t, "app:latest", v1img)
	now := time.Unix(1000, 0)
	res, _ := NewResolver(http.DefaultTransport, Config{TagTTL: time.Minute, now: func() time.Time { return now }})
	ref := reg.host + "/app:latest"
	first, err := res.Resolve(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	base := reg.manifests.Load()
	reg.push(t, "app:latest", v2img)
	again, _ := res.Resolve(t.Context(), ref)
	if again != first || reg.manifests.Load() != base {
		t.Fatalf("within the TTL: %d more manifest GETs, same image %v", reg.manifests.Load()-base, again == first)
	}
	now = now.Add(2 * time.Minute)
	later, err := res.Resolve(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := v2img.Digest()
	if later.Digest.String() != want.String() || reg.manifests.Load() == base {
		t.Fatalf("after the TTL: digest %s, want %s (re-resolved: %v)", later.Digest, want, reg.manifests.Load() != base)
	}

	byDigest := reg.host + "/app@" + want.String()
	if _, err := res.Resolve(t.Context(), byDigest); err != nil {
		t.Fatal(err)
	}
	base = reg.manifests.Load()
	now = now.Add(24 * time.Hour)
	if _, err := res.Resolve(t.Context(), byDigest); err != nil || reg.manifests.Load() != base {
		t.Fatalf("pull by digest re-fetched (%d GETs, %v)", reg.manifests.Load()-base, err)
	}
}

func TestResolveTagAndDigest(t *testing.T) {
	reg := newManifestRegistry(t)
	tagged, pinned := testImage(t, 1), testImage(t, 2)
	reg.push(t, "app:v1", tagged)
	reg.push(t, "app:pinned", pinned)
	d, _ := pinned.Digest()
	res, _ := NewResolver(http.DefaultTransport, Config{})
	got, err := res.Resolve(t.Context(), reg.host+"/app:v1@"+d.String())
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest.String() != d.String() || len(got.Layers) != 2 {
		t.Fatalf("repo:tag@digest resolved to %s, want the digest %s", got.Digest, d)
	}
}

func TestResolveErrors(t *testing.T) {
	reg := newManifestRegistry(t)
	res, _ := NewResolver(http.DefaultTransport, Config{})
	ref := reg.host + "/app:later"
	if _, err := res.Resolve(t.Context(), ref); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown tag: %v, want ErrNotFound", err)
	}
	// Failures are not remembered: once pushed, the same reference resolves.
	reg.push(t, "app:later", testImage(t, 1))
	if _, err := res.Resolve(t.Context(), ref); err != nil {
		t.Fatalf("after the push: %v", err)
	}
	if _, err := res.Resolve(t.Context(), reg.host+"/private/app:v1"); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("private repository: %v, want ErrUnauthorized", err)
	}
	if _, err := res.Resolve(t.Context(), "not a reference"); err == nil {
		t.Fatal("an invalid reference resolved")
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	host := strings.TrimPrefix(closed.URL, "http://")
	closed.Close()
	if _, err := res.Resolve(t.Context(), host+"/app:v1"); !errors.Is(err, ErrTransient) {
		t.Fatalf("registry down: %v, want ErrTransient", err)
	}
	if _, err := NewResolver(http.DefaultTransport, Config{TagTTL: -1}); err == nil {
		t.Fatal("negative TTL accepted")
	}
}

// TestResolveCachePruned: expired resolutions are dropped when another is kept, and no more
// than the bound are kept, the least recently used going first.
func TestResolveCachePruned(t *testing.T) {
	reg := newManifestRegistry(t)
	img := testImage(t, 1)
	for i := range 6 {
		reg.push(t, "app:t"+strconv.Itoa(i), img)
	}
	now := time.Unix(1000, 0)
	res, _ := NewResolver(http.DefaultTransport, Config{TagTTL: time.Minute, now: func() time.Time { return now }})
	resolve := func(tag string) {
		t.Helper()
		if _, err := res.Resolve(t.Context(), reg.host+"/app:"+tag); err != nil {
			t.Fatal(err)
		}
	}
	kept := func() int {
		res.mu.Lock()
		defer res.mu.Unlock()
		return len(res.cache)
	}
	resolve("t0")
	resolve("t1")
	now = now.Add(2 * time.Minute) // t0 and t1 expire
	resolve("t2")
	if got := kept(); got != 1 {
		t.Fatalf("%d resolutions kept after the others expired, want 1", got)
	}

	res.max = 3
	resolve("t3")
	resolve("t4")
	resolve("t2") // used again: t3 is now the least recently used
	resolve("t5")
	if got := kept(); got != 3 {
		t.Fatalf("%d resolutions kept, want the bound, 3", got)
	}
	base := reg.manifests.Load()
	resolve("t2")
	resolve("t4")
	resolve("t5")
	if got := reg.manifests.Load() - base; got != 0 {
		t.Errorf("the 3 most recently used were asked for again (%d manifest GETs)", got)
	}
	resolve("t3")
	if got := reg.manifests.Load() - base; got == 0 {
		t.Errorf("the least recently used resolution was kept beyond the bound")
	}
}
