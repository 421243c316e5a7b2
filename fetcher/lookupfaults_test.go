package fetcher

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// lookupFault answers one request instead of the registry (true), as a faulty registry or
// network would; inner is the registry's own handler.
type lookupFault func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool

// The faults of the soak: each is transient, and a lookup must get past one of each.
var lookupFaults = map[string]lookupFault{
	"truncated": func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool {
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code) // Content-Length of the whole body, half of it sent
		_, _ = w.Write(rec.Body.Bytes()[:rec.Body.Len()/2])
		return true
	},
	"reset": func(w http.ResponseWriter, r *http.Request, _ http.Handler) bool {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return true
	},
	"503": func(w http.ResponseWriter, r *http.Request, _ http.Handler) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	},
	"429": func(w http.ResponseWriter, r *http.Request, _ http.Handler) bool {
		w.WriteHeader(http.StatusTooManyRequests)
		return true
	},
	"stall before the answer": func(w http.ResponseWriter, r *http.Request, _ http.Handler) bool {
		<-r.Context().Done()
		return true
	},
	"stall in the body": func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool {
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes()[:min(rec.Body.Len(), 3)])
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
		return true
	},
}

// TestLookupFaults is the fault matrix of a lookup's requests: the manifest by tag, an
// index, the platform's manifest it names, the config, and the layer's footer and TOC (range
// reads of the blob). One fault of each kind on the first request of each: the lookup
// succeeds, with exactly one more request of that kind (the retry), as a blob read does; a
// stall costs the stall bound, not the request timeout.
func TestLookupFaults(t *testing.T) {
	const stall = 300 * time.Millisecond
	for target, match := range map[string]func(r *http.Request, img v1.Image) bool{
		"manifest": func(r *http.Request, _ v1.Image) bool {
			return strings.HasSuffix(r.URL.Path, "/manifests/v1")
		},
		"index": func(r *http.Request, _ v1.Image) bool {
			return strings.HasSuffix(r.URL.Path, "/manifests/multi")
		},
		"platform manifest": func(r *http.Request, img v1.Image) bool {
			d, _ := img.Digest()
			return strings.HasSuffix(r.URL.Path, "/manifests/"+d.String())
		},
		"config": func(r *http.Request, img v1.Image) bool {
			d, _ := img.ConfigName()
			return strings.HasSuffix(r.URL.Path, "/blobs/"+d.String())
		},
		"footer": func(r *http.Request, img v1.Image) bool {
			rng := r.Header.Get("Range")
			return strings.HasSuffix(r.URL.Path, "/blobs/"+layerDigest(t, img, 0)) && rng != "" && !strings.HasPrefix(rng, "bytes=0-")
		},
		"TOC": func(r *http.Request, img v1.Image) bool {
			return strings.HasSuffix(r.URL.Path, "/blobs/"+layerDigest(t, img, 0)) && strings.HasPrefix(r.Header.Get("Range"), "bytes=0-")
		},
	} {
		for fault, answer := range lookupFaults {
			t.Run(target+"/"+fault, func(t *testing.T) {
				w := newWorld(t)
				reg := w.registry("registry.example.com", tlsTrusted)
				img := testImage(t, 1)
				reg.push(t, "team/app:v1", img)
				ref := "registry.example.com/team/app:v1"
				if target == "index" || target == "platform manifest" {
					pushIndex(t, reg, "team/app:multi", img)
					ref = "registry.example.com/team/app:multi"
				}
				var hits, faults atomic.Int32
				reg.setFault(func(rw http.ResponseWriter, r *http.Request) bool {
					if r.Method != http.MethodGet || !match(r, img) {
						return false
					}
					if hits.Add(1) > 1 {
						return false
					}
					faults.Add(1)
					return answer(rw, r, reg.inner)
				})
				path, dropIn := emptyConf(t)
				c := w.client(t, path, dropIn, Config{StallTimeout: stall, manifestAttempts: DefaultMaxAttempts,
					Platform: v1.Platform{OS: "linux", Architecture: "amd64"}})
				sr := &sleepRecorder{}
				c.res.sleep = sr.sleep
				start := time.Now()
				got, err := c.Resolve(t.Context(), ref)
				if err != nil {
					t.Fatalf("resolve: %v", err)
				}
				b, err := c.Blob(t.Context(), got, &got.Layers[0])
				if err != nil {
					t.Fatal(err)
				}
				data := layerBytes(t, img, 0)
				// The footer (the blob's end, as a suffix of its size) and the TOC (its start).
				for _, rng := range [][2]int64{{b.Size() - 10, 10}, {0, 100}} {
					p := make([]byte, rng[1])
					if _, err := b.ReadAt(t.Context(), p, rng[0]); err != nil {
						t.Fatalf("read %v: %v", rng, err)
					}
					if string(p) != string(data[rng[0]:rng[0]+rng[1]]) {
						t.Fatalf("read %v: wrong bytes", rng)
					}
				}
				if took := time.Since(start); took > DefaultRequestTimeout/2 {
					t.Errorf("the lookup took %v", took)
				}
				if faults.Load() != 1 || hits.Load() != 2 {
					t.Errorf("%d faults, %d requests of the %s, want 1 and 2 (one retry)", faults.Load(), hits.Load(), target)
				}
			})
		}
	}
}

// pushIndex stores an index of img (as linux/amd64) and another platform's image as repoTag.
func pushIndex(t *testing.T, reg *fakeRegistry, repoTag string, img v1.Image) {
	t.Helper()
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: testImage(t, 1), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	ref, err := name.ParseReference(strings.TrimPrefix(reg.admin.URL, "http://") + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
}
