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

// Registry is go-containerregistry's in-process registry on 127.0.0.1, with the blobs of
// pushed layers served by net/http (single and multi-range requests) and counted. It is safe
// for concurrent use.
type Registry struct {
	// Host is "127.0.0.1:PORT", the registry part of references.
	Host  string
	srv   *http.Server
	inner http.Handler

	mu     sync.Mutex
	blobs  map[digest.Digest][]byte
	stats  map[digest.Digest]*BlobStats
	tamper map[digest.Digest]int64
}

// StartRegistry starts a registry on a free port of 127.0.0.1.
func StartRegistry() (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Registry{
		Host:   ln.Addr().String(),
		inner:  registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		blobs:  map[digest.Digest][]byte{},
		stats:  map[digest.Digest]*BlobStats{},
		tamper: map[digest.Digest]int64{},
	}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

// Close stops the registry.
func (r *Registry) Close() error { return r.srv.Close() }

// ServeHTTP serves blob GETs of pushed layers itself and everything else through the
// in-process registry.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	i := strings.LastIndex(req.URL.Path, "/blobs/")
	if req.Method != http.MethodGet || i < 0 {
		r.inner.ServeHTTP(w, req)
		return
	}
	d := digest.Digest(req.URL.Path[i+len("/blobs/"):])
	r.mu.Lock()
	b, ok := r.blobs[d]
	st := r.stats[d]
	flip, tampered := r.tamper[d]
	if ok {
		if req.Header.Get("Range") == "" {
			st.Full++
		} else {
			st.Ranged++
		}
	}
	r.mu.Unlock()
	if !ok {
		r.inner.ServeHTTP(w, req)
		return
	}
	if tampered {
		b = bytes.Clone(b)
		b[flip] ^= 0xff
	}
	cw := &countingWriter{ResponseWriter: w}
	w.Header().Set("Docker-Content-Digest", d.String())
	http.ServeContent(cw, req, "", time.Time{}, bytes.NewReader(b))
	r.mu.Lock()
	st.Bytes += cw.n
	r.mu.Unlock()
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
func (r *Registry) Stats(d digest.Digest) BlobStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.stats[d]; st != nil {
		return *st
	}
	return BlobStats{}
}

// Tamper makes the registry serve blob d with the byte at off inverted.
func (r *Registry) Tamper(d digest.Digest, off int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tamper[d] = off
}

// Push pushes an image of the host's platform made of layers (bottom first) as repoTag
// ("repo:tag", the host is added) and returns the manifest digest.
func (r *Registry) Push(ctx context.Context, repoTag string, layers []Blob) (digest.Digest, error) {
	r.mu.Lock()
	for _, l := range layers {
		d := l.Digest()
		r.blobs[d] = l.Blob
		if r.stats[d] == nil {
			r.stats[d] = &BlobStats{}
		}
	}
	r.mu.Unlock()
	img, err := Image(layers, func(cf *v1.ConfigFile) {
		cf.OS, cf.Architecture = runtime.GOOS, runtime.GOARCH
		cf.Config.Cmd = []string{"/bin/sh"}
	})
	if err != nil {
		return "", err
	}
	ref, err := name.ParseReference(r.Host + "/" + repoTag)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
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
