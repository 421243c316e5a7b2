package fetcher

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Defaults of the fields of [Config], and of the backoff between attempts.
const (
	DefaultTagTTL              = 5 * time.Minute
	DefaultRequestTimeout      = 30 * time.Second
	DefaultStallTimeout        = 10 * time.Second
	DefaultMaxAttempts         = 4
	DefaultConcurrencyPerHost  = 8
	DefaultMaxGap              = 64 << 10
	DefaultMaxSpan             = 16 << 20
	DefaultMaxRangesPerRequest = 16
	DefaultInitialBackoff      = 100 * time.Millisecond
	DefaultMaxBackoff          = 10 * time.Second
)

const (
	maxRedirects       = 5       // hops of a blob request's redirects
	drainLimit   int64 = 4 << 10 // bytes of an unread body read to keep its connection
)

// Config configures a [Client], and the [Resolver] of [NewResolver] (which takes only the
// fields about resolutions and retries). Its zero value is the defaults: a zero field means
// the default its documentation gives, and a negative one is an error.
type Config struct {
	// RegistriesConf is the registries.conf file and RegistriesConfDir its drop-in directory.
	// An empty path means containers/image's default search ($CONTAINERS_REGISTRIES_CONF,
	// else the first of ~/.config/containers/registries.conf, /etc/containers/registries.conf
	// and /usr/share/containers/registries.conf); an empty RegistriesConfDir means the default
	// drop-in directories (registries.conf.d next to those). A file named here must exist; a
	// drop-in directory need not. The default is both empty, as podman and CRI-O read them.
	RegistriesConf, RegistriesConfDir string
	// AuthFiles are auth files (containers-auth.json(5) or Docker config.json format, such as
	// the kubelet's /var/lib/kubelet/config.json) looked up, in order, after the files the
	// containers tools read. A file that does not exist is skipped; an empty path is an error.
	// The default is none.
	AuthFiles []string
	// Keychain holds the credentials received at run time, asked before any file. The default
	// is none.
	Keychain *MemoryKeychain
	// Transport is the transport below authentication, for registries, mirrors, token
	// servers and blob storage alike. For the endpoints registries.conf marks insecure, a copy
	// that does not verify TLS certificates is made when it is an *http.Transport; another
	// RoundTripper is used as is for them (plain http is still allowed). Hops of a redirect to
	// another host (blob storage, a CDN) go through it without the registry's credentials,
	// their dials checked when it is an *http.Transport (see the package documentation on
	// redirects). The default is a clone of http.DefaultTransport.
	Transport http.RoundTripper
	// Logger is where the Client, its resolver and its Blobs log (debug level: sources tried,
	// credentials found without secrets, retries and fallbacks with URLs without query
	// strings; warnings for failing credential helpers). The default discards.
	Logger *slog.Logger

	// Platform is the platform picked from image indexes; when set, it needs an OS and an
	// architecture. The default is the host's (runtime.GOOS, runtime.GOARCH, and GOARM's
	// variant on arm).
	Platform v1.Platform
	// TagTTL is how long a resolution by tag is reused before the tag is resolved again;
	// pulls by digest never change. The default is 5 minutes ([DefaultTagTTL]).
	TagTTL time.Duration

	// RequestTimeout bounds one attempt, redirects and reading the body included. The default
	// is 30 s.
	RequestTimeout time.Duration
	// StallTimeout is how long a registry may leave a request without an answer, or the body
	// being read without a byte, before the request is abandoned and retried on a fresh
	// connection (a transient failure). The default is 10 s ([DefaultStallTimeout]).
	StallTimeout time.Duration
	// MaxAttempts is how many times a request is tried in all before a transient failure is
	// returned, with the backoff of the package documentation, for blob reads as for the
	// manifests of a reference's last source. The default is 4.
	MaxAttempts int
	// ConcurrencyPerHost bounds the requests in flight to one registry host, over all Blobs
	// of the Client. The default is 8.
	ConcurrencyPerHost int
	// MaxGap is how far apart (in bytes) two ranges may be and still be fetched as one span,
	// the gap being downloaded and thrown away. The default is 64 KiB.
	MaxGap int64
	// MaxSpan is the largest span asked for as one range; longer spans are split. The default
	// is 16 MiB.
	MaxSpan int64
	// MaxRangesPerRequest is how many spans one multi-range request asks for; one disables
	// multi-range requests. The default is 16.
	MaxRangesPerRequest int

	// What only the package's tests change; zero means the default.

	manifestAttempts           int // tries of a reference's last source (default MaxAttempts)
	initialBackoff, maxBackoff time.Duration
	// sleep waits between attempts.
	sleep func(context.Context, time.Duration) error
	// now is the clock of the tag TTL and of Retry-After dates.
	now func() time.Time
	// limiter bounds the requests per host, instead of one of ConcurrencyPerHost.
	limiter *hostLimiter
	// storageTransport carries the hops to other hosts, instead of Transport; guardDials
	// made it.
	storageTransport http.RoundTripper
	// lookup resolves the hosts of a redirect's hops, to check them.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

// defaultStorageTransport is http.DefaultTransport with its dials checked for redirects.
var defaultStorageTransport = guardDials(http.DefaultTransport)

// options are a Config checked, with its defaults.
type options struct {
	storageRT        http.RoundTripper
	lookup           func(ctx context.Context, host string) ([]netip.Addr, error) // resolves redirect hosts
	platform         v1.Platform
	tagTTL           time.Duration
	maxGap           int64
	maxSpan          int64
	maxRanges        int
	maxAttempts      int
	manifestAttempts int
	timeout          time.Duration
	initialBackoff   time.Duration
	maxBackoff       time.Duration
	stall            time.Duration
	limiter          *hostLimiter
	sleep            func(context.Context, time.Duration) error
	now              func() time.Time
	log              *slog.Logger
}

// options checks c and fills in the defaults.
func (c Config) options() (options, error) {
	o := options{
		storageRT:      c.storageTransport,
		lookup:         c.lookup,
		platform:       hostPlatform(),
		tagTTL:         or(c.TagTTL, DefaultTagTTL),
		maxGap:         or(c.MaxGap, DefaultMaxGap),
		maxSpan:        or(c.MaxSpan, DefaultMaxSpan),
		maxRanges:      or(c.MaxRangesPerRequest, DefaultMaxRangesPerRequest),
		maxAttempts:    or(c.MaxAttempts, DefaultMaxAttempts),
		timeout:        or(c.RequestTimeout, DefaultRequestTimeout),
		initialBackoff: or(c.initialBackoff, DefaultInitialBackoff),
		maxBackoff:     or(c.maxBackoff, DefaultMaxBackoff),
		stall:          or(c.StallTimeout, DefaultStallTimeout),
		limiter:        c.limiter,
		sleep:          c.sleep,
		now:            c.now,
		log:            c.Logger,
	}
	o.manifestAttempts = or(c.manifestAttempts, o.maxAttempts)
	if o.lookup == nil {
		o.lookup = lookupAddrs
	}
	if o.sleep == nil {
		o.sleep = sleepContext
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.log == nil {
		o.log = discardLogger()
	}
	switch {
	case o.storageRT != nil:
	case c.Transport != nil:
		o.storageRT = guardDials(c.Transport)
	default:
		o.storageRT = defaultStorageTransport
	}
	if o.limiter == nil {
		o.limiter = newHostLimiter(c.ConcurrencyPerHost)
	}
	if c.Platform.OS != "" || c.Platform.Architecture != "" || c.Platform.Variant != "" {
		if c.Platform.OS == "" || c.Platform.Architecture == "" {
			return o, errors.New("platform needs an OS and an architecture")
		}
		o.platform = c.Platform
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"tag TTL", int64(c.TagTTL)},
		{"request timeout", int64(c.RequestTimeout)},
		{"stall timeout", int64(c.StallTimeout)},
		{"max attempts", int64(c.MaxAttempts)},
		{"manifest attempts", int64(c.manifestAttempts)},
		{"concurrency per host", int64(c.ConcurrencyPerHost)},
		{"max gap", c.MaxGap},
		{"max span", c.MaxSpan},
		{"max ranges per request", int64(c.MaxRangesPerRequest)},
	} {
		if f.v < 0 {
			return o, errors.New(f.name + " must not be negative")
		}
	}
	if o.initialBackoff <= 0 || o.maxBackoff < o.initialBackoff {
		return o, errors.New("backoff must be greater than zero and its cap not below it")
	}
	for _, p := range c.AuthFiles {
		if p == "" {
			return o, errors.New("auth file path must not be empty")
		}
	}
	return o, nil
}

// or returns v unless it is the zero value, then def.
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func sleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
