package runtimestore

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Config is what a Recorder records for; its zero values are the defaults.
type Config struct {
	// Store is the store's mountpoint: only layers whose additionallayer file names a layer
	// directory under it are recorded.
	Store string
	// Graphroots are the runtimes' storage roots to record into.
	Graphroots []string
	// LockWait bounds each wait for a runtime's layers lock (default 30 s); a pass that
	// could not take it is tried again at the next.
	LockWait time.Duration
	// Interval is the time between passes when nothing pokes the Recorder (default 1 min).
	Interval time.Duration
	// Settle is how long a pass waits after a poke (default 200 ms): the runtime that just
	// took a layer is still saving its storage.
	Settle time.Duration
	// InfoTimeout bounds the read of one layer's info through the store (default 30 s).
	InfoTimeout time.Duration
	// SizeWait is how long a pass after a poke leaves a layer whose tar size the store does
	// not know yet (a zstd:chunked layer's tar-split is compared seconds after its lookup) for
	// a later pass, so that its entry has the size the runtime reports for the image (default
	// 10 s; then it is recorded without). The first pass, at the daemon's start, waits for none.
	SizeWait time.Duration
	Logger   *slog.Logger
}

// Recorder records, into runtimes' layers.json, the layers they took from the store and did
// not record (see the package doc).
type Recorder struct {
	cfg  Config
	poke chan struct{}

	mu     sync.Mutex
	stats  Stats
	warned map[string]bool      // the warnings about layers given once
	seen   map[string]time.Time // when a layer without a size was first held back
}

// Stats is what a Recorder did, for status and metrics.
type Stats struct {
	Graphroots []string `json:"graphroots"`
	// Recorded counts the layer entries added to runtimes' layers.json.
	Recorded int64 `json:"recorded"`
	// Failures counts passes over a graphroot that ended in an error; LastError is the last.
	Failures  int64  `json:"failures"`
	LastError string `json:"lastError,omitempty"`
}

// New returns a Recorder for cfg; Run does its work.
func New(cfg Config) *Recorder {
	cfg.Store = filepath.Clean(cfg.Store)
	cfg.LockWait = orDuration(cfg.LockWait, 30*time.Second)
	cfg.Interval = orDuration(cfg.Interval, time.Minute)
	cfg.Settle = orDuration(cfg.Settle, 200*time.Millisecond)
	cfg.InfoTimeout = orDuration(cfg.InfoTimeout, 30*time.Second)
	cfg.SizeWait = orDuration(cfg.SizeWait, 10*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Recorder{cfg: cfg, poke: make(chan struct{}, 1), stats: Stats{Graphroots: slices.Clone(cfg.Graphroots)},
		warned: map[string]bool{}, seen: map[string]time.Time{}}
}

func orDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Poke asks for a pass soon: a runtime just took a layer from the store. It never blocks.
func (r *Recorder) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Run makes a pass after each poke (once the runtime settled) and every Interval, until ctx
// is done. A pass that left layers for later (not ready, held for their size, the runtime's
// lock not taken) is followed by another one second later, then two, four..., up to Interval.
func (r *Recorder) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	var backoff time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.poke:
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.cfg.Settle):
			}
		}
		if r.pass(ctx, true) == 0 {
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, time.Second), r.cfg.Interval)
		time.AfterFunc(backoff, r.Poke)
	}
}

// Sync makes one pass over every graphroot, recording every layer found (none is held back for
// its size).
func (r *Recorder) Sync(ctx context.Context) { r.pass(ctx, false) }

// pass makes one pass over every graphroot; with hold, layers whose size is not known yet are
// left for a later pass for up to SizeWait. It returns how many layers, and graphroots that
// failed, it left for a later pass.
func (r *Recorder) pass(ctx context.Context, hold bool) (pending int) {
	for _, root := range r.cfg.Graphroots {
		ids, n, err := r.syncOne(ctx, root, hold)
		pending += n
		if err != nil {
			pending++
		}
		r.mu.Lock()
		r.stats.Recorded += int64(len(ids))
		if err != nil {
			r.stats.Failures++
			r.stats.LastError = err.Error()
		}
		r.mu.Unlock()
		if err != nil {
			r.cfg.Logger.Warn("recording the runtime's layers taken from the store", "graphroot", root, "err", err)
		}
		if len(ids) > 0 {
			r.cfg.Logger.Info("recorded layers the runtime took from the store in its layers.json (its containers/storage does not)",
				"graphroot", root, "layers", ids)
		}
	}
	return pending
}

func (r *Recorder) syncOne(ctx context.Context, root string, hold bool) ([]string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.InfoTimeout+r.cfg.LockWait)
	defer cancel()
	opts := recordOpts{lockWait: r.cfg.LockWait, warn: r.warnOnce}
	if hold {
		opts.hold = r.holdForSize
	}
	ids, pending, err := record(ctx, root, r.cfg.Store, opts)
	r.mu.Lock()
	for _, id := range ids {
		delete(r.seen, root+"\x00"+id)
	}
	r.mu.Unlock()
	return ids, pending, err
}

// holdForSize says whether a layer without a size is left for a later pass: for SizeWait from
// the first pass that met it.
func (r *Recorder) holdForSize(root, id string) bool {
	key := root + "\x00" + id
	r.mu.Lock()
	defer r.mu.Unlock()
	first, ok := r.seen[key]
	if !ok {
		if len(r.seen) >= 4096 {
			return false // bounded: record at once
		}
		r.seen[key] = time.Now()
		return true
	}
	if time.Since(first) < r.cfg.SizeWait {
		return true
	}
	delete(r.seen, key)
	return false
}

// warnOnce logs a warning about a layer once: a pass every minute would repeat it.
func (r *Recorder) warnOnce(msg string, args ...any) {
	key := fmt.Sprint(append([]any{msg}, args...)...)
	r.mu.Lock()
	seen := r.warned[key]
	if !seen && len(r.warned) < 4096 {
		r.warned[key] = true
	}
	r.mu.Unlock()
	if !seen {
		r.cfg.Logger.Warn(msg, args...)
	}
}

// Stats returns what the Recorder did so far.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Graphroots = slices.Clone(s.Graphroots)
	return s
}
