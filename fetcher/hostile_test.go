package fetcher

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// hostileRegistry is a registry serving one image, "bomb/app:latest", whose manifest and
// config answers are what its fields say.
type hostileRegistry struct {
	srv      *httptest.Server
	host     string
	manifest func(w http.ResponseWriter) // answers manifest GETs
	config   func(w http.ResponseWriter) // answers blob GETs
}

func newHostileRegistry(t *testing.T) *hostileRegistry {
	t.Helper()
	h := &hostileRegistry{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/":
			w.WriteHeader(http.StatusOK)
		case strings.Contains(r.URL.Path, "/manifests/") && h.manifest != nil:
			h.manifest(w)
		case strings.Contains(r.URL.Path, "/blobs/") && h.config != nil:
			h.config(w)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(h.srv.Close)
	h.host = strings.TrimPrefix(h.srv.URL, "http://")
	return h
}

// manifestFor is an OCI manifest of one layer whose config descriptor claims size bytes.
func manifestFor(config []byte, size int64) []byte {
	sum := sha256.Sum256(config)
	m := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{
			"mediaType": "application/vnd.oci.image.config.v1+json",
			"digest":    "sha256:" + hex.EncodeToString(sum[:]), "size": size,
		},
		"layers": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
			"digest":    "sha256:" + strings.Repeat("a", 64), "size": 10,
		}},
	}
	b, _ := json.Marshal(m)
	return b
}

// gzipBomb returns gzip members inflating to mib MiB of zeros.
func gzipBomb(t *testing.T, mib int) []byte {
	t.Helper()
	var one bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&one, gzip.BestCompression)
	if _, err := zw.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.Repeat(one.Bytes(), mib)
}

func serveJSON(body []byte, encoding string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		if encoding != "" {
			w.Header().Set("Content-Encoding", encoding)
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body)
	}
}

// allocatedDuring returns the bytes allocated (runtime.MemStats.TotalAlloc) while f ran.
func allocatedDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHostileBodiesBounded: manifests and configs that are gzip bombs (Content-Encoding: gzip)
// or longer than the cap fail with ErrBadResponse, and a lookup allocates little more than the
// cap whatever the registry sends.
func TestHostileBodiesBounded(t *testing.T) {
	const bombMiB = 256
	bomb := gzipBomb(t, bombMiB)
	config := []byte(`{"rootfs":{"type":"layers","diff_ids":["sha256:` + strings.Repeat("b", 64) + `"]}}`)
	cases := []struct {
		name             string
		manifest, config func(w http.ResponseWriter)
		want             string
	}{
		{name: "config gzip bomb",
			manifest: serveJSON(manifestFor(config, bombMiB<<20), ""),
			config:   serveJSON(bomb, "gzip"), want: "Content-Encoding"},
		{name: "manifest gzip bomb",
			manifest: serveJSON(bomb, "gzip"), want: "Content-Encoding"},
		{name: "config over the cap",
			manifest: serveJSON(manifestFor(config, 64<<20), ""),
			config:   serveJSON(make([]byte, 64<<20), ""), want: "larger than"},
		{name: "manifest over the cap",
			manifest: serveJSON(append([]byte(`{"schemaVersion":2,"x":"`), make([]byte, 64<<20)...), ""), want: "larger than"},
		{name: "manifest over the cap, chunked",
			manifest: func(w http.ResponseWriter) {
				_, _ = w.Write([]byte(`{"schemaVersion":2,"x":"`))
				chunk := bytes.Repeat([]byte("x"), 1<<20)
				for range 64 {
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			}, want: "larger than"},
		{name: "truncated manifest",
			manifest: func(w http.ResponseWriter) {
				w.Header().Set("Content-Length", "1000")
				_, _ = w.Write(manifestFor(config, int64(len(config)))[:100])
			}, want: "EOF"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg := newHostileRegistry(t)
			reg.manifest, reg.config = c.manifest, c.config
			tr := defaultTransport()
			t.Cleanup(tr.CloseIdleConnections)
			res, err := NewResolver(tr, Config{manifestAttempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			var rerr error
			alloc := allocatedDuring(func() { _, rerr = res.Resolve(t.Context(), reg.host+"/bomb/app:latest") })
			t.Logf("allocated %.1f MiB during the lookup; error: %v", float64(alloc)/(1<<20), rerr)
			if rerr == nil || !strings.Contains(rerr.Error(), c.want) {
				t.Errorf("error = %v, want one saying %q", rerr, c.want)
			}
			if c.want != "EOF" && !errors.Is(rerr, ErrBadResponse) {
				t.Errorf("error = %v, want ErrBadResponse", rerr)
			}
			// Reading a body of up to the cap whole (io.ReadAll doubles its buffer) costs about
			// twice the cap; the race detector adds its own.
			if limit := uint64(2*maxBodySize + 16<<20); alloc > limit {
				t.Errorf("the lookup allocated %d MiB, want at most %d MiB", alloc>>20, limit>>20)
			}
		})
	}
}

// TestBlobEncodedAnswerRefused: a blob range answered with Content-Encoding: gzip fails with
// ErrBadResponse at once (no retries) instead of being inflated.
func TestBlobEncodedAnswerRefused(t *testing.T) {
	data := testBlob(1000)
	reg := newTestRegistry(t, data)
	bomb := gzipBomb(t, 16)
	reg.fault = func(w http.ResponseWriter, r *http.Request, _ int) bool {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", len(data)-1, len(data)))
		w.WriteHeader(http.StatusPartialContent)
		_, _ = w.Write(bomb)
		return true
	}
	b, _ := newTestBlob(t, reg)
	_, err := b.ReadAt(t.Context(), make([]byte, 10), 0)
	if !errors.Is(err, ErrBadResponse) || !strings.Contains(err.Error(), "Content-Encoding") {
		t.Fatalf("error = %v, want ErrBadResponse about the Content-Encoding", err)
	}
	if got := reg.count(); got != 1 {
		t.Errorf("registry saw %d requests, want 1 (no retries)", got)
	}
}
