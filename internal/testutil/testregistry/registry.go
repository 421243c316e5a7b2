// Package testregistry runs a registry on 127.0.0.1 for tests and benchmarks: go-containerregistry's
// in-process registry, with layer blobs served by net/http (single and multi-range requests)
// and every blob request recorded, so that tests can tell lazy pulls from full ones, and with
// the faults of hostile registries (tampered bytes, errors, hangs, foreign blobs, encoded
// bodies). The demo's registry (internal/demo) is a smaller, read-only one that keeps
// go-containerregistry out of the layerstore binary.
package testregistry

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/demo"
)

// LayerBlob is a layer blob with what its descriptor and the image config say about it.
type LayerBlob = demo.LayerBlob

// BlobStats counts the GET requests for one blob.
type BlobStats = demo.BlobStats

// Registry is a running registry. It is safe for concurrent use.
type Registry struct {
	// Host is "127.0.0.1:PORT", the registry part of references.
	Host       string
	demo.Blobs // the pushed blobs, counted (Stats) and tampered with (Tamper, Untamper)
	srv        *http.Server
	inner      http.Handler

	mu   sync.Mutex
	fail map[digest.Digest]int // status code to answer
	// Hostile behaviour (see Serve and Hang).
	served map[repoBlob][]byte // nil value: the repository does not have the blob
	hang   map[digest.Digest]bool
	stall  map[digest.Digest]stall
	encode map[digest.Digest]encoded
	closed chan struct{}
}

// encoded is a body answered with a Content-Encoding (see Encode).
type encoded struct {
	encoding string
	body     []byte
}

type repoBlob struct {
	repo string
	d    digest.Digest
}

// RegistriesConf returns a registries.conf (v2) that lets containers/image, and the daemon,
// reach each of hosts ("127.0.0.1:PORT", a Registry's Host) over plain http: the test
// registries serve no TLS.
func RegistriesConf(hosts ...string) string {
	var b strings.Builder
	for i, h := range hosts {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "[[registry]]\nlocation = %q\ninsecure = true\n", h)
	}
	return b.String()
}

// Start starts a registry on a free port of 127.0.0.1.
func Start() (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Registry{
		Host:   ln.Addr().String(),
		inner:  innerRegistry(),
		fail:   map[digest.Digest]int{},
		served: map[repoBlob][]byte{},
		hang:   map[digest.Digest]bool{},
		stall:  map[digest.Digest]stall{},
		encode: map[digest.Digest]encoded{},
		closed: make(chan struct{}),
	}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

// Close stops the registry.
func (r *Registry) Close() error {
	r.mu.Lock()
	select {
	case <-r.closed:
	default:
		close(r.closed)
	}
	r.mu.Unlock()
	return r.srv.Close()
}

// ServeHTTP serves blob GETs of pushed layers itself, as the faults set say, and everything
// else through the in-process registry.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	d, repo, ok := demo.BlobGet(req)
	if !ok {
		r.inner.ServeHTTP(w, req)
		return
	}
	r.mu.Lock()
	enc, encode := r.encode[d]
	b, hostile := r.served[repoBlob{repo, d}]
	code, hang := r.fail[d], r.hang[d]
	st, stalled := r.stall[d]
	r.mu.Unlock()
	switch {
	case encode:
		w.Header().Set("Content-Encoding", enc.encoding)
		w.Header().Set("Content-Length", fmt.Sprint(len(enc.body)))
		_, _ = w.Write(enc.body)
		return
	case hostile && b == nil:
		http.Error(w, "blob unknown to repository", http.StatusNotFound)
		return
	}
	if b, ok = r.Take(req, d, b); !ok {
		r.inner.ServeHTTP(w, req)
		return
	}
	switch {
	case hang:
		select {
		case <-req.Context().Done():
		case <-r.closed:
		}
	case code != 0:
		http.Error(w, http.StatusText(code), code)
	case stalled:
		var first int64
		if _, err := fmt.Sscanf(req.Header.Get("Range"), "bytes=%d-", &first); err != nil {
			first = 0 // no range: the whole blob
		}
		r.Send(&stallWriter{ResponseWriter: w, pos: first, stall: st, done: req.Context().Done(), closed: r.closed}, req, d, b)
	default:
		r.Send(w, req, d, b)
	}
}

// A stall holds the answers to GETs of a blob at one of its offsets (see Stall).
type stall struct {
	at      int64
	release chan struct{}
}

// stallWriter writes an answer's body, whose first byte is the blob's byte pos, up to the
// stall's offset, then waits for the stall's release (or the client, or the registry's end).
type stallWriter struct {
	http.ResponseWriter
	pos          int64
	stall        stall
	done, closed <-chan struct{}
}

func (s *stallWriter) Write(p []byte) (int, error) {
	n := 0
	if s.pos < s.stall.at && s.pos+int64(len(p)) > s.stall.at {
		k, err := s.ResponseWriter.Write(p[:s.stall.at-s.pos])
		n, s.pos = k, s.pos+int64(k)
		if err != nil {
			return n, err
		}
		_ = http.NewResponseController(s.ResponseWriter).Flush()
		select {
		case <-s.stall.release:
		case <-s.done:
			return n, http.ErrAbortHandler
		case <-s.closed:
			return n, http.ErrAbortHandler
		}
		p = p[k:]
	}
	k, err := s.ResponseWriter.Write(p)
	s.pos += int64(k)
	return n + k, err
}

// Stall makes GETs of blob d send the bytes before the blob's offset at (the whole answer,
// for a range that starts there or after), then wait until Unstall, until the client gives up
// or the registry closes: a body that comes in part, then stops for a while.
func (r *Registry) Stall(d digest.Digest, at int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stall[d] = stall{at: at, release: make(chan struct{})}
}

// Unstall lets the answers Stall holds go on, and ends the stall.
func (r *Registry) Unstall(d digest.Digest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, ok := r.stall[d]; ok {
		close(st.release)
		delete(r.stall, d)
	}
}

// Fail makes the registry answer GETs of blob d with status code; 0 restores it.
func (r *Registry) Fail(d digest.Digest, code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail[d] = code
}

// Serve makes GETs of blob d in repository repo ("name", without the host) answer b instead
// of the pushed blob, as a hostile registry would; a nil b makes the repository answer 404,
// as a registry does for a blob pushed only to other repositories.
func (r *Registry) Serve(repo string, d digest.Digest, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.served[repoBlob{repo, d}] = b
}

// Hang makes GETs of blob d wait, without an answer, until the client gives up or the
// registry closes; false restores it.
func (r *Registry) Hang(d digest.Digest, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hang[d] = on
}

// Encode makes GETs of blob d, in any repository and whether or not it was pushed, answer
// body with the header Content-Encoding: encoding, whatever the request accepts: a hostile
// registry sending a compression bomb. The requests are not counted in Stats.
func (r *Registry) Encode(d digest.Digest, encoding string, body []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.encode[d] = encoded{encoding, body}
}

// PutManifest stores body, a manifest of the given media type, as repoTag ("repo:tag"),
// whatever it names: a hostile registry's manifest.
func (r *Registry) PutManifest(ctx context.Context, repoTag, mediaType string, body []byte) error {
	repo, tag, ok := strings.Cut(repoTag, ":")
	if !ok {
		return fmt.Errorf("testregistry: %q has no tag", repoTag)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+r.Host+"/v2/"+repo+"/manifests/"+tag, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", mediaType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("testregistry: PUT manifest %s: %s: %s", repoTag, resp.Status, msg)
	}
	return nil
}

// Platform is an image of an index.
type Platform struct {
	OS, Architecture, Variant string
	Layers                    []LayerBlob
}

// Push pushes an image of the host's platform made of layers as repoTag ("repo:tag", the host
// is added) and returns the manifest digest.
func (r *Registry) Push(ctx context.Context, repoTag string, layers []LayerBlob) (digest.Digest, error) {
	img, err := r.image(Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH, Layers: layers})
	if err != nil {
		return "", err
	}
	return pushImage(ctx, r.Host+"/"+repoTag, img)
}

// PushIndex pushes an image index of one image per platform and returns its digest.
func (r *Registry) PushIndex(ctx context.Context, repoTag string, platforms []Platform) (digest.Digest, error) {
	for _, p := range platforms {
		r.Add(p.Layers)
	}
	idx, err := Index(platforms)
	if err != nil {
		return "", err
	}
	ref, err := name.ParseReference(r.Host + "/" + repoTag)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx)); err != nil {
		return "", err
	}
	h, err := idx.Digest()
	return digest.Digest(h.String()), err
}

// Index builds an OCI image index of one image per platform.
func Index(platforms []Platform) (v1.ImageIndex, error) {
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		img, err := Image(p)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}}})
	}
	return mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex), nil
}

func (r *Registry) image(p Platform) (v1.Image, error) {
	r.Add(p.Layers)
	return Image(p)
}

// Image builds an OCI image of p's platform and layers, with /bin/sh as its command.
func Image(p Platform) (v1.Image, error) {
	return imageOfBlobs(p.Layers, func(cf *v1.ConfigFile) {
		cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
		cf.Config.Cmd = []string{"/bin/sh"}
	})
}

// GzipLayer is a plain (not lazily pullable) gzip layer of a tar stream.
func GzipLayer(tarStream []byte) (LayerBlob, error) { return demo.Gzip(tarStream) }
