package layer

import (
	"errors"
	"log/slog"
	"time"
)

// Defaults of the fields of [Config].
const (
	DefaultResolveTimeout      = 30 * time.Second
	DefaultReadTimeout         = 60 * time.Second
	DefaultKeepTTL             = 10 * time.Minute
	DefaultNegativeTTL         = 3 * time.Second
	DefaultPrefetchConcurrency = 4
	DefaultPrefetchBatch       = 8 << 20
	DefaultPrefetchQuiet       = time.Second
)

// Config configures a [Manager]. Its zero value is the defaults: a zero field means the
// default its documentation gives, and a negative one is an error.
type Config struct {
	// Logger is where the manager logs: one info line per resolved layer (served lazily or
	// why not), warnings for verification failures and failed background fetches. The
	// default discards everything.
	Logger *slog.Logger
	// ResolveTimeout bounds a resolution (manifest, TOC, verification): a lookup that takes
	// longer fails, and the runtime sees EIO rather than a stalled pull. The default is 30 s.
	ResolveTimeout time.Duration
	// ReadTimeout bounds the fetch of the chunks one read needs. The default is 60 s.
	ReadTimeout time.Duration
	// KeepTTL is how long a resolved layer stays resolved after its last lookup when the
	// runtime holds no reference to it. The default is 10 minutes.
	KeepTTL time.Duration
	// NegativeTTL is how long a failed resolution is remembered; lookups in that time fail at
	// once with the same error. The default is 3 s.
	NegativeTTL time.Duration
	// NoPrefetch turns off the background fetching of whole layers, on by default.
	NoPrefetch bool
	// PrefetchConcurrency is how many background range requests may be in flight at once,
	// over all layers. The default is 4.
	PrefetchConcurrency int
	// PrefetchBatch is the compressed size of one background request, at least 64 KiB. The
	// default is 8 MiB. A request also holds at most 4 MiB of decompressed content (or one
	// chunk, when larger) and 1024 chunks, whatever this is.
	PrefetchBatch int64
	// PrefetchBandwidth bounds background fetching to bytes per second over all layers. The
	// default, zero, is no bound.
	PrefetchBandwidth int64
	// PrefetchQuiet is how long background requests wait after the last sign of a runtime
	// using the layers (a layer looked up, a read fetching on demand starting or ending)
	// before going out, so that they do not queue on the link ahead of a starting container's
	// reads. eStargz's prioritized files are fetched at once regardless. Nil means the
	// default, 1 s; zero makes background requests wait only while a read is fetching.
	PrefetchQuiet *time.Duration
	// RequireDiffID refuses, as not lazily pullable, layers whose format cannot prove that
	// their tree is the DiffID's tar (everything but zstd:chunked with a tar-split): the
	// runtime then pulls them normally. The default accepts every verified format.
	RequireDiffID bool
}

// options are a Config checked, with its defaults, and what only tests change.
type options struct {
	log                 *slog.Logger
	now                 func() time.Time // the clock of the TTLs
	resolveTimeout      time.Duration
	readTimeout         time.Duration
	keepTTL             time.Duration
	negativeTTL         time.Duration
	prefetch            bool
	prefetchConcurrency int
	prefetchBatch       int64
	prefetchBandwidth   int64
	prefetchQuiet       time.Duration
	// readAhead is how many compressed bytes past a cold read's last chunk the same request
	// also fetches: the rest of the file and the files after it in the blob, which are often
	// read next (a directory's files, a program's libraries). The default is 32 KiB: the
	// reader waits for those bytes, and the cache stores each file they complete, while the
	// benchmark's workloads read few of them (more made cold starts longer at both links), and
	// without it a compiler's header files cost a round trip each. Zero fetches
	// only what reads ask for: no read-ahead, regions nor predictions.
	readAhead int64
	// openFiles is how many cache files the manager keeps open between reads.
	openFiles     int
	requireDiffID bool
	// profileWindow is how long after a layer's first read the files read are recorded into
	// its repositories' startup profiles (see the package documentation); zero records
	// nothing (profiles already stored are still replayed).
	profileWindow time.Duration
}

// Defaults of what only tests change.
const (
	defaultReadAhead     = 32 << 10
	defaultOpenFiles     = 512
	defaultProfileWindow = 30 * time.Second
)

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
		readAhead:           defaultReadAhead,
		openFiles:           defaultOpenFiles,
		profileWindow:       defaultProfileWindow,
	}
}

// options checks c and fills in the defaults.
func (c Config) options() (options, error) {
	o := defaultOptions()
	if c.Logger != nil {
		o.log = c.Logger
	}
	for _, f := range []struct {
		name string
		v    int64
		set  *int64
	}{
		{"resolve timeout", int64(c.ResolveTimeout), (*int64)(&o.resolveTimeout)},
		{"read timeout", int64(c.ReadTimeout), (*int64)(&o.readTimeout)},
		{"keep TTL", int64(c.KeepTTL), (*int64)(&o.keepTTL)},
		{"negative TTL", int64(c.NegativeTTL), (*int64)(&o.negativeTTL)},
		{"prefetch batch", c.PrefetchBatch, &o.prefetchBatch},
		{"prefetch bandwidth", c.PrefetchBandwidth, &o.prefetchBandwidth},
	} {
		if f.v < 0 {
			return o, errors.New(f.name + " must not be negative")
		}
		if f.v > 0 {
			*f.set = f.v
		}
	}
	if o.prefetchBatch < 64<<10 {
		return o, errors.New("prefetch batch must be at least 64 KiB")
	}
	if c.PrefetchConcurrency < 0 {
		return o, errors.New("prefetch concurrency must not be negative")
	}
	if c.PrefetchConcurrency > 0 {
		o.prefetchConcurrency = c.PrefetchConcurrency
	}
	if q := c.PrefetchQuiet; q != nil {
		if *q < 0 {
			return o, errors.New("prefetch quiet period must not be negative")
		}
		o.prefetchQuiet = *q
	}
	o.prefetch = !c.NoPrefetch
	o.requireDiffID = c.RequireDiffID
	return o, nil
}
