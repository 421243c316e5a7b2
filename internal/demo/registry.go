package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
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
func (bs *Blobs) Add(layers []Blob) {
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

// Registry is go-containerregistry's in-process registry on 127.0.0.1, with the blobs of
// pushed layers served and counted by Blobs. It is safe for concurrent use.
type Registry struct {
	// Host is "127.0.0.1:PORT", the registry part of references.
	Host string
	Blobs
	srv   *http.Server
	inner http.Handler
}

// StartRegistry starts a registry on a free port of 127.0.0.1.
func StartRegistry() (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: ln.Addr().String(), inner: InnerRegistry()}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

// InnerRegistry returns go-containerregistry's in-process registry, which serves everything
// but the blobs of Blobs: manifests, configs, uploads.
func InnerRegistry() http.Handler {
	return registry.New(registry.Logger(log.New(io.Discard, "", 0)))
}

// Close stops the registry.
func (r *Registry) Close() error { return r.srv.Close() }

// ServeHTTP serves blob GETs of pushed layers itself and everything else through the
// in-process registry.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	d, _, ok := BlobGet(req)
	if ok {
		var b []byte
		if b, ok = r.Take(req, d, nil); ok {
			r.Send(w, req, d, b)
			return
		}
	}
	r.inner.ServeHTTP(w, req)
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

// Push pushes an image of the host's platform made of layers (bottom first) as repoTag
// ("repo:tag", the host is added) and returns the manifest digest.
func (r *Registry) Push(ctx context.Context, repoTag string, layers []Blob) (digest.Digest, error) {
	r.Add(layers)
	img, err := Image(layers, func(cf *v1.ConfigFile) {
		cf.OS, cf.Architecture = runtime.GOOS, runtime.GOARCH
		cf.Config.Cmd = []string{"/bin/sh"}
	})
	if err != nil {
		return "", err
	}
	return PushImage(ctx, r.Host+"/"+repoTag, img)
}

// PushImage pushes img as ref ("host/repo:tag") and returns its manifest digest.
func PushImage(ctx context.Context, ref string, img v1.Image) (digest.Digest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		return "", err
	}
	h, err := img.Digest()
	return digest.Digest(h.String()), err
}

// Image builds an OCI image of layers (bottom first); configure sets the config's platform,
// command and the like.
func Image(layers []Blob, configure func(*v1.ConfigFile)) (v1.Image, error) {
	ils := make([]ImageLayer, len(layers))
	for i, l := range layers {
		ils[i] = ImageLayer{CompressedLayer: compressed{l}, Annotations: l.Annotations}
	}
	return ImageOf(ils, configure)
}

// ImageLayer is a compressed layer (its DiffID known) of an image ImageOf builds, with its
// manifest annotations.
type ImageLayer struct {
	partial.CompressedLayer
	Annotations map[string]string
}

// ImageOf builds an OCI image of layers (bottom first); configure sets the config's platform,
// command and the like.
func ImageOf(layers []ImageLayer, configure func(*v1.ConfigFile)) (v1.Image, error) {
	var adds []mutate.Addendum
	for _, l := range layers {
		cl, err := partial.CompressedToLayer(l.CompressedLayer)
		if err != nil {
			return nil, err
		}
		mt, err := l.MediaType()
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: cl, Annotations: l.Annotations, MediaType: mt})
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	configure(cf)
	return mutate.ConfigFile(img, cf)
}

// compressed is a Blob as go-containerregistry reads it.
type compressed struct{ l Blob }

var _ partial.CompressedLayer = compressed{}

func (c compressed) Digest() (v1.Hash, error) { return v1.NewHash(c.l.Digest().String()) }
func (c compressed) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(c.l.Blob)), nil
}
func (c compressed) Size() (int64, error)                { return int64(len(c.l.Blob)), nil }
func (c compressed) MediaType() (types.MediaType, error) { return types.MediaType(c.l.MediaType), nil }
func (c compressed) DiffID() (v1.Hash, error) {
	if c.l.DiffID == "" {
		return v1.Hash{}, fmt.Errorf("layer without DiffID")
	}
	return v1.NewHash(c.l.DiffID.String())
}
