package layer

import (
	"context"
	"errors"
	iofs "io/fs"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/internal/metrics"
)

// env is what the layers of one manager share, and all a layer knows of its manager: where
// content is kept, how the registry is shared, what is counted, the settings of reads, the
// lifetime of background work, and the manager's live layers (live: a layer reads them).
// A layer never sees the manager's resolutions, nor reaches the registry through it: a layer
// holds its own blob (a layer restored from its record, the registry, reference and descriptor
// to reach it: registryBlob).
type env struct {
	cache    *cache.Cache
	files    *handles   // the open cache files
	sched    *scheduler // the registry and the processors, shared with background work
	counters *counters
	life     *lifetime    // the manager's lifetime: its context, and the work Close waits for
	records  *records     // the layer records in the cache
	profiles profileStore // the repositories' startup profiles in the cache (package profile)
	refusals *refusals    // the identities refused: TOC and tar-split disagree (layer.go)

	release release // hands freed heap back to the kernel (releaseMemory)

	log         *slog.Logger
	now         func() time.Time
	readTimeout time.Duration // bounds each fetch (Config.ReadTimeout)
	negativeTTL time.Duration // how long a failed fetch is remembered (Config.NegativeTTL)
	readAhead   int64         // the read-ahead window (options.readAhead)
	regions     chan struct{} // a slot per region fetch in flight (regionSlots)
	predicting  chan struct{} // a slot per prediction running (predictSlots; predict.go)
	// live is the manager's live layers, where a prediction finds the rest of its image
	// (liveSet.siblings); nil in tests that make layers without a manager.
	live  *liveSet
	batch int64 // the compressed bytes of a background request (Config.PrefetchBatch)

	// The recording of startup profiles: its window (options.profileWindow; zero: none) and
	// the bounds that end it early (profile.MaxFiles, profile.MaxContent; tests lower them).
	profileWindow     time.Duration
	profileMaxFiles   int
	profileMaxContent int64
}

// releaseInterval is the least time between two releases of memory: a release collects the
// whole heap.
const releaseInterval = time.Second

// release is the state of releaseMemory. Its lock is a leaf.
type release struct {
	free func() // debug.FreeOSMemory when nil (tests count calls)

	mu      sync.Mutex
	last    time.Time   // when the last release began
	pending *time.Timer // a release scheduled for the end of the interval; nil if none
}

// releaseMemory hands the heap that transient work left free (a resolution's TOC and parse,
// the tar-split comparison, a record's data, a background fetch's buffers) back to the kernel
// at once rather than over minutes, so that the daemon's resident memory is what it holds:
// called when such work ends. Releases are at least releaseInterval apart: a call within the
// interval schedules one for its end (one at most), so that the last of several jobs ending
// close together is released too.
func (e *env) releaseMemory() {
	r := &e.release
	r.mu.Lock()
	if r.pending != nil {
		r.mu.Unlock() // the scheduled release will collect this job's garbage too
		return
	}
	now := time.Now()
	if wait := r.last.Add(releaseInterval).Sub(now); wait > 0 {
		r.pending = time.AfterFunc(wait, func() {
			r.mu.Lock()
			r.pending, r.last = nil, time.Now()
			r.mu.Unlock()
			r.run()
		})
		r.mu.Unlock()
		return
	}
	r.last = now
	r.mu.Unlock()
	r.run()
}

func (r *release) run() {
	if r.free != nil {
		r.free()
		return
	}
	debug.FreeOSMemory()
}

type counters struct {
	lookups, resolutions, notLazy, failures atomic.Int64
	verifyFailures                          atomic.Int64
	onDemandBytes, prefetchBytes            atomic.Int64
	profileBytes                            atomic.Int64 // fetched by profile replays (not in prefetchBytes)
	fromRecords                             atomic.Int64

	// lookupTime: the lookups' durations by outcome and by what answered; readWait: how long
	// reads waited for the registry (fetchMissing).
	lookupTime [numOutcomes][numSources]*metrics.Histogram
	readWait   *metrics.Histogram
}

func newCounters() *counters {
	c := &counters{readWait: metrics.NewHistogram(metrics.DefaultBuckets)}
	for o := range c.lookupTime {
		for s := range c.lookupTime[o] {
			c.lookupTime[o][s] = metrics.NewHistogram(metrics.DefaultBuckets)
		}
	}
	return c
}

// lookupOutcome is how a lookup ended, a label of its duration.
type lookupOutcome int

const (
	outcomeServed  lookupOutcome = iota // the layer is served lazily
	outcomeNotLazy                      // ENOENT: the runtime pulls the layer normally
	outcomeFailed                       // an error (registry, verification, timeout): EIO
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"served", "not_lazy", "failed"}

// lookupSource is what answered a lookup, a label of its duration.
type lookupSource int

const (
	sourceMemory   lookupSource = iota // a resolution (or a failure) the manager remembered
	sourceRecord                       // the layer's record, without the registry
	sourceRegistry                     // the registry
	numSources
)

var sourceNames = [numSources]string{"memory", "record", "registry"}

// observeLookup counts a lookup that began at start.
func (c *counters) observeLookup(start time.Time, src lookupSource, err error) {
	o := outcomeServed
	switch {
	case errors.Is(err, iofs.ErrNotExist):
		o = outcomeNotLazy
	case err != nil:
		o = outcomeFailed
	}
	c.lookupTime[o][src].Since(start)
}

// lifetime is the lifetime of a manager's background lifetime: one context, cancelled when Close
// begins, from which every fetch, resolution and background fetch derives; and the lifetime of
// reads that goes on after them (storing fetched chunks, fetch-ahead, blob copies), which
// Close waits for. Its lock is a leaf.
type lifetime struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	closing bool
	tracked sync.WaitGroup
}

func newLifetime() *lifetime {
	w := &lifetime{}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w
}

// bound returns a context for work that must not end with the caller's request (others may
// be waiting for the same result) but must end with the manager, after d.
func (w *lifetime) bound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	stop := context.AfterFunc(w.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// goTracked runs fn in the background, and close waits for it; once the manager is closing,
// it runs fn at once (fn sees a cancelled context and ends quickly).
func (w *lifetime) goTracked(fn func()) {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		fn()
		return
	}
	w.tracked.Add(1) // under w.mu, before close can wait
	w.mu.Unlock()
	go func() {
		defer w.tracked.Done()
		fn()
	}()
}

// stop cancels the context: every fetch ends.
func (w *lifetime) stop() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	w.cancel()
}

// wait returns once the tracked work has ended.
func (w *lifetime) wait() { w.tracked.Wait() }

// liveSet is the manager's live layers, by identity: the manager makes layers live and forgets
// them, and its layers read it to find their siblings, so that a layer needs nothing of the
// manager itself. Its lock is a leaf: the manager takes it under Manager.mu.
type liveSet struct {
	mu     sync.Mutex
	layers map[identity]*Served
}

func newLiveSet() *liveSet { return &liveSet{layers: map[identity]*Served{}} }

// get returns the live layer of an identity, or nil.
func (s *liveSet) get(id identity) *Served {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.layers[id]
}

// add makes l the live layer of its identity, unless one is live already: that one is
// returned, and l is not added.
func (s *liveSet) add(l *Served) (existing *Served) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if existing = s.layers[l.id]; existing == nil {
		s.layers[l.id] = l
	}
	return existing
}

// all returns the live layers, in no order.
func (s *liveSet) all() []*Served {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Served, 0, len(s.layers))
	for _, l := range s.layers {
		out = append(out, l)
	}
	return out
}

// retain forgets the live layers keep refuses, and returns them and those kept.
func (s *liveSet) retain(keep func(*Served) bool) (gone, kept []*Served) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, l := range s.layers {
		if !keep(l) {
			delete(s.layers, id)
			gone = append(gone, l)
			continue
		}
		kept = append(kept, l)
	}
	return gone, kept
}

// siblings returns the live layers other than l resolved through a reference l was resolved
// through (the rest of its image), where a prediction looks for the files it names: in digest
// order, at most maxSiblings. It takes no layer's lock while it holds its own.
func (s *liveSet) siblings(l *Served) []*Served {
	live := s.all()
	refs := l.references()
	var out []*Served
	for _, o := range live {
		if o != l && slices.ContainsFunc(o.references(), func(r string) bool { return slices.Contains(refs, r) }) {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *Served) int { return strings.Compare(string(a.desc.Digest), string(b.desc.Digest)) })
	return out[:min(len(out), maxSiblings)]
}

// maxSiblings bounds the layers a prediction looks in besides its own.
const maxSiblings = 128
