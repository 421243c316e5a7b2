package layer

import (
	"errors"
	"log/slog"
	"time"
)

// Defaults of the options.
const (
	DefaultResolveTimeout      = 30 * time.Second
	DefaultReadTimeout         = 60 * time.Second
	DefaultKeepTTL             = 10 * time.Minute
	DefaultNegativeTTL         = 3 * time.Second
	DefaultPrefetchConcurrency = 4
	DefaultPrefetchBatch       = 8 << 20
	DefaultPrefetchQuiet       = time.Second
	DefaultReadAhead           = 32 << 10
	DefaultOpenFiles           = 512
)

type options struct {
	log                 *slog.Logger
	now                 func() time.Time
	resolveTimeout      time.Duration
	readTimeout         time.Duration
	keepTTL             time.Duration
	negativeTTL         time.Duration
	prefetch            bool
	prefetchConcurrency int
	prefetchBatch       int64
	prefetchBandwidth   int64
	prefetchQuiet       time.Duration
	readAhead           int64
	openFiles           int
	requireDiffID       bool
	profileWindow       time.Duration
}

func defaultOptions() options {
	return options{
		log:                 slog.New(slog.DiscardHandler),
		now:                 time.Now,
		resolveTimeout:      DefaultResolveTimeout,
		readTimeout:         DefaultReadTimeout,
		keepTTL:             DefaultKeepTTL,
		negativeTTL:         DefaultNegativeTTL,
		prefetch:            true,
		prefetchConcurrency: DefaultPrefetchConcurrency,
		prefetchBatch:       DefaultPrefetchBatch,
		prefetchQuiet:       DefaultPrefetchQuiet,
		readAhead:           DefaultReadAhead,
		openFiles:           DefaultOpenFiles,
		profileWindow:       DefaultProfileWindow,
	}
}

// Option configures a [Manager].
type Option func(*options) error

// WithLogger sets where the manager logs: one info line per resolved layer (served lazily or
// why not), warnings for verification failures and failed background fetches. The default
// discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("nil logger")
		}
		o.log = l
		return nil
	}
}

// WithClock sets the clock used for the TTLs. The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) error { o.now = now; return nil }
}

// WithResolveTimeout bounds a resolution (manifest, TOC, verification): a lookup that takes
// longer fails, and the runtime sees EIO rather than a stalled pull. The default is 30 s.
func WithResolveTimeout(d time.Duration) Option {
	return positive(d, func(o *options) { o.resolveTimeout = d })
}

// WithReadTimeout bounds the fetch of the chunks one read needs. The default is 60 s.
func WithReadTimeout(d time.Duration) Option {
	return positive(d, func(o *options) { o.readTimeout = d })
}

// WithKeepTTL sets how long a resolved layer stays resolved after its last lookup when the
// runtime holds no reference to it. The default is 10 minutes.
func WithKeepTTL(d time.Duration) Option {
	return positive(d, func(o *options) { o.keepTTL = d })
}

// WithNegativeTTL sets how long a failed resolution is remembered; lookups in that time fail
// at once with the same error. The default is 3 s.
func WithNegativeTTL(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return errors.New("negative TTL below zero")
		}
		o.negativeTTL = d
		return nil
	}
}

// WithPrefetch turns background fetching of whole layers on or off. The default is on.
func WithPrefetch(on bool) Option {
	return func(o *options) error { o.prefetch = on; return nil }
}

// WithPrefetchConcurrency sets how many background range requests may be in flight at once,
// over all layers. The default is 4.
func WithPrefetchConcurrency(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return errors.New("prefetch concurrency must be at least 1")
		}
		o.prefetchConcurrency = n
		return nil
	}
}

// WithPrefetchBatch sets the compressed size of one background request. The default is 8 MiB.
func WithPrefetchBatch(bytes int64) Option {
	return func(o *options) error {
		if bytes < 64<<10 {
			return errors.New("prefetch batch must be at least 64 KiB")
		}
		o.prefetchBatch = bytes
		return nil
	}
}

// WithReadAhead sets how many compressed bytes past a cold read's last chunk the same
// request also fetches: the rest of the file and the files after it in the blob, which are
// often read next (a directory's files, a program's libraries). The default is 32 KiB: the
// reader waits for those bytes, and the cache stores each file they complete, while the
// benchmark's workloads read few of them (at 128 KiB a cold start took 2-20% longer, at both
// links, with the same number of requests), and without it a compiler's header files cost a
// round trip each (gcc: 71 requests instead of 53, 7-15% longer). Zero fetches only what
// reads ask for: no read-ahead, regions nor predictions.
func WithReadAhead(bytes int64) Option {
	return func(o *options) error {
		if bytes < 0 {
			return errors.New("negative read-ahead")
		}
		o.readAhead = bytes
		return nil
	}
}

// WithPrefetchQuiet sets how long background requests wait after the last sign of a
// runtime using the layers (a layer looked up, a read fetching on demand starting or ending)
// before going out, so that they do not queue on the link ahead of a starting container's
// reads. eStargz's prioritized files are fetched at once regardless. The default is 1 s; zero
// makes background requests wait only while a read is fetching.
func WithPrefetchQuiet(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return errors.New("negative prefetch quiet period")
		}
		o.prefetchQuiet = d
		return nil
	}
}

// WithPrefetchBandwidth bounds background fetching to bytes per second over all layers. Zero,
// the default, means no bound.
func WithPrefetchBandwidth(bytes int64) Option {
	return func(o *options) error {
		if bytes < 0 {
			return errors.New("negative bandwidth")
		}
		o.prefetchBandwidth = bytes
		return nil
	}
}

// WithOpenFiles sets how many cache files the manager keeps open between reads. The
// default is 512.
func WithOpenFiles(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return errors.New("open files must be at least 1")
		}
		o.openFiles = n
		return nil
	}
}

// WithRequireDiffID refuses, as not lazily pullable, layers whose format cannot prove that
// their tree is the DiffID's tar (everything but zstd:chunked with a tar-split): the runtime
// then pulls them normally. The default accepts every verified format.
func WithRequireDiffID(on bool) Option {
	return func(o *options) error { o.requireDiffID = on; return nil }
}

// WithProfileWindow sets how long after a layer's first read the files read are recorded
// into its repositories' startup profiles (see the package documentation). The default is
// DefaultProfileWindow (30 s); zero records nothing (profiles already stored are still
// replayed).
func WithProfileWindow(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return errors.New("negative profile window")
		}
		o.profileWindow = d
		return nil
	}
}

func positive(d time.Duration, set func(*options)) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("duration must be positive")
		}
		set(o)
		return nil
	}
}
