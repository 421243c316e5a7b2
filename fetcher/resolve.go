package fetcher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sync/singleflight"
)

// Manifest is one image manifest of a resolved reference: its layers with the descriptors'
// annotations and the config's DiffIDs.
type Manifest struct {
	Digest   digest.Digest
	Platform *v1.Platform // nil for a manifest that was not reached through an index
	Layers   []Layer
}

// Layer is a layer descriptor as the manifest states it, with its DiffID from the config.
type Layer struct {
	MediaType   string
	Digest      digest.Digest
	Size        int64
	Annotations map[string]string
	DiffID      digest.Digest
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
}

// Resolver turns references into images. Resolutions by tag are kept for the tag TTL,
// resolutions by digest for as long as the resolver lives; failures are never kept.
// Concurrent resolutions of one reference share one set of requests.
type Resolver struct {
	rt       http.RoundTripper
	platform v1.Platform
	tagTTL   time.Duration
	now      func() time.Time

	group singleflight.Group
	mu    sync.Mutex // guards cache
	cache map[string]resolved
}

type resolved struct {
	img     *Image
	expires time.Time // zero: never (pulled by digest)
}

// ResolverOption configures a [Resolver].
type ResolverOption func(*Resolver) error

// WithPlatform sets the platform picked from image indexes. The default is the host's
// (runtime.GOOS, runtime.GOARCH, and GOARM's variant on arm).
func WithPlatform(p v1.Platform) ResolverOption {
	return func(r *Resolver) error {
		if p.OS == "" || p.Architecture == "" {
			return errors.New("platform needs an OS and an architecture")
		}
		r.platform = p
		return nil
	}
}

// WithTagTTL sets how long a resolution by tag is reused before the tag is resolved again.
// The default is 5 minutes; pulls by digest never change.
func WithTagTTL(d time.Duration) ResolverOption {
	return func(r *Resolver) error {
		if d < 0 {
			return errors.New("tag TTL must not be negative")
		}
		r.tagTTL = d
		return nil
	}
}

// WithResolverClock sets the clock used for the tag TTL. The default is time.Now.
func WithResolverClock(now func() time.Time) ResolverOption {
	return func(r *Resolver) error {
		r.now = now
		return nil
	}
}

// DefaultTagTTL is how long a resolution by tag is reused.
const DefaultTagTTL = 5 * time.Minute

// NewResolver returns a resolver whose requests go through rt, which carries authentication
// and the registries' TLS settings.
func NewResolver(rt http.RoundTripper, opts ...ResolverOption) (*Resolver, error) {
	r := &Resolver{rt: rt, platform: hostPlatform(), tagTTL: DefaultTagTTL, now: time.Now, cache: map[string]resolved{}}
	for _, o := range opts {
		if err := o(r); err != nil {
			return nil, err
		}
	}
	return r, nil
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
	r.mu.Lock()
	c, ok := r.cache[key]
	r.mu.Unlock()
	if ok && (c.expires.IsZero() || r.now().Before(c.expires)) {
		return c.img, nil
	}
	v, err, _ := r.group.Do(key, func() (any, error) {
		img, err := r.resolve(ctx, ref, parsed)
		if err != nil {
			return nil, err
		}
		c := resolved{img: img}
		if _, byTag := parsed.(name.Tag); byTag {
			c.expires = r.now().Add(r.tagTTL)
		}
		r.mu.Lock()
		r.cache[key] = c
		r.mu.Unlock()
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

func (r *Resolver) options(ctx context.Context) []remote.Option {
	return []remote.Option{remote.WithTransport(r.rt), remote.WithContext(ctx)}
}

func (r *Resolver) resolve(ctx context.Context, ref string, parsed name.Reference) (*Image, error) {
	desc, err := remote.Get(parsed, r.options(ctx)...)
	if err != nil {
		return nil, registryError("manifest of "+ref, err)
	}
	img := &Image{Ref: ref, Digest: digest.Digest(desc.Digest.String())}
	if !desc.MediaType.IsIndex() {
		im, err := desc.Image() // reuses the manifest just fetched
		if err != nil {
			return nil, registryError("manifest of "+ref, err)
		}
		m, err := manifestOf(im, parsed.Context().Digest(desc.Digest.String()), nil)
		if err != nil {
			return nil, err
		}
		img.Manifest = *m
		return img, nil
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, registryError("index of "+ref, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, registryError("index of "+ref, err)
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
	m, err := r.manifest(ctx, parsed.Context().Digest(d.Digest.String()), d.Platform)
	if err != nil {
		return nil, err
	}
	img.Manifest = *m
	return img, nil
}

// Platforms returns the manifests of an index's other platforms, fetching them now: a layer
// asked for by a runtime may belong to a platform other than the host's.
func (r *Resolver) Platforms(ctx context.Context, img *Image) ([]*Manifest, error) {
	parsed, err := parseRef(img.Ref)
	if err != nil {
		return nil, err
	}
	var out []*Manifest
	for _, d := range img.index {
		m, err := r.manifest(ctx, parsed.Context().Digest(d.Digest.String()), d.Platform)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

func (r *Resolver) manifest(ctx context.Context, ref name.Digest, p *v1.Platform) (*Manifest, error) {
	im, err := remote.Image(ref, r.options(ctx)...)
	if err != nil {
		return nil, registryError("manifest "+ref.String(), err)
	}
	return manifestOf(im, ref, p)
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
	m := &Manifest{Digest: digest.Digest(ref.DigestStr()), Platform: p}
	for i, l := range mf.Layers {
		m.Layers = append(m.Layers, Layer{
			MediaType: string(l.MediaType), Digest: digest.Digest(l.Digest.String()), Size: l.Size,
			Annotations: l.Annotations, DiffID: digest.Digest(cf.RootFS.DiffIDs[i].String()),
		})
	}
	return m, nil
}

// registryError maps go-containerregistry's errors onto the package sentinels.
func registryError(what string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%s: %w: %v", what, ErrNotFound, err)
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("%s: %w: %v", what, ErrUnauthorized, err)
		case te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500:
			return fmt.Errorf("%s: %w: %v", what, ErrTransient, err)
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w: %v", what, ErrTransient, err)
	}
	return fmt.Errorf("%s: %w: %v", what, ErrBadResponse, err)
}
