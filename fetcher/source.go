package fetcher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	digest "github.com/opencontainers/go-digest"
)

// source is one place a reference is read from: the registry itself or one of its mirrors, with
// the reference rewritten for it (registries.conf's location and mirrors). Its authenticated
// transport is made the first time it is needed and then kept, so that every request made for
// one resolution of an image, the blobs read later included, shares one authentication (one
// ping, one token) per endpoint and repository.
type source struct {
	ref      name.Reference    // the reference at this endpoint
	base     http.RoundTripper // the endpoint's transport below authentication (TLS settings)
	keychain authn.Keychain    // where credentials come from; nil means anonymous
	blocked  error             // non-nil: registries.conf forbids the endpoint; nothing is sent
	https    bool              // plain http is refused (base is a *secureOnly)

	sem chan struct{}     // held while the transport is made
	rt  http.RoundTripper // guarded by sem: the authenticated transport, nil until made
}

// newSource returns a source whose requests are abandoned when they stall for stall.
func newSource(ref name.Reference, base http.RoundTripper, kc authn.Keychain, stall time.Duration) *source {
	return &source{ref: ref, base: bounded(base, stall), keychain: kc, sem: make(chan struct{}, 1)}
}

// transport returns the source's authenticated transport, making it on first use: it pings the
// registry, and when the registry asks for a bearer token, fetches one for pulling from the
// repository with the keychain's credentials. A failure is not kept: the next call tries again.
// The error of a failure is an *authError.
func (s *source) transport(ctx context.Context) (http.RoundTripper, error) {
	repo := s.ref.Context()
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("fetcher: authenticating to %s: %w", repo.RegistryStr(), ctx.Err())
	}
	defer func() { <-s.sem }()
	if s.rt != nil {
		return s.rt, nil
	}
	auth := authn.Anonymous
	if s.keychain != nil {
		a, err := authn.Resolve(ctx, s.keychain, repo)
		if err != nil {
			return nil, &authError{err: fmt.Errorf("fetcher: credentials for %s: %w: %w", repo, ErrUnauthorized, err)}
		}
		auth = a
	}
	rt, err := transport.NewWithContext(ctx, repo.Registry, auth, s.base, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		if isContextErr(err) && ctx.Err() != nil {
			return nil, fmt.Errorf("fetcher: authenticating to %s: %w", repo.RegistryStr(), ctx.Err())
		}
		return nil, &authError{status: statusOf(err), err: registryError("fetcher: authenticating to "+repo.RegistryStr(), err)}
	}
	s.rt = rt
	return rt, nil
}

// authError is a failure to authenticate to a source (the registry refused the credentials, the
// token server failed, the registry could not be reached). err wraps a package sentinel.
type authError struct {
	status int // HTTP status of the failed request, 0 when there was none
	err    error
}

func (e *authError) Error() string { return e.err.Error() }
func (e *authError) Unwrap() error { return e.err }

// authedTransport authenticates to a source on its first request: a Blob built for a fallback
// source that is never needed costs nothing.
type authedTransport struct{ s *source }

func (t authedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rt, err := t.s.transport(req.Context())
	if err != nil {
		return nil, err
	}
	return rt.RoundTrip(req)
}

// nsTransport adds registries.conf's namespace-proxy value as the "ns" query parameter of every
// request to one host, the OCI distribution spec's registry proxying.
type nsTransport struct {
	inner http.RoundTripper
	host  string
	ns    string
}

func (t *nsTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.EqualFold(req.URL.Host, t.host) {
		return t.inner.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	q := r.URL.Query()
	q.Set("ns", t.ns)
	r.URL.RawQuery = q.Encode()
	return t.inner.RoundTrip(r)
}

// secureOnly refuses plain http requests to one host. go-containerregistry falls back to http
// for registries on loopback and private (RFC 1918) addresses when https fails; registries.conf
// allows it only for endpoints marked insecure, as containers/image does.
type secureOnly struct {
	inner http.RoundTripper
	host  string
}

func (t *secureOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && strings.EqualFold(req.URL.Host, t.host) {
		return nil, fmt.Errorf("plain http to %s refused: registries.conf does not mark it insecure", t.host)
	}
	return t.inner.RoundTrip(req)
}

// preferring returns srcs with srcs[i] moved to the front.
func preferring(srcs []*source, i int) []*source {
	out := make([]*source, 0, len(srcs))
	out = append(out, srcs[i])
	out = append(out, srcs[:i]...)
	return append(out, srcs[i+1:]...)
}

// blobEndpoints returns where blob dgst of img can be read: the source that served img's
// manifest first, then the others in registries.conf's order. Blocked sources are left out.
func (img *Image) blobEndpoints(dgst digest.Digest) ([]*endpoint, error) {
	if err := dgst.Validate(); err != nil {
		return nil, fmt.Errorf("fetcher: layer digest %q: %w", dgst, err)
	}
	var eps []*endpoint
	for _, s := range img.sources {
		if s.blocked != nil {
			continue
		}
		repo := s.ref.Context()
		scheme := repo.Scheme() // the transport switches to https when the registry answered there
		if s.https {
			scheme = "https"
		}
		u := fmt.Sprintf("%s://%s/v2/%s/blobs/%s", scheme, repo.RegistryStr(), repo.RepositoryStr(), dgst)
		ep, err := newEndpoint(authedTransport{s}, u)
		if err != nil {
			return nil, err
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, errors.New("fetcher: the image has no source to read blobs from (not resolved by a Resolver or Client?)")
	}
	return eps, nil
}
