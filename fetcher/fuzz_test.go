package fetcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// fuzzRegistry serves one repository whose answers the fuzz target sets: top at the tag (and
// at its digest), child at its digest, config for any blob. In top and child, CONFIG_DIGEST,
// CONFIG_SIZE, CHILD_DIGEST and CHILD_SIZE stand for the config's and child's digest and size,
// so that mutated manifests still reach the config and the index's manifest.
type fuzzRegistry struct {
	srv *httptest.Server

	mu                 sync.Mutex
	top, child, config []byte
}

const fuzzChild = `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",` +
	`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"CONFIG_DIGEST","size":CONFIG_SIZE},` +
	`"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"sha256:` +
	`0000000000000000000000000000000000000000000000000000000000000000","size":10,"annotations":{"a":"b"}}]}`

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func newFuzzRegistry(f *testing.F) *fuzzRegistry {
	r := &fuzzRegistry{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		top, child, config := r.top, r.child, r.config
		r.mu.Unlock()
		p := req.URL.Path
		var body []byte
		switch {
		case p == "/v2/":
			return
		case strings.HasPrefix(p, "/v2/r/blobs/"):
			body = config
		case p == "/v2/r/manifests/t" || p == "/v2/r/manifests/"+sha(top):
			body = top
		case p == "/v2/r/manifests/"+sha(child):
			body = child
		default:
			http.NotFound(w, req)
			return
		}
		var mt struct {
			MediaType string `json:"mediaType"`
		}
		_ = json.Unmarshal(body, &mt)
		w.Header().Set("Content-Type", mt.MediaType)
		w.Header().Set("Docker-Content-Digest", sha(body))
		_, _ = w.Write(body)
	}))
	f.Cleanup(r.srv.Close)
	return r
}

func (r *fuzzRegistry) set(manifest, config []byte) {
	child := strings.NewReplacer("CONFIG_DIGEST", sha(config), "CONFIG_SIZE", strconv.Itoa(len(config))).Replace(fuzzChild)
	top := strings.NewReplacer("CONFIG_DIGEST", sha(config), "CONFIG_SIZE", strconv.Itoa(len(config)),
		"CHILD_DIGEST", sha([]byte(child)), "CHILD_SIZE", strconv.Itoa(len(child))).Replace(string(manifest))
	r.mu.Lock()
	r.top, r.child, r.config = []byte(top), []byte(child), config
	r.mu.Unlock()
}

// FuzzResolve resolves a reference whose manifest (or index) and config are the fuzzer's: a
// resolution never panics, fails with one of the package's errors, and what it returns is
// consistent (a DiffID for each layer, valid digests).
func FuzzResolve(f *testing.F) {
	f.Add([]byte(fuzzChild), []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:`+strings.Repeat("1", 64)+`"]}}`))
	f.Add([]byte(strings.ReplaceAll(strings.ReplaceAll(fuzzChild, "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"),
		"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json")),
		[]byte(`{"rootfs":{"diff_ids":["sha256:`+strings.Repeat("2", 64)+`"]}}`))
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[`+
		`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"CHILD_DIGEST","size":CHILD_SIZE,"platform":{"os":"linux","architecture":"arm64"}},`+
		`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"CHILD_DIGEST","size":CHILD_SIZE,"platform":{"os":"linux","architecture":"amd64"}}]}`),
		[]byte(`{"rootfs":{"diff_ids":["sha256:`+strings.Repeat("3", 64)+`"]}}`))
	f.Add([]byte(`{"schemaVersion":2,"config":{"digest":"CONFIG_DIGEST","size":-1},"layers":[]}`), []byte(`{}`))
	reg := newFuzzRegistry(f)
	tr := defaultTransport()
	f.Cleanup(tr.CloseIdleConnections)
	host := strings.TrimPrefix(reg.srv.URL, "http://")
	f.Fuzz(func(t *testing.T, manifest, config []byte) {
		reg.set(manifest, config)
		res, err := NewResolver(tr, Config{manifestAttempts: 1, Platform: v1.Platform{OS: "linux", Architecture: "amd64"}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		img, err := res.Resolve(ctx, host+"/r:t")
		if err != nil {
			for _, s := range []error{ErrBadResponse, ErrNotFound, ErrTransient, ErrUnauthorized} {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("error %v wraps none of the package's errors", err)
		}
		if err := img.Digest.Validate(); err != nil {
			t.Fatalf("image digest %q: %v", img.Digest, err)
		}
		for _, l := range img.Layers {
			if l.Digest.Validate() != nil || l.DiffID.Validate() != nil {
				t.Fatalf("layer %+v: invalid digests", l)
			}
		}
		if _, err := res.Platforms(ctx, img); err != nil && !errors.Is(err, ErrBadResponse) && !errors.Is(err, ErrNotFound) {
			t.Fatalf("platforms: %v", err)
		}
	})
}
