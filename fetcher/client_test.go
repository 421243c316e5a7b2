package fetcher

import (
	"bytes"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/layerstore/layerstore/internal/byterange"
)

// TestClientMirrorWithAuth reads an image through a mirror asking for bearer tokens, and one
// of its layers, which the mirror lacks, from the registry asking for Basic credentials: each
// endpoint gets its own credentials, one authentication per endpoint, and the right bytes.
func TestClientMirrorWithAuth(t *testing.T) {
	isolate(t)
	w := newWorld(t)
	reg := w.registry("registry.example.com", tlsTrusted)
	mirror := w.registry("mirror.example.com", tlsTrusted)
	tokens := w.tokenServer("auth.example.com", "mirror-user", map[string]string{"": "Mirror-Pa55"})
	mirror.setAuth(tokens.bearerAuth("mirror.example.com"))
	reg.setAuth(basicAuth("reg-user", map[string]string{"": regPass}))
	img := testImage(t, 2)
	mirror.push(t, "team/app:v1", img)
	reg.push(t, "team/app:v1", img)
	missing := layerDigest(t, img, 1)
	mirror.setFault(statusForPath(missing, http.StatusNotFound))

	file := filepath.Join(t.TempDir(), "auth.json")
	writeJSON(t, file, map[string]any{"auths": map[string]any{
		"mirror.example.com":   authEntry("mirror-user", "Mirror-Pa55"),
		"registry.example.com": authEntry("reg-user", regPass),
	}})
	t.Setenv("REGISTRY_AUTH_FILE", file)
	path, dropIn := writeConf(t, `
[[registry]]
location = "registry.example.com"

[[registry.mirror]]
location = "mirror.example.com"
`)
	c := w.client(t, path, dropIn)
	got, err := c.Resolve(t.Context(), "registry.example.com/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if reg.count("") != 0 {
		t.Fatalf("the registry got %d requests; the mirror should have served the manifest", reg.count(""))
	}
	b0 := readLayer(t, c, got, 0, layerBytes(t, img, 0))
	b1 := readLayer(t, c, got, 1, layerBytes(t, img, 1))
	// Read the first layer again in pieces, with several ranges at once.
	if _, err := b0.Fetch(t.Context(), []byterange.Range{{Offset: 0, Length: 10}, {Offset: 100, Length: 20}, {Offset: 200, Length: 56}}); err != nil {
		t.Fatal(err)
	}

	if n := tokens.requests(); n != 1 {
		t.Errorf("%d token requests, want 1 for the whole resolution", n)
	}
	if n := mirror.count("ping"); n != 1 {
		t.Errorf("the mirror was pinged %d times, want 1", n)
	}
	if n := reg.count("ping"); n != 1 {
		t.Errorf("the registry was pinged %d times, want 1 (for the layer the mirror lacks)", n)
	}
	l0 := layerDigest(t, img, 0)
	if n := mirror.countPath(l0); n != 2 {
		t.Errorf("layer 0: %d requests to the mirror, want 2", n)
	}
	if n := mirror.countPath(missing); n != 1 || reg.countPath(missing) != 1 || reg.countPath(l0) != 0 {
		t.Errorf("layer 1: mirror %d, registry %d requests; layer 0 at the registry %d; want 1, 1, 0",
			n, reg.countPath(missing), reg.countPath(l0))
	}
	for _, r := range mirror.requests() {
		if requestKind(r) == "blob" && !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			t.Errorf("mirror %s without its token", r.URL.Path)
		}
	}
	for _, r := range reg.requests() {
		if u, p, ok := r.BasicAuth(); requestKind(r) == "blob" && (!ok || u != "reg-user" || p != regPass) {
			t.Errorf("registry %s without its Basic credentials", r.URL.Path)
		}
	}
	if st := b1.Stats(); st.Requests != 2 {
		t.Errorf("layer 1 Stats = %+v, want 2 requests (the mirror's 404, the registry)", st)
	}
}

// TestClientPlatforms resolves an index through a mirror and reads the other platforms' manifests
// from it.
func TestClientPlatforms(t *testing.T) {
	isolate(t)
	w := newWorld(t)
	reg := w.registry("registry.example.com", tlsTrusted)
	mirror := w.registry("mirror.example.com", tlsTrusted)
	amd, arm := testImage(t, 1), testImage(t, 2)
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	for _, r := range []*fakeRegistry{reg, mirror} {
		r.pushIndex(t, "team/multi:v1", idx)
	}
	path, dropIn := writeConf(t, "[[registry]]\nlocation = \"registry.example.com\"\n[[registry.mirror]]\nlocation = \"mirror.example.com\"\n")
	c := w.client(t, path, dropIn, Config{Platform: v1.Platform{OS: "linux", Architecture: "arm64"}})
	got, err := c.Resolve(t.Context(), "registry.example.com/team/multi:v1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Layers) != 2 {
		t.Fatalf("%d layers, want arm64's 2", len(got.Layers))
	}
	others, err := c.Platforms(t.Context(), got)
	if err != nil {
		t.Fatal(err)
	}
	if len(others) != 1 || len(others[0].Layers) != 1 {
		t.Fatalf("other platforms %+v, want amd64's", others)
	}
	// A layer of another platform is read through the image it came with.
	b, err := c.Blob(t.Context(), got, &others[0].Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, b.Size())
	if _, err := b.ReadAt(t.Context(), data, 0); err != nil || !bytes.Equal(data, layerBytes(t, amd, 0)) {
		t.Fatalf("amd64 layer: %v, or bytes differ", err)
	}
	if hosts := w.contacted(); !slices.Equal(hosts, []string{"mirror.example.com"}) {
		t.Errorf("contacted %v, want the mirror only", hosts)
	}
}

func (fr *fakeRegistry) pushIndex(t *testing.T, repoTag string, idx v1.ImageIndex) {
	t.Helper()
	ref, err := name.ParseReference(strings.TrimPrefix(fr.admin.URL, "http://") + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
}
