package fetcher

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"time"
)

// Defaults, documented on the options that change them.
const (
	DefaultMaxGap                    = 64 << 10
	DefaultMaxSpan                   = 16 << 20
	DefaultMaxRangesPerRequest       = 16
	DefaultMaxAttempts               = 4
	DefaultRequestTimeout            = 30 * time.Second
	DefaultInitialBackoff            = 100 * time.Millisecond
	DefaultMaxBackoff                = 10 * time.Second
	DefaultConcurrencyPerHost        = 8
	maxRedirects                     = 5
	drainLimit                 int64 = 4 << 10
)

// defaultLimiter is shared by every Blob not given its own, so that the per-host bound holds
// across all blobs of a process.
var defaultLimiter = NewHostLimiter(DefaultConcurrencyPerHost)

// Option configures [New].
type Option func(*options) error

type options struct {
	storageRT      http.RoundTripper
	lookup         func(ctx context.Context, host string) ([]netip.Addr, error) // resolves redirect hosts
	maxGap         int64
	maxSpan        int64
	maxRanges      int
	maxAttempts    int
	timeout        time.Duration
	initialBackoff time.Duration
	maxBackoff     time.Duration
	stall          time.Duration // see WithStallTimeout
	limiter        *HostLimiter
	sleep          func(context.Context, time.Duration) error
	now            func() time.Time
	log            *slog.Logger
}

func defaultOptions() options {
	return options{
		storageRT:      defaultStorageTransport,
		lookup:         lookupAddrs,
		maxGap:         DefaultMaxGap,
		maxSpan:        DefaultMaxSpan,
		maxRanges:      DefaultMaxRangesPerRequest,
		maxAttempts:    DefaultMaxAttempts,
		timeout:        DefaultRequestTimeout,
		initialBackoff: DefaultInitialBackoff,
		maxBackoff:     DefaultMaxBackoff,
		stall:          DefaultStallTimeout,
		limiter:        defaultLimiter,
		sleep:          sleepContext,
		now:            time.Now,
		log:            discardLogger(),
	}
}

// WithStorageTransport sets the transport used for hops of a redirect to a host other than the
// registry's (blob storage, CDN). It must not add the registry's credentials. When it is an
// *http.Transport, a copy of it is used whose dials check the address dialed (see the package
// documentation on redirects). The default is such a copy of http.DefaultTransport.
func WithStorageTransport(rt http.RoundTripper) Option {
	guarded := guardDials(rt)
	return func(o *options) error {
		if rt == nil {
			return errors.New("storage transport must not be nil")
		}
		o.storageRT = guarded
		return nil
	}
}

// defaultStorageTransport is http.DefaultTransport with its dials checked for redirects.
var defaultStorageTransport = guardDials(http.DefaultTransport)

// WithMaxGap sets how far apart (in bytes) two ranges may be and still be fetched as one span,
// the gap being downloaded and thrown away. Zero merges only adjacent or overlapping ranges.
// The default is 64 KiB.
func WithMaxGap(n int64) Option {
	return func(o *options) error {
		if n < 0 {
			return errors.New("max gap must not be negative")
		}
		o.maxGap = n
		return nil
	}
}

// WithMaxSpan sets the largest span asked for as one range; longer spans are split. The default
// is 16 MiB.
func WithMaxSpan(n int64) Option {
	return func(o *options) error {
		if n <= 0 {
			return errors.New("max span must be greater than zero")
		}
		o.maxSpan = n
		return nil
	}
}

// WithMaxRangesPerRequest sets how many spans one multi-range request asks for. One disables
// multi-range requests. The default is 16.
func WithMaxRangesPerRequest(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return errors.New("max ranges per request must be greater than zero")
		}
		o.maxRanges = n
		return nil
	}
}

// WithMaxAttempts sets how many times a request is tried in all before a transient failure is
// returned. The default is 4.
func WithMaxAttempts(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return errors.New("max attempts must be greater than zero")
		}
		o.maxAttempts = n
		return nil
	}
}

// WithRequestTimeout bounds one attempt, redirects and reading the body included. The default
// is 30 s.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("request timeout must be greater than zero")
		}
		o.timeout = d
		return nil
	}
}

// WithStallTimeout sets how long a registry may leave a request without an answer, or the
// body being read without a byte, before the request is abandoned and retried on a fresh
// connection (a transient failure); 0 waits for the request timeout. The default is 10 s.
func WithStallTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return errors.New("stall timeout must not be negative")
		}
		o.stall = d
		return nil
	}
}

// WithBackoff sets the delay before the first retry and the cap of the delays, which double
// after each failed attempt and are jittered down by up to half. The cap also bounds a
// server's Retry-After. The defaults are 100 ms and 10 s.
func WithBackoff(initial, limit time.Duration) Option {
	return func(o *options) error {
		if initial <= 0 || limit < initial {
			return errors.New("backoff must be greater than zero and its cap not below it")
		}
		o.initialBackoff, o.maxBackoff = initial, limit
		return nil
	}
}

// WithHostLimiter sets the limiter bounding concurrent requests per registry host. Share one
// limiter between all Blobs that should be bounded together. The default is a process-wide
// limiter allowing 8 requests per host.
func WithHostLimiter(l *HostLimiter) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("host limiter must not be nil")
		}
		o.limiter = l
		return nil
	}
}

// WithSleep replaces the function that waits between attempts (tests use it to avoid real
// sleeps). It must return early with the context's error when the context is done. The
// default waits on a timer.
func WithSleep(sleep func(context.Context, time.Duration) error) Option {
	return func(o *options) error {
		if sleep == nil {
			return errors.New("sleep must not be nil")
		}
		o.sleep = sleep
		return nil
	}
}

// WithClock sets the clock used to interpret Retry-After dates. The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		if now == nil {
			return errors.New("clock must not be nil")
		}
		o.now = now
		return nil
	}
}

// WithLogger sets where retries and fallbacks are logged (debug level, URLs without query
// strings). The default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("logger must not be nil")
		}
		o.log = l
		return nil
	}
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
