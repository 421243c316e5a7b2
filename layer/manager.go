package layer

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"slices"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker/reference"
	"golang.org/x/sync/singleflight"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/layer/profile"
	"github.com/layerstore/layerstore/verify"
)

// Registry is what the manager needs from the registries: package fetcher's Client, through
// [ClientRegistry].
type Registry interface {
	Resolve(ctx context.Context, ref string) (*fetcher.Image, error)
	Platforms(ctx context.Context, img *fetcher.Image) ([]*fetcher.Manifest, error)
	Blob(ctx context.Context, img *fetcher.Image, l *fetcher.ImageLayer) (RemoteBlob, error)
}

// RemoteBlob is what a layer needs of its blob in the registry: package fetcher's Blob, read
// through verify (Verifier.ReadChunks), which reads several ranges in one request set. Both
// methods fill their buffers completely or fail; concurrent calls must be safe. A blob that is
// also a verify.StreamSource (fetcher's is) has each chunk verified as its bytes arrive.
type RemoteBlob interface {
	verify.RangeSource
}

// ClientRegistry returns c as a [Registry].
func ClientRegistry(c *fetcher.Client) Registry { return clientRegistry{c} }

type clientRegistry struct{ *fetcher.Client }

func (r clientRegistry) Blob(ctx context.Context, img *fetcher.Image, l *fetcher.ImageLayer) (RemoteBlob, error) {
	b, err := r.Client.Blob(ctx, img, l)
	if err != nil {
		return nil, err // not a nil *fetcher.Blob in a non-nil Blob
	}
	return b, nil
}

// Manager resolves and serves layers: it is the store the FUSE namespace (package storefs)
// serves, whose Store interface it meets but for Lookup's result, a *Served where the namespace
// takes its storefs.Layer (the daemon converts it). It is safe for concurrent use.
type Manager struct {
	env  // shared with its layers
	reg  Registry
	opts options

	group singleflight.Group

	mu       sync.Mutex
	resolved map[layerKey]*resolution
	starts   map[string]*imageStart // images whose program is to be predicted, by reference (start.go)
	closed   bool

	// resolving bounds the resolutions in flight (manifests, TOCs, verification), whoever
	// asks: a burst of lookups of distinct layers queues here instead of taking every core.
	resolving chan struct{}

	stop chan struct{}
	done sync.WaitGroup // the janitor

	pinErrs pinErrors // why resumed pins are not complete (pinresume.go)
}

// maxResolutions bounds the resolutions in flight at once. c/image pulls up to 6 layers of an
// image at a time; a node pulling a few images at once stays below it.
const maxResolutions = 16

// identity is what a live layer is shared by: everything the requesting manifest says of it
// that verification depends on (the format, blob digest and size, the TOC digest and where
// the TOC and tar-split are, the tar-split checksum) and the DiffID its config claims. A blob
// digest alone is never an identity: the blob is not hashed whole, so a manifest naming
// another layer's blob digest with its own TOC gets a layer of its own, verified against its
// own TOC, and never the other one's.
type identity struct {
	layout chunked.Layout
	diffID digest.Digest
}

type layerKey struct {
	ref string
	key digest.Digest
}

// resolution is the outcome of resolving one (reference, key).
type resolution struct {
	layer   *Served // nil on failure
	err     error
	users   int       // runtime references taken through this key (use) and not released
	expires time.Time // when an unused success or a failure is forgotten
}

// New returns a manager resolving layers through reg and keeping their content in c,
// configured by cfg (see [Config]).
func New(reg Registry, c *cache.Cache, cfg Config) (*Manager, error) {
	o, err := cfg.options()
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return newManager(reg, c, o), nil
}

// newManager returns a manager with the options o.
func newManager(reg Registry, c *cache.Cache, o options) *Manager {
	m := &Manager{
		env: env{
			cache:       c,
			files:       newHandles(c, o.openFiles),
			sched:       newScheduler(o.prefetchConcurrency, o.prefetchBandwidth, o.prefetchQuiet),
			counters:    newCounters(),
			live:        newLiveSet(),
			life:        newLifetime(),
			records:     loadRecords(c, chunked.Limits{}.WithDefaults(), o.log),
			profiles:    profile.NewStore(c, o.log),
			refusals:    &refusals{},
			log:         o.log,
			now:         o.now,
			readTimeout: o.readTimeout,
			negativeTTL: o.negativeTTL,
			readAhead:   o.readAhead,
			regions:     make(chan struct{}, regionSlots),
			predicting:  make(chan struct{}, predictSlots),
			batch:       o.prefetchBatch,

			profileWindow:     o.profileWindow,
			profileMaxFiles:   profile.MaxFiles,
			profileMaxContent: profile.MaxContent,
		},
		reg:       reg,
		opts:      o,
		resolved:  map[layerKey]*resolution{},
		starts:    map[string]*imageStart{},
		resolving: make(chan struct{}, maxResolutions),
		stop:      make(chan struct{}),
	}
	m.done.Add(1)
	go m.janitor()
	m.resumePins()
	return m
}

// Close stops background work and releases the cache files the manager holds. Layers already
// handed out keep answering reads.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	layers := m.live.all() // none is added once closed
	m.mu.Unlock()
	for _, l := range layers {
		l.endRecording() // a daemon stopped within a recording's window keeps what it recorded
	}
	m.life.stop()
	close(m.stop)
	for _, l := range layers {
		l.stopPrefetch()
	}
	m.done.Wait()
	for _, l := range layers {
		l.wait()
	}
	m.life.wait()
	for _, l := range layers {
		l.dropBlobCopy(time.Time{})
	}
	m.files.closeAll()
	return nil
}

// Lookup returns the layer key names in the image ref, resolving it if needed. Layers that are
// not served lazily give an error wrapping io/fs.ErrNotExist.
func (m *Manager) Lookup(ctx context.Context, ref string, key digest.Digest) (l *Served, err error) {
	start := time.Now()
	m.counters.lookups.Add(1)
	src := sourceMemory
	defer func() { m.counters.observeLookup(start, src, err) }()
	l, src, err = m.resolveShared(ctx, ref, key, false)
	if err != nil {
		return nil, err
	}
	if m.opts.prefetch {
		l.startPrefetch() // once: a layer resolved ahead waits for its first lookup
	}
	l.looked.Store(true)
	m.predictStart(ref)
	return l, nil
}

// resolveShared returns the resolution of (ref, key): remembered, or shared with the
// resolutions of the same pair under way, or made now (ahead: for resolveAhead, which it does
// not call again); and where it came from.
func (m *Manager) resolveShared(ctx context.Context, ref string, key digest.Digest, ahead bool) (*Served, lookupSource, error) {
	k := layerKey{ref, key}
	if l, err, ok := m.remembered(k); ok {
		if err == nil && l.v.Err() != nil {
			err, l = l.v.Err(), nil // refused since (Served.checkTarSplit)
		}
		return l, sourceMemory, err
	}
	src := sourceRegistry // until the resolution says (a caller that gives up never learns)
	ch := m.group.DoChan(ref+"\x00"+key.String(), func() (any, error) {
		if l, err, ok := m.remembered(k); ok {
			return resolved{l, sourceMemory}, err
		}
		ctx, cancel := m.life.bound(ctx, m.opts.resolveTimeout)
		defer cancel()
		select {
		case m.resolving <- struct{}{}:
			defer func() { <-m.resolving }()
		case <-ctx.Done():
			return resolved{nil, sourceRegistry}, fmt.Errorf("waiting for a resolution slot: %w", ctx.Err())
		}
		l, src, err := m.resolve(ctx, ref, key, ahead)
		if err == nil || !ahead {
			m.remember(k, l, err) // a failure ahead is not the runtime's: its own lookup asks again
		}
		return resolved{l, src}, err
	})
	select {
	case r := <-ch:
		res := r.Val.(resolved)
		src = res.source
		if r.Err != nil {
			return nil, src, r.Err
		}
		if err := res.layer.v.Err(); err != nil {
			return nil, src, err
		}
		return res.layer, src, nil
	case <-ctx.Done():
		return nil, src, ctx.Err()
	}
}

// resolveAhead resolves, in the background, the other lazily servable layers of the manifest
// in which a lookup found key through the registry, by the same kind of key (TOC or blob
// digest), while that lookup resolves its own: a runtime looks the layers of an image up one
// after the other, each lookup waiting for its TOC's round trips and verification, so that
// the next lookups find their layers resolved or on their way. The layers are resolved for the
// same reference, as its own lookups would be (the same authorization, the same
// verification); their background fetch waits for their first lookup, since the runtime may
// have them already. At most maxAhead layers, aheadConcurrency at a time, started within
// resolveTimeout of the first; their failures are not remembered; nothing for a key found in
// another platform's manifest.
func (m *Manager) resolveAhead(ref string, img *fetcher.Image, key digest.Digest, modern bool) {
	if d, _ := findIn(&img.Manifest, key); d == nil {
		return
	}
	var keys []digest.Digest
	for i := range img.Manifest.Layers {
		l := &img.Manifest.Layers[i]
		k := l.Digest
		if modern {
			k = tocKey(l.Annotations)
		}
		if _, err := chunked.Classify(l.Descriptor); err != nil || k == "" || k == key || slices.Contains(keys, k) {
			continue
		}
		if keys = append(keys, k); len(keys) == maxAhead {
			break
		}
	}
	if len(keys) == 0 {
		return
	}
	m.life.goTracked(func() {
		// Each resolution is bounded by resolveShared (resolveTimeout) and holds its slot
		// until it ends; none starts once that bound has passed since the first: a registry
		// that stalls on them costs aheadConcurrency resolution slots for resolveTimeout.
		until := m.opts.now().Add(m.opts.resolveTimeout)
		slots := make(chan struct{}, aheadConcurrency)
		var wg sync.WaitGroup
		for _, k := range keys {
			slots <- struct{}{}
			if m.life.ctx.Err() != nil || !m.opts.now().Before(until) {
				break
			}
			wg.Go(func() {
				defer func() { <-slots }()
				_, _, _ = m.resolveShared(m.life.ctx, ref, k, true)
			})
		}
		wg.Wait()
	})
}

// resolveAhead's bounds: the layers of one manifest resolved ahead, and how many at a time.
const (
	maxAhead         = 32
	aheadConcurrency = 2
)

// resolved is what a shared resolution hands every lookup waiting for it.
type resolved struct {
	layer  *Served
	source lookupSource
}

// remembered returns a resolution that is still valid.
func (m *Manager) remembered(k layerKey) (*Served, error, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resolved[k]
	if r == nil {
		return nil, nil, false
	}
	now := m.opts.now()
	if r.layer == nil {
		if now.Before(r.expires) {
			return nil, r.err, true
		}
		delete(m.resolved, k)
		return nil, nil, false
	}
	r.expires = now.Add(m.opts.keepTTL)
	return r.layer, nil, true
}

func (m *Manager) remember(k layerKey, l *Served, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if m.opts.negativeTTL > 0 {
			m.resolved[k] = &resolution{err: err, expires: m.opts.now().Add(m.opts.negativeTTL)}
		}
		return
	}
	m.resolved[k] = &resolution{layer: l, expires: m.opts.now().Add(m.opts.keepTTL)}
}

// liveLayer returns the live layer of an identity, or nil.
func (m *Manager) liveLayer(id identity) *Served {
	return m.live.get(id)
}

// addLive makes l the live layer of its identity and starts its background fetch, unless a
// concurrent resolution made another one live first: that one is returned, with ref added.
func (m *Manager) addLive(l *Served, ref string) (*Served, error) {
	compare := l.v.CanProveDiffID() && l.v.TarSize() < 0
	var cctx context.Context
	if compare {
		cctx, l.yieldComparison = context.WithCancel(m.life.ctx)
	}
	m.mu.Lock()
	closed := m.closed
	var existing *Served
	if !closed {
		l.liveSince = m.opts.now()
		existing = m.live.add(l)
	}
	m.mu.Unlock()
	if closed || existing != nil {
		if compare {
			l.yieldComparison() // l is dropped: its comparison never starts
		}
		if closed {
			return nil, errors.New("layer: the manager is closed")
		}
		existing.addRef(ref) // this resolution read the TOC through ref's repository
		return existing, nil
	}
	if compare {
		// The TOC is compared with the tar-split in the background, as background work:
		// after the quiet period (the container the lookup is for starts first), but no
		// later than tarSplitDelay after the lookup, and below the runtimes' priority
		// (idlecpu.go); the record learns the tar's size once it is proven. The comparison
		// is the daemon's largest piece of work per lookup (benchmarks/results,
		// 2026-11-28-readybench-tarsplit-reduced). A lookup that needs the size meanwhile
		// (by blob digest) compares at once, at its own priority: this one yields to it
		// (cctx is cancelled; Manager.ready), since concurrent comparisons are one
		// (verify.Verifier.CheckTarSplit) and the lookup would otherwise wait for a niced one.
		m.sched.touch() // a layer looked up: a container is starting
		m.life.goTracked(func() {
			defer l.yieldComparison()
			// Everything the comparison waits for before it starts (the quiet period, demand
			// fetches to step aside for, a processor) is bounded by tarSplitDelay: a read a
			// hostile registry holds open would otherwise postpone it for as long as the
			// attacker keeps one pending.
			wctx, cancel := context.WithTimeout(cctx, tarSplitDelay)
			_ = m.sched.wait(wctx, false)
			var err error
			if cctx.Err() == nil {
				// The tar-split's bytes first (the lookup did not wait for them), outside
				// the processor slot; a read that fails is final: a registry withholding
				// them would otherwise keep the TOC's tree served unproven.
				if err = l.readTarSplit(cctx); err == nil {
					done := m.sched.verifyingUntil(wctx)
					m.sched.idle.run(func() { err = l.checkTarSplit(cctx) })
					done()
				}
			}
			cancel()
			if cctx.Err() != nil {
				// A lookup took the comparison over (or the manager is closing): its verdict
				// stands, and it saved the record; had it given up (its context ended), the
				// comparison runs here, at the daemon's priority.
				if l.v.Err() != nil {
					_ = l.checkTarSplit(m.life.ctx) // refused by the lookup or by CheckDiffID: the refusal's bookkeeping, done once
					return
				}
				if l.v.TarSize() >= 0 || m.life.ctx.Err() != nil {
					return
				}
				if err = l.readTarSplit(m.life.ctx); err == nil {
					err = l.checkTarSplit(m.life.ctx)
				}
			}
			if err == nil {
				l.saveRecord()
			}
			m.releaseMemory() // the tar-split's decoder and records
			if l.rec != nil {
				_ = l.rec.Unresident() // the pages of the index and tar-split it read
			}
		})
	}
	return l, nil
}

// addLiveReady is addLive for a layer that was made ready for this lookup (Manager.ready):
// when a concurrent resolution made another layer of the identity live first, that one is
// returned, and it must be made ready too (compared first, for a lookup by blob digest).
func (m *Manager) addLiveReady(ctx context.Context, l *Served, modern bool, ref string) (*Served, error) {
	live, err := m.addLive(l, ref)
	if err != nil || live == l {
		return live, err
	}
	if err := m.ready(ctx, live, modern, ref); err != nil {
		return nil, err
	}
	return live, nil
}

// tarSplitDelay bounds how long the comparison of a layer's TOC with its tar-split waits after
// a modern lookup before it starts (for the quiet period, for demand fetches, for a
// processor): the time a layer the tar-split contradicts is served before it is refused
// (docs/security.md), the comparison's own time aside.
const tarSplitDelay = 5 * time.Second

// waitsForTarSplit reports whether a lookup must wait for the TOC to be compared with the
// tar-split before it answers: a lookup by blob digest, whose info carries the tar's size,
// and any lookup under the DiffID policy. Others have it compared in the background.
func waitsForTarSplit(modern, requireDiffID bool) bool { return !modern || requireDiffID }

// ready checks that l can answer a lookup: compared with its tar-split first when the lookup
// waits for it (see waitsForTarSplit), and of a known size when looked up by blob digest.
func (m *Manager) ready(ctx context.Context, l *Served, modern bool, ref string) error {
	if waitsForTarSplit(modern, m.opts.requireDiffID) {
		known := l.v.TarSize() >= 0
		if !known && l.yieldComparison != nil {
			l.yieldComparison() // the background comparison steps aside: this one is not niced
		}
		if err := l.checkTarSplit(ctx); err != nil {
			return err
		}
		if !known && l.v.TarSize() >= 0 {
			l.saveRecord() // with the tar's size
		}
	}
	return m.unsized(l, modern, ref)
}

// unsized refuses a lookup by blob digest of a layer whose tar size is unknown: runtimes that
// look layers up by blob digest (c/storage < 1.54) record the tar's size from info and fail
// on images whose size is unknown, so such layers are pulled normally.
func (m *Manager) unsized(l *Served, modern bool, ref string) error {
	if modern || tarSize(l.v, l.desc.Annotations) >= 0 {
		return nil
	}
	m.counters.notLazy.Add(1)
	reason := "the uncompressed size is unknown (no tar-split or uncompressed-size annotation), which runtimes that look layers up by blob digest need"
	m.opts.log.Info("layer not served lazily", "ref", ref, "layer", l.desc.Digest, "reason", reason)
	return fmt.Errorf("layer %s of %s: %w (%s)", l.desc.Digest, ref, iofs.ErrNotExist, reason)
}

// tocKey returns the TOC digest a modern runtime looks a layer up by: c/image consults the
// eStargz annotation and the zstd:chunked one (both at once is an error there).
func tocKey(a map[string]string) digest.Digest {
	s, ok := a[chunked.AnnotationStargzTOCDigest]
	z, zok := a[chunked.AnnotationChecksum]
	switch {
	case ok && zok:
		return ""
	case ok:
		return digest.Digest(s)
	default:
		return digest.Digest(z)
	}
}

// Use records that the runtime took a reference to the layer.
func (m *Manager) Use(ref string, key digest.Digest) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resolved[layerKey{ref, key}]
	if r == nil || r.layer == nil {
		return
	}
	r.users++
	r.layer.users.Add(1)
}

// Release records that the runtime dropped a reference. When the last user of a layer
// goes away its background fetch stops.
func (m *Manager) Release(ref string, key digest.Digest) {
	m.mu.Lock()
	r := m.resolved[layerKey{ref, key}]
	if r == nil || r.layer == nil || r.users == 0 {
		m.mu.Unlock()
		return
	}
	r.users--
	r.expires = m.opts.now().Add(m.opts.keepTTL)
	l := r.layer
	m.mu.Unlock()
	if l.users.Add(-1) == 0 {
		l.stopPrefetch()
	}
}

// janitor forgets expired resolutions and the layers no resolution names any more.
func (m *Manager) janitor() {
	defer m.done.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.expire()
		}
	}
}

func (m *Manager) expire() {
	now := m.opts.now()
	var gone []*Served
	m.mu.Lock()
	live := map[*Served]bool{}
	for k, r := range m.resolved {
		if r.users == 0 && !now.Before(r.expires) {
			delete(m.resolved, k)
			continue
		}
		if r.layer != nil {
			live[r.layer] = true
		}
	}
	// A layer made live is named by its resolution only once the resolution is remembered
	// (resolveShared), after the rest of the lookup (Manager.ready): it is kept for as long
	// as a resolution may take, or the janitor would forget a layer being looked up.
	gone, kept := m.live.retain(func(l *Served) bool {
		return live[l] || now.Before(l.liveSince.Add(m.opts.resolveTimeout))
	})
	m.mu.Unlock()
	for _, l := range gone {
		l.stopPrefetch()
		l.dropBlobCopy(time.Time{})
	}
	for _, l := range kept {
		l.dropBlobCopy(now.Add(-m.opts.keepTTL))
	}
}

// repository returns the repository a reference names (registry and path, without tag or
// digest); the reference itself when it does not parse.
func repository(ref string) string {
	n, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return ref
	}
	return n.Name()
}
