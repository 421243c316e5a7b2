package fetcher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

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
	blobOpts []Option
	stall    time.Duration // the blob options' stall bound, for every request
	res      *Resolver
	log      *slog.Logger
}

// ClientOption configures [NewClient].
type ClientOption func(*clientOptions) error

type clientOptions struct {
	conf, dropIn string
	authFiles    []string
	mem          *MemoryKeychain
	base         http.RoundTripper
	blobOpts     []Option
	resOpts      []ResolverOption
	log          *slog.Logger
}

// WithRegistriesConf sets the registries.conf file and its drop-in directory. An empty path
// means containers/image's default search ($CONTAINERS_REGISTRIES_CONF, else the first of
// ~/.config/containers/registries.conf, /etc/containers/registries.conf and
// /usr/share/containers/registries.conf); an empty dropInDir means the default drop-in
// directories (registries.conf.d next to those). A file named here must exist; a drop-in
// directory need not. The default is both empty, as podman and CRI-O read them.
func WithRegistriesConf(path, dropInDir string) ClientOption {
	return func(o *clientOptions) error {
		o.conf, o.dropIn = path, dropInDir
		return nil
	}
}

// WithAuthFiles adds auth files (containers-auth.json(5) or Docker config.json format, such as
// the kubelet's /var/lib/kubelet/config.json) looked up, in order, after the files the
// containers tools read. A file that does not exist is skipped. The default is none.
func WithAuthFiles(paths ...string) ClientOption {
	return func(o *clientOptions) error {
		for _, p := range paths {
			if p == "" {
				return errors.New("auth file path must not be empty")
			}
		}
		o.authFiles = append(o.authFiles, paths...)
		return nil
	}
}

// WithMemoryKeychain sets the keychain of credentials received at run time, asked before any
// file. The default is none.
func WithMemoryKeychain(m *MemoryKeychain) ClientOption {
	return func(o *clientOptions) error {
		if m == nil {
			return errors.New("memory keychain must not be nil")
		}
		o.mem = m
		return nil
	}
}

// WithTransport sets the transport below authentication, for registries, mirrors, token
// servers and blob storage alike. For the endpoints registries.conf marks insecure, a copy
// that does not verify TLS certificates is made when it is an *http.Transport; another
// RoundTripper is used as is for them (plain http is still allowed). The default is a clone
// of http.DefaultTransport.
func WithTransport(rt http.RoundTripper) ClientOption {
	return func(o *clientOptions) error {
		if rt == nil {
			return errors.New("transport must not be nil")
		}
		o.base = rt
		return nil
	}
}

// WithBlobOptions sets options for every Blob the Client makes. They apply after the Client's
// own: the storage transport is the Client's transport and the logger the Client's, unless
// these options change them. The default is none.
func WithBlobOptions(opts ...Option) ClientOption {
	return func(o *clientOptions) error {
		o.blobOpts = append(o.blobOpts, opts...)
		return nil
	}
}

// WithResolverOptions sets options of the Client's resolver (platform, tag TTL, manifest
// attempts). The default is none.
func WithResolverOptions(opts ...ResolverOption) ClientOption {
	return func(o *clientOptions) error {
		o.resOpts = append(o.resOpts, opts...)
		return nil
	}
}

// WithClientLogger sets where the Client, its resolver and its Blobs log (debug level: sources
// tried, credentials found, without secrets; warnings for failing credential helpers). The
// default discards.
func WithClientLogger(l *slog.Logger) ClientOption {
	return func(o *clientOptions) error {
		if l == nil {
			return errors.New("logger must not be nil")
		}
		o.log = l
		return nil
	}
}

// NewClient returns a Client. It reads registries.conf now, failing if it is invalid, and
// takes the auth file from REGISTRY_AUTH_FILE when that is set, as podman does.
func NewClient(opts ...ClientOption) (*Client, error) {
	o := clientOptions{log: discardLogger()}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("fetcher: %w", err)
		}
	}
	if o.base == nil {
		o.base = defaultTransport()
	}
	sys := &types.SystemContext{
		SystemRegistriesConfPath:    o.conf,
		SystemRegistriesConfDirPath: o.dropIn,
		AuthFilePath:                os.Getenv("REGISTRY_AUTH_FILE"),
	}
	c := &Client{
		sys:      sys,
		keychain: &keychain{mem: o.mem, sys: sys, extra: o.authFiles, log: o.log},
		secure:   o.base,
		insecure: insecureTransport(o.base),
		blobOpts: append([]Option{WithStorageTransport(o.base), WithLogger(o.log)}, o.blobOpts...),
		log:      o.log,
	}
	check := defaultOptions()
	for _, opt := range c.blobOpts {
		if err := opt(&check); err != nil {
			return nil, fmt.Errorf("fetcher: %w", err)
		}
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	c.stall = check.stall
	res, err := newResolver(c.sources, append([]ResolverOption{withRetryPolicy(check)}, o.resOpts...)...)
	if err != nil {
		return nil, err
	}
	res.log = o.log
	c.res = res
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
func (c *Client) Blob(ctx context.Context, img *Image, l *Descriptor) (*Blob, error) {
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
	return newBlob(eps, l.Size, c.blobOpts...)
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
	s := newSource(ref, base, c.keychain, c.stall)
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
