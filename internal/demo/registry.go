package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BlobStats counts the GET requests for one blob.
type BlobStats struct {
	Full   int   // requests without a Range header
	Ranged int   // range requests
	Bytes  int64 // body bytes sent
}

// Blobs are the layer blobs a registry serves itself, by digest: each GET counted, and
// served with net/http's range support (single and multi-range requests), tampered with on
// request. It is safe for concurrent use; the zero value is empty and ready.
type Blobs struct {
	mu     sync.Mutex
	blobs  map[digest.Digest][]byte
	stats  map[digest.Digest]*BlobStats
	tamper map[digest.Digest]int64
}

// Add makes the layers' blobs served and counted.
func (bs *Blobs) Add(layers []LayerBlob) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.blobs == nil {
		bs.blobs, bs.stats, bs.tamper = map[digest.Digest][]byte{}, map[digest.Digest]*BlobStats{}, map[digest.Digest]int64{}
	}
	for _, l := range layers {
		d := l.Digest()
		bs.blobs[d] = l.Blob
		if bs.stats[d] == nil {
			bs.stats[d] = &BlobStats{}
		}
	}
}

// Take counts a GET of blob d and returns the bytes to serve (b instead of the added blob
// when not nil), tampered with if asked; false when d was never added and b is nil.
func (bs *Blobs) Take(req *http.Request, d digest.Digest, b []byte) ([]byte, bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b == nil {
		b = bs.blobs[d]
		if b == nil {
			return nil, false
		}
	}
	st := bs.stats[d]
	if st == nil {
		if bs.stats == nil {
			bs.stats = map[digest.Digest]*BlobStats{}
		}
		st = &BlobStats{}
		bs.stats[d] = st
	}
	if req.Header.Get("Range") == "" {
		st.Full++
	} else {
		st.Ranged++
	}
	if flip, ok := bs.tamper[d]; ok {
		b = bytes.Clone(b)
		b[flip] ^= 0xff
	}
	return b, true
}

// Send answers a GET of blob d (as Take returned it) and counts the bytes sent.
func (bs *Blobs) Send(w http.ResponseWriter, req *http.Request, d digest.Digest, b []byte) {
	cw := &countingWriter{ResponseWriter: w}
	w.Header().Set("Docker-Content-Digest", d.String())
	http.ServeContent(cw, req, "", time.Time{}, bytes.NewReader(b))
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.stats[d].Bytes += cw.n
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// Stats returns the requests made so far for a blob.
func (bs *Blobs) Stats(d digest.Digest) BlobStats {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if st := bs.stats[d]; st != nil {
		return *st
	}
	return BlobStats{}
}

// Tamper makes blob d served with the byte at off inverted.
func (bs *Blobs) Tamper(d digest.Digest, off int64) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.tamper == nil {
		bs.tamper = map[digest.Digest]int64{}
	}
	bs.tamper[d] = off
}

// Untamper makes blob d served as it is again.
func (bs *Blobs) Untamper(d digest.Digest) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	delete(bs.tamper, d)
}

// Registry serves pushed images on 127.0.0.1, read-only, as the distribution API says
// (GET and HEAD of /v2/, manifests by tag or digest, blobs): the layers' blobs served and
// counted by Blobs, manifests and configs from memory. Push stores an image directly; nothing
// is uploaded over HTTP. It is safe for concurrent use.
type Registry struct {
	// Host is "127.0.0.1:PORT", the registry part of references.
	Host string
	Blobs
	srv *http.Server

	mu        sync.Mutex
	manifests map[string][]byte        // by "repo:tag" and "repo@digest"
	configs   map[digest.Digest][]byte // config blobs
}

// StartRegistry starts a registry on a free port of 127.0.0.1.
func StartRegistry() (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: ln.Addr().String(), manifests: map[string][]byte{}, configs: map[digest.Digest][]byte{}}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

// Close stops the registry.
func (r *Registry) Close() error { return r.srv.Close() }

// ServeHTTP answers the distribution API's reads: the API check, manifests, blobs.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		apiError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry is read-only")
		return
	}
	p := req.URL.Path
	if p == "/v2/" || p == "/v2" {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		return
	}
	if i := strings.LastIndex(p, "/manifests/"); strings.HasPrefix(p, "/v2/") && i >= 0 {
		repo, ref := p[len("/v2/"):i], p[i+len("/manifests/"):]
		sep := ":"
		if strings.Contains(ref, ":") {
			sep = "@"
		}
		r.mu.Lock()
		m, ok := r.manifests[repo+sep+ref]
		r.mu.Unlock()
		if !ok {
			apiError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown")
			return
		}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
		w.Header().Set("Docker-Content-Digest", digest.FromBytes(m).String())
		http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(m))
		return
	}
	if i := strings.LastIndex(p, "/blobs/"); strings.HasPrefix(p, "/v2/") && i >= 0 {
		d := digest.Digest(p[i+len("/blobs/"):])
		r.mu.Lock()
		cfg, isConfig := r.configs[d]
		r.mu.Unlock()
		if isConfig {
			w.Header().Set("Docker-Content-Digest", d.String())
			http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(cfg))
			return
		}
		if req.Method == http.MethodGet {
			if b, ok := r.Take(req, d, nil); ok {
				r.Send(w, req, d, b)
				return
			}
		} else if b := r.blob(d); b != nil {
			w.Header().Set("Docker-Content-Digest", d.String())
			http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(b))
			return
		}
		apiError(w, http.StatusNotFound, "BLOB_UNKNOWN", "blob unknown")
		return
	}
	apiError(w, http.StatusNotFound, "NAME_UNKNOWN", "not found")
}

// blob returns an added blob, nil if there is none.
func (bs *Blobs) blob(d digest.Digest) []byte {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.blobs[d]
}

// apiError answers with the distribution API's error body.
func apiError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
}

// BlobGet returns the digest and repository of a blob GET ("/v2/REPO/blobs/DIGEST"); false
// for any other request.
func BlobGet(req *http.Request) (d digest.Digest, repo string, ok bool) {
	i := strings.LastIndex(req.URL.Path, "/blobs/")
	if req.Method != http.MethodGet || i < 0 {
		return "", "", false
	}
	return digest.Digest(req.URL.Path[i+len("/blobs/"):]), strings.TrimPrefix(req.URL.Path[:i], "/v2/"), true
}

// Push stores an OCI image of the host's platform made of layers (bottom first), with
// /bin/sh as its command, as repoTag ("repo:tag"), and returns the manifest digest.
func (r *Registry) Push(ctx context.Context, repoTag string, layers []LayerBlob) (digest.Digest, error) {
	repo, tag, ok := strings.Cut(repoTag, ":")
	if !ok {
		tag = "latest"
	}
	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH},
		Config:   ocispec.ImageConfig{Cmd: []string{"/bin/sh"}},
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	m := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest}
	for _, l := range layers {
		if l.DiffID == "" {
			return "", errors.New("layer without DiffID")
		}
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.DiffID)
		cfg.History = append(cfg.History, ocispec.History{CreatedBy: "layerstore demo"})
		m.Layers = append(m.Layers, ocispec.Descriptor{MediaType: l.MediaType, Digest: l.Digest(),
			Size: int64(len(l.Blob)), Annotations: l.Annotations})
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	m.Config = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cb), Size: int64(len(cb))}
	mb, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	md := digest.FromBytes(mb)
	r.Add(layers)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.configs[m.Config.Digest] = cb
	r.manifests[repo+":"+tag] = mb
	r.manifests[repo+"@"+md.String()] = mb
	return md, ctx.Err()
}
