package layer

import (
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

// Status returns a snapshot of every live layer, the cache and the counters.
func (m *Manager) Status() protocol.Status {
	layers := m.live.all()
	st := protocol.Status{
		Pins:  m.Pins(),
		Cache: m.cache.Stats(),
		Counters: protocol.Counters{
			Lookups:        m.counters.lookups.Load(),
			Resolutions:    m.counters.resolutions.Load(),
			FromRecords:    m.counters.fromRecords.Load(),
			NotLazy:        m.counters.notLazy.Load(),
			Failures:       m.counters.failures.Load(),
			VerifyFailures: m.counters.verifyFailures.Load(),
			OnDemandBytes:  m.counters.onDemandBytes.Load(),
			PrefetchBytes:  m.counters.prefetchBytes.Load(),
			ProfileBytes:   m.counters.profileBytes.Load(),
		},
		Latency: m.counters.latency(),
	}
	for _, l := range layers {
		st.Layers = append(st.Layers, l.Status())
	}
	slices.SortFunc(st.Layers, func(a, b protocol.LayerStatus) int {
		return strings.Compare(string(a.Digest), string(b.Digest))
	})
	return st
}

// Status describes the layer.
func (l *Served) Status() protocol.LayerStatus {
	l.mu.Lock()
	refs := slices.Clone(l.refs)
	l.mu.Unlock()
	p := &l.prefetch
	p.mu.Lock()
	state, err, planned, elapsed := p.state, p.err, p.planned, p.elapsed
	var prof *protocol.ProfileStatus
	if p.profileFiles > 0 {
		prof = &protocol.ProfileStatus{Files: p.profileFiles, Bytes: p.profilePlanned, Fetched: l.profiled.Load(), SameLayer: p.profileSame}
	}
	p.mu.Unlock()
	if state == "" {
		state = protocol.StateIdle
	}
	s := protocol.LayerStatus{
		Refs: refs, Digest: l.desc.Digest.String(), TOCDigest: l.tocKey.String(),
		Format: l.v.Layout().Format.String(), Guarantee: l.v.Guarantee().String(),
		Size: l.desc.Size, ToFetch: planned,
		OnDemand: l.onDemand.Load(), Prefetched: l.prefetched.Load(),
		Users: l.users.Load(), State: state, Seconds: elapsed.Seconds(),
		Profile: prof, ProfileRecorded: l.recording.saved.Load(),
	}
	s.ReadChunks, s.ReadCompressed = l.reads.summary(l.idx)
	s.PassthroughFiles = l.reads.passthrough.Load()
	s.ReadWaits, s.ReadRequests = l.reads.waits.Load(), l.reads.requested.Load()
	s.ReadWaitSeconds = time.Duration(l.reads.waited.Load()).Seconds()
	if err != nil {
		s.Error = err.Error()
	}
	if err := l.v.Err(); err != nil {
		s.Error = "refused: " + err.Error() // the guarantee is none
	}
	return s
}

// unstored returns an error when a regular file of the layer is not complete in the cache:
// the layer is fully local only when the cache holds every file, whatever the background
// fetch did (the cache refuses content when its filesystem is full, and evicts).
func (l *Served) unstored() error {
	var missing, files int
	for d := range l.contentFiles(nil) {
		files++
		if !l.env.cache.Has(d) {
			missing++
		}
	}
	if missing > 0 {
		return fmt.Errorf("%d of %d files not stored in the cache (its filesystem full, or the cache smaller than the layer)", missing, files)
	}
	return nil
}

// contentFiles yields the digest and size of each regular file of the layer that has content,
// once per digest; seen, when not nil, carries the digests already yielded across layers.
func (l *Served) contentFiles(seen map[chunked.Sum]bool) iter.Seq2[chunked.Sum, int64] {
	if seen == nil {
		seen = map[chunked.Sum]bool{}
	}
	return func(yield func(chunked.Sum, int64) bool) {
		for id := range chunked.EntryID(l.idx.Len()) {
			e := l.idx.Meta(id)
			if e.Type != chunked.TypeReg || e.Inode != id || e.Size == 0 || e.Digest.IsZero() || seen[e.Digest] {
				continue
			}
			seen[e.Digest] = true
			if !yield(e.Digest, e.Size) {
				return
			}
		}
	}
}

func (c *counters) latency() protocol.Latency {
	lat := protocol.Latency{ReadWait: c.readWait.Snapshot()}
	for o := range numOutcomes {
		for src := range numSources {
			lat.Lookups = append(lat.Lookups, protocol.LookupLatency{
				Outcome: outcomeNames[o], Source: sourceNames[src], Snapshot: c.lookupTime[o][src].Snapshot()})
		}
	}
	return lat
}
