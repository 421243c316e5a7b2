package cache

import (
	"errors"
	"log/slog"
)

// DefaultMaxSize is the size bound used when [WithMaxSize] is not given: 10 GiB.
const DefaultMaxSize int64 = 10 << 30

// Option configures a [Cache].
type Option func(*options) error

type options struct {
	maxSize int64
	logger  *slog.Logger
}

func defaultOptions() options {
	return options{
		maxSize: DefaultMaxSize,
		logger:  slog.New(slog.DiscardHandler),
	}
}

// WithMaxSize sets the number of content bytes above which the cache evicts least-recently
// used files and records that are neither open nor pinned. The default is [DefaultMaxSize]
// (10 GiB). Content held open is never evicted, so the cache can exceed the bound while it is
// in use; pinned content is outside the bound (see [Cache.Pin]).
func WithMaxSize(bytes int64) Option {
	return func(o *options) error {
		if bytes <= 0 {
			return errors.New("cache: max size must be greater than zero")
		}
		o.maxSize = bytes
		return nil
	}
}

// WithLogger sets where the cache reports what it repairs on its own (damaged journals,
// stray temporary files, failed removals). The default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("cache: nil logger")
		}
		o.logger = l
		return nil
	}
}
