package cache

import (
	"errors"
	"log/slog"
)

// DefaultMaxSize is the size bound of a Config that sets none: 10 GiB.
const DefaultMaxSize int64 = 10 << 30

// Config configures a [Cache]. Its zero value is the defaults.
type Config struct {
	// MaxSize is the number of content bytes above which the cache evicts least-recently used
	// files and records that are neither open nor pinned; it must not be negative. The
	// default is [DefaultMaxSize] (10 GiB). Content held open is never evicted, so the cache
	// can exceed the bound while it is in use; pinned content is outside the bound (see
	// [Cache.Pin]).
	MaxSize int64
	// Logger is where the cache reports what it repairs on its own (damaged journals, stray
	// temporary files, failed removals). The default discards everything.
	Logger *slog.Logger
}

// options are a Config checked, with its defaults.
type options struct {
	maxSize int64
	logger  *slog.Logger
}

func (c Config) options() (options, error) {
	o := options{maxSize: c.MaxSize, logger: c.Logger}
	if o.maxSize < 0 {
		return o, errors.New("cache: max size must not be negative")
	}
	if o.maxSize == 0 {
		o.maxSize = DefaultMaxSize
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}
