package fetcher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	digest "github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"
)

// Client reads images from registries as the containers tools (podman, CRI-O) would for the
// same reference: through the mirrors and rewrites of registries.conf, with the credentials
// they would use. It is what the daemon uses; see the package documentation. It is safe for
// concurrent use.
type Client struct {
	sys      *types.SystemContext // registries.conf paths and the auth file
	keychain *keychain
	secure   http.RoundTripper // the base transport
	insecure http.RoundTripper // the base transport without TLS verification
	blobOpts options           // of every Blob; its stall bound is every request's
	res      *Resolver
	log      *slog.Logger
}

// NewClient returns a Client configured by cfg (see [Config]). It reads registries.conf now,
// failing if it is invalid, and takes the auth file from REGISTRY_AUTH_FILE when that is set,
// as podman does.
func NewClient(cfg Config) (*Client, error) {
	if cfg.Transport == nil {
		cfg.Transport = defaultTransport()
	}
	o, err := cfg.options()
	if err != nil {
		return nil, fmt.Errorf("fetcher: %w", err)
	}
	sys := &types.SystemContext{
		SystemRegistriesConfPath:    cfg.RegistriesConf,
		SystemRegistriesConfDirPath: cfg.RegistriesConfDir,
		AuthFilePath:                os.Getenv("REGISTRY_AUTH_FILE"),
	}
	c := &Client{
		sys:      sys,
		keychain: &keychain{mem: cfg.Keychain, sys: sys, extra: slices.Clone(cfg.AuthFiles), log: o.log},
		secure:   cfg.Transport,
		insecure: insecureTransport(cfg.Transport),
		blobOpts: o,
		log:      o.log,
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	c.res = newResolver(c.sources, o)
	return c, nil
}

// load parses registries.conf and its drop-ins into containers/image's process-wide cache
// (keyed by the paths), replacing what the cache held for them.
func (c *Client) load() error {
	if _, err := sysregistriesv2.TryUpdatingCache(c.sys); err != nil {
		return fmt.Errorf("fetcher: reading registries configuration %s: %w",
			sysregistriesv2.ConfigurationSourceDescription(c.sys), err)
	}
	return nil
}

// Reload reads registries.conf and its drop-ins again, and forgets every resolution, so that
// the next Resolve of any reference follows the new configuration (a daemon calls it on
// SIGHUP). When the files are invalid, the error is returned and the previous configuration
// stays in force. Images already resolved keep the sources they were resolved with.
func (c *Client) Reload() error {
	if err := c.load(); err != nil {
		return err
	}
	c.res.forget()
	return nil
}

// Keychain returns the Client's keychain: the memory keychain, then the files and helpers the
// containers tools use, then the extra auth files, then Docker's credsStore.
func (c *Client) Keychain() authn.Keychain { return c.keychain }

// Resolve resolves a reference ("registry/repo:tag", "registry/repo@sha256:...", or both, in
// which case the digest wins) for the Client's platform. References must be fully qualified:
// short names are the runtime's to resolve. The registries.conf entry with the longest
// matching prefix decides the sources tried, in order: its mirrors (those pull-from-mirror and
// mirror-by-digest-only allow for a pull by tag or by digest), then its location. A source
// whose own entry is blocked is passed over without a request ([ErrBlocked] when no source is
// left). Any failure but the context ending moves on to the next source.
func (c *Client) Resolve(ctx context.Context, ref string) (*Image, error) {
	return c.res.Resolve(ctx, ref)
}

// Platforms returns the manifests of an index's other platforms; see [Resolver.Platforms].
func (c *Client) Platforms(ctx context.Context, img *Image) ([]*Manifest, error) {
	return c.res.Platforms(ctx, img)
}

// Blob returns a Blob reading layer l of img: from the source that served img's manifest, and
// when it fails (after its retries), from img's other sources in turn.
func (c *Client) Blob(ctx context.Context, img *Image, l *ImageLayer) (*Blob, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fetcher: %w", err)
	}
	if img == nil || l == nil {
		return nil, errors.New("fetcher: nil image or layer")
	}
	eps, err := img.blobEndpoints(l.Digest)
	if err != nil {
		return nil, err
	}
	return newBlob(eps, l.Size, c.blobOpts)
}

// sources returns where ref is read from, in order, as registries.conf says.
func (c *Client) sources(ref name.Reference) ([]*source, error) {
	named, err := containersRef(ref)
	if err != nil {
		return nil, err
	}
	reg, err := sysregistriesv2.FindRegistry(c.sys, named.Name())
	if err != nil {
		return nil, fmt.Errorf("fetcher: registries configuration: %w", err)
	}
	if reg == nil {
		// No entry: the reference's own registry, as containers/image does.
		reg = &sysregistriesv2.Registry{Prefix: named.String(), Endpoint: sysregistriesv2.Endpoint{Location: named.String()}}
	}
	pss, err := reg.PullSourcesFromReference(named)
	if err != nil {
		return nil, fmt.Errorf("fetcher: %s: %w", ref, err)
	}
	srcs := make([]*source, 0, len(pss))
	for _, ps := range pss {
		s, err := c.source(ps)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, s)
	}
	return srcs, nil
}

// source makes one pull source of registries.conf into a source: its reference, its transport
// (plain http allowed and TLS verification off when insecure, https only otherwise), and
// whether its own entry blocks it (containers/image checks each endpoint so).
func (c *Client) source(ps sysregistriesv2.PullSource) (*source, error) {
	opts := []name.Option{name.StrictValidation}
	base := c.secure
	if ps.Endpoint.Insecure {
		opts = append(opts, name.Insecure)
		base = c.insecure
	}
	ref, err := name.ParseReference(ps.Reference.String(), opts...)
	if err != nil {
		return nil, fmt.Errorf("fetcher: source %s: %w", ps.Reference, err)
	}
	host := ref.Context().RegistryStr()
	if !ps.Endpoint.Insecure {
		base = &secureOnly{inner: base, host: host}
	}
	if ns := ps.Endpoint.NamespaceProxy; ns != "" {
		base = &nsTransport{inner: base, host: host, ns: ns}
	}
	s := newSource(ref, base, c.keychain, c.blobOpts.stall)
	s.https = !ps.Endpoint.Insecure
	reg, err := sysregistriesv2.FindRegistry(c.sys, ps.Reference.Name())
	if err != nil {
		return nil, fmt.Errorf("fetcher: registries configuration: %w", err)
	}
	if reg != nil && reg.Blocked {
		s.blocked = fmt.Errorf("fetcher: %s: registry %s is blocked in %s: %w", ps.Reference, reg.Prefix,
			sysregistriesv2.ConfigurationSourceDescription(c.sys), ErrBlocked)
	}
	return s, nil
}

// containersRef converts a reference to containers/image's form (Docker Hub as "docker.io"),
// by tag or by digest.
func containersRef(ref name.Reference) (reference.Named, error) {
	named, err := reference.ParseNormalizedNamed(ref.Context().Name())
	if err != nil {
		return nil, fmt.Errorf("fetcher: reference %s: %w", ref, err)
	}
	var out reference.Named
	switch r := ref.(type) {
	case name.Digest:
		d, perr := digest.Parse(r.DigestStr())
		if perr != nil {
			return nil, fmt.Errorf("fetcher: reference %s: %w", ref, perr)
		}
		out, err = reference.WithDigest(named, d)
	case name.Tag:
		out, err = reference.WithTag(named, r.TagStr())
	default:
		err = fmt.Errorf("neither a tag nor a digest")
	}
	if err != nil {
		return nil, fmt.Errorf("fetcher: reference %s: %w", ref, err)
	}
	return out, nil
}

// defaultTransport is a clone of http.DefaultTransport keeping as many idle connections per
// host as Blobs make requests at once by default: http.DefaultTransport keeps 2, and closes the
// others after each request, to dial them again (TLS handshake included) for the next.
func defaultTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 2 * DefaultConcurrencyPerHost
	t.DisableCompression = true
	return t
}

// insecureTransport returns a copy of base that does not verify TLS certificates, for the
// endpoints registries.conf marks insecure; base itself when it is not an *http.Transport.
func insecureTransport(base http.RoundTripper) http.RoundTripper {
	t, ok := base.(*http.Transport)
	if !ok {
		return base
	}
	t = t.Clone()
	if t.TLSClientConfig == nil {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	t.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // registries.conf's insecure = true, for those endpoints only
	return t
}
