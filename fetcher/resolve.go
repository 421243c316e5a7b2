package fetcher

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/layerstore/layerstore/chunked"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sync/singleflight"
)

// Manifest is one image manifest of a resolved reference: its layers with the descriptors'
// annotations and the config's DiffIDs.
type Manifest struct {
	Digest   digest.Digest
	Platform *v1.Platform // nil for a manifest that was not reached through an index
	Layers   []ImageLayer
	Start    Start // what its config runs by default
}

// Start is what an image's config runs by default, as far as predicting the files a
// container's start reads needs it: the program, the first word of the config's Entrypoint,
// else of its Cmd (a name looked for in Path, or a path), and the PATH of the config's
// environment. Either is empty when the config names none, or one longer than maxStartLen.
// A runtime may run another command: this is a prediction, never a promise.
type Start struct {
	Program string
	Path    string
}

// maxStartLen bounds the program and PATH taken from a config (the config is untrusted).
const maxStartLen = 4096

func startOf(c v1.Config) Start {
	var s Start
	argv := c.Entrypoint
	if len(argv) == 0 {
		argv = c.Cmd
	}
	if len(argv) > 0 && len(argv[0]) <= maxStartLen {
		s.Program = argv[0]
	}
	for _, e := range c.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok && len(v) <= maxStartLen {
			s.Path = v
		}
	}
	return s
}

// ImageLayer is a layer descriptor as the manifest states it, with its DiffID from the config.
type ImageLayer struct {
	chunked.Descriptor
	DiffID digest.Digest
}

// Image is a resolved reference. Manifests[0] is the one for the host platform (or the only
// one); the others are the remaining platforms of an image index, fetched on demand with
// [Resolver.Platforms].
type Image struct {
	Ref    string        // the reference as asked
	Digest digest.Digest // what the reference resolved to: an index or a manifest
	Manifest
	// index lists the other platforms' manifests of an index (digest and platform).
	index []v1.Descriptor
	// sources are where the image can be read: the one that served its manifest first, then
	// the others (mirrors, the registry) in the order they were tried.
	sources []*source
}

// Resolver turns references into images. Resolutions by tag are kept for the tag TTL,
// resolutions by digest until they are the least recently used of more than
// [MaxResolutions]; failures are never kept. Concurrent resolutions of one reference share one
// set of requests.
type Resolver struct {
	sources  func(name.Reference) ([]*source, error) // where a reference is read, in order
	platform v1.Platform
	tagTTL   time.Duration
	// The retry policy of blob reads (see [Blob.Fetch]): attempts, backoff, the bound of one
	// attempt.
	attempts            int
	initial, maxBackoff time.Duration
	timeout             time.Duration
	now                 func() time.Time
	sleep               func(context.Context, time.Duration) error
	log                 *slog.Logger

	group singleflight.Group
	max   int        // the most resolutions kept
	mu    sync.Mutex // guards cache and lru
	cache map[string]*list.Element
	lru   *list.List // of *resolved, most recently used first
}

type resolved struct {
	key     string
	img     *Image
	expires time.Time // zero: never (pulled by digest)
}

// MaxResolutions is how many resolutions a Resolver keeps at most; beyond, the least recently
// used are dropped. Expired ones are dropped whenever one is added.
const MaxResolutions = 1024

// NewResolver returns a resolver whose requests go through rt, which carries authentication
// and the registries' TLS settings, configured by the fields of cfg about resolutions and
// retries (Platform, TagTTL, RequestTimeout, StallTimeout, MaxAttempts, Logger). It reads every
// reference from its own registry, pinging it once per resolution, over https, or plain http
// for registries on loopback and private addresses (go-containerregistry's choice). A [Client]
// adds registries.conf (mirrors, rewrites, blocking, insecure) and credentials.
func NewResolver(rt http.RoundTripper, cfg Config) (*Resolver, error) {
	if rt == nil {
		return nil, errors.New("fetcher: nil transport")
	}
	o, err := cfg.options()
	if err != nil {
		return nil, fmt.Errorf("fetcher: %w", err)
	}
	return newResolver(func(ref name.Reference) ([]*source, error) {
		return []*source{newSource(ref, rt, nil, o.stall)}, nil
	}, o), nil
}

// newResolver returns a resolver reading each reference from the sources that sources returns,
// retrying the last one as o says.
func newResolver(sources func(name.Reference) ([]*source, error), o options) *Resolver {
	return &Resolver{
		sources:    sources,
		platform:   o.platform,
		tagTTL:     o.tagTTL,
		attempts:   o.manifestAttempts,
		initial:    o.initialBackoff,
		maxBackoff: o.maxBackoff,
		timeout:    o.timeout,
		now:        o.now,
		sleep:      o.sleep,
		log:        o.log,
		max:        MaxResolutions,
		cache:      map[string]*list.Element{},
		lru:        list.New(),
	}
}

// forget drops every kept resolution.
func (r *Resolver) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.cache)
	r.lru.Init()
}

// cached returns the kept resolution of key, if it has not expired.
func (r *Resolver) cached(key string) (*Image, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.cache[key]
	if !ok {
		return nil, false
	}
	c := e.Value.(*resolved)
	if !c.expires.IsZero() && !r.now().Before(c.expires) {
		r.lru.Remove(e)
		delete(r.cache, key)
		return nil, false
	}
	r.lru.MoveToFront(e)
	return c.img, true
}

// keep keeps c, dropping the expired resolutions and then the least recently used beyond
// r.max.
func (r *Resolver) keep(c *resolved) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.cache[c.key]; ok {
		r.lru.Remove(e)
	}
	r.cache[c.key] = r.lru.PushFront(c)
	now := r.now()
	for e := r.lru.Front(); e != nil; {
		next := e.Next()
		if old := e.Value.(*resolved); !old.expires.IsZero() && !now.Before(old.expires) {
			r.lru.Remove(e)
			delete(r.cache, old.key)
		}
		e = next
	}
	for r.lru.Len() > r.max {
		old := r.lru.Remove(r.lru.Back()).(*resolved)
		delete(r.cache, old.key)
	}
}

func hostPlatform() v1.Platform {
	p := v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
	if runtime.GOARCH == "arm" {
		p.Variant = "v7"
	} else if runtime.GOARCH == "arm64" {
		p.Variant = "v8"
	}
	return p
}

// Resolve resolves a reference ("registry/repo:tag", "registry/repo@sha256:...", or both, in
// which case the digest wins) to its image for the resolver's platform.
func (r *Resolver) Resolve(ctx context.Context, ref string) (*Image, error) {
	parsed, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	key := parsed.String()
	if img, ok := r.cached(key); ok {
		return img, nil
	}
	v, err, _ := r.group.Do(key, func() (any, error) {
		img, err := r.resolve(ctx, ref, parsed)
		if err != nil {
			return nil, err
		}
		c := &resolved{key: key, img: img}
		if _, byTag := parsed.(name.Tag); byTag {
			c.expires = r.now().Add(r.tagTTL)
		}
		r.keep(c)
		return img, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Image), nil
}

// parseRef parses a reference strictly (no default registry); a reference with both a tag and
// a digest is taken by digest.
func parseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		if d, derr := name.NewDigest(ref, name.StrictValidation); derr == nil {
			return d, nil
		}
		return nil, fmt.Errorf("reference %q: %w", ref, err)
	}
	return r, nil
}

func remoteOptions(ctx context.Context, rt http.RoundTripper) []remote.Option {
	return []remote.Option{remote.WithTransport(rt), remote.WithContext(ctx)}
}

// resolve reads ref from its sources in order, stopping at the first that serves it.
func (r *Resolver) resolve(ctx context.Context, ref string, parsed name.Reference) (*Image, error) {
	srcs, err := r.sources(parsed)
	if err != nil {
		return nil, err
	}
	var img *Image
	i, err := r.eachSource(ctx, srcs, func(ctx context.Context, s *source) error {
		var err error
		img, err = r.resolveFrom(ctx, ref, s)
		return err
	})
	if err != nil {
		return nil, err
	}
	if i > 0 {
		r.log.Debug("resolved from a later source", "ref", ref, "source", srcs[i].ref.String())
	}
	img.sources = preferring(srcs, i)
	return img, nil
}

// eachSource calls fn with each source in turn until one succeeds, and returns its index. A
// blocked source is passed over without a request. A failure other than the caller's context
// ending moves on to the next source; the last source's transient failures are retried first.
// When every source fails, the error wraps the last one's failure and quotes the others'.
func (r *Resolver) eachSource(ctx context.Context, srcs []*source, fn func(context.Context, *source) error) (int, error) {
	var failed []string
	var err error
	for i, s := range srcs {
		if err = s.blocked; err == nil {
			err = r.trySource(ctx, s, fn, i == len(srcs)-1)
		}
		if err == nil {
			return i, nil
		}
		if ctx.Err() != nil {
			return -1, err
		}
		if i < len(srcs)-1 {
			r.log.Debug("source failed; trying the next one", "source", s.ref.String(), "err", err)
			failed = append(failed, fmt.Sprintf("[%s: %v]", s.ref, err))
		}
	}
	if len(failed) == 0 {
		return -1, err
	}
	return -1, fmt.Errorf("%w (mirrors also failed: %s)", err, strings.Join(failed, " "))
}

// trySource calls fn with s, each attempt bounded by the request timeout, again after a pause
// while it fails transiently if retry is set: the retries of a blob read.
func (r *Resolver) trySource(ctx context.Context, s *source, fn func(context.Context, *source) error, retry bool) error {
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, r.timeout)
		err := fn(actx, s)
		if err != nil && ctx.Err() == nil && actx.Err() != nil {
			err = fmt.Errorf("%w: no answer within the request timeout (%v): %w", ErrTransient, r.timeout, err)
		}
		cancel()
		if err == nil || !retry || attempt >= r.attempts || !errors.Is(err, ErrTransient) || ctx.Err() != nil {
			return err
		}
		d := backoff(r.initial, r.maxBackoff, attempt)
		r.log.Debug("retrying manifest request", "source", s.ref.String(), "attempt", attempt, "delay", d, "err", err)
		if err := r.sleep(ctx, d); err != nil {
			return fmt.Errorf("fetcher: manifest of %s: %w", s.ref, err)
		}
	}
}

// resolveFrom reads ref's manifest (and for an index, the host platform's manifest) from s.
func (r *Resolver) resolveFrom(ctx context.Context, ref string, s *source) (*Image, error) {
	rt, err := s.transport(ctx)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(s.ref, remoteOptions(ctx, rt)...)
	if err != nil {
		return nil, registryError("manifest of "+s.ref.String(), err)
	}
	img := &Image{Ref: ref, Digest: digest.Digest(desc.Digest.String())}
	if !desc.MediaType.IsIndex() {
		im, err := desc.Image() // reuses the manifest just fetched
		if err != nil {
			return nil, registryError("manifest of "+s.ref.String(), err)
		}
		m, err := manifestOf(im, s.ref.Context().Digest(desc.Digest.String()), nil)
		if err != nil {
			return nil, err
		}
		img.Manifest = *m
		return img, nil
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, registryError("index of "+s.ref.String(), err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, registryError("index of "+s.ref.String(), err)
	}
	host := -1
	for i, d := range im.Manifests {
		if d.MediaType.IsImage() && d.Platform != nil && d.Platform.Satisfies(r.platform) {
			host = i
			break
		}
	}
	if host < 0 {
		return nil, fmt.Errorf("%s: no manifest for %s: %w", ref, r.platform, ErrNotFound)
	}
	for i, d := range im.Manifests {
		if i != host && d.MediaType.IsImage() {
			img.index = append(img.index, d)
		}
	}
	d := im.Manifests[host]
	m, err := manifestFrom(ctx, s, d)
	if err != nil {
		return nil, err
	}
	img.Manifest = *m
	return img, nil
}

// Platforms returns the manifests of an index's other platforms, fetching them now: a layer
// asked for by a runtime may belong to a platform other than the host's. They are read from the
// source that served the index first, then from the others.
func (r *Resolver) Platforms(ctx context.Context, img *Image) ([]*Manifest, error) {
	if len(img.index) > 0 && len(img.sources) == 0 {
		return nil, errors.New("fetcher: the image was not resolved by a Resolver or Client")
	}
	var out []*Manifest
	for _, d := range img.index {
		var m *Manifest
		_, err := r.eachSource(ctx, img.sources, func(ctx context.Context, s *source) error {
			var err error
			m, err = manifestFrom(ctx, s, d)
			return err
		})
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// manifestFrom reads the image manifest d of s's repository.
func manifestFrom(ctx context.Context, s *source, d v1.Descriptor) (*Manifest, error) {
	rt, err := s.transport(ctx)
	if err != nil {
		return nil, err
	}
	ref := s.ref.Context().Digest(d.Digest.String())
	im, err := remote.Image(ref, remoteOptions(ctx, rt)...)
	if err != nil {
		return nil, registryError("manifest "+ref.String(), err)
	}
	return manifestOf(im, ref, d.Platform)
}

// manifestOf reads an image's layers and its config's DiffIDs.
func manifestOf(im v1.Image, ref name.Digest, p *v1.Platform) (*Manifest, error) {
	mf, err := im.Manifest()
	if err != nil {
		return nil, registryError("manifest "+ref.String(), err)
	}
	cf, err := im.ConfigFile()
	if err != nil {
		return nil, registryError("config of "+ref.String(), err)
	}
	if len(cf.RootFS.DiffIDs) != len(mf.Layers) {
		return nil, fmt.Errorf("%s: %d layers but %d DiffIDs in the config: %w", ref, len(mf.Layers), len(cf.RootFS.DiffIDs), ErrBadResponse)
	}
	m := &Manifest{Digest: digest.Digest(ref.DigestStr()), Platform: p, Start: startOf(cf.Config)}
	for i, l := range mf.Layers {
		d, diffID := digest.Digest(l.Digest.String()), digest.Digest(cf.RootFS.DiffIDs[i].String())
		if d.Validate() != nil || diffID.Validate() != nil || l.Size < 0 {
			return nil, fmt.Errorf("%s: layer %d: digest %q, DiffID %q, size %d: %w", ref, i, d, diffID, l.Size, ErrBadResponse)
		}
		m.Layers = append(m.Layers, ImageLayer{
			Descriptor: chunked.Descriptor{MediaType: string(l.MediaType), Digest: d, Size: l.Size, Annotations: l.Annotations},
			DiffID:     diffID,
		})
	}
	return m, nil
}

// registryError maps go-containerregistry's errors onto the package sentinels.
func registryError(what string, err error) error {
	if errors.Is(err, ErrBadResponse) || errors.Is(err, ErrTransient) { // from boundedTransport: refused, stalled
		return fmt.Errorf("%s: %w", what, err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) { // a body cut short: connection trouble, as for blobs
		return fmt.Errorf("%s: %w: %v", what, ErrTransient, err)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%s: %w: %v", what, ErrNotFound, err)
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("%s: %w: %v", what, ErrUnauthorized, err)
		case te.StatusCode == http.StatusRequestTimeout || te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500:
			return fmt.Errorf("%s: %w: %v", what, ErrTransient, err)
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	var ce *tls.CertificateVerificationError
	if errors.As(err, &ce) {
		return fmt.Errorf("%s: %w: %v", what, ErrBadResponse, err) // retrying will not help
	}
	var ue *url.Error
	var ne net.Error
	if errors.As(err, &ue) || errors.As(err, &ne) {
		return fmt.Errorf("%s: %w: %v", what, ErrTransient, err)
	}
	return fmt.Errorf("%s: %w: %v", what, ErrBadResponse, err)
}

// statusOf returns the HTTP status of a go-containerregistry error, or 0.
func statusOf(err error) int {
	var te *transport.Error
	if errors.As(err, &te) {
		return te.StatusCode
	}
	return 0
}
