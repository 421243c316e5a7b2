package layer

import (
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/metrics"
)

// Status is a snapshot of the manager for the control socket.
type Status struct {
	Layers   []LayerStatus `json:"layers"`
	Pins     []Pin         `json:"pins,omitempty"`
	Cache    cache.Stats   `json:"cache"`
	Counters Counters      `json:"counters"`
	// Latency holds the histograms the metrics endpoint writes; not part of the JSON status.
	Latency Latency `json:"-"`
	// Session is what becomes of the store's FUSE session when the daemon restarts; set by the
	// daemon, not by the Manager.
	Session *Session `json:"session,omitempty"`
	// Runtimes is what the daemon recorded in the runtimes' own storage for them; set by the
	// daemon, not by the Manager.
	Runtimes *RuntimeRecords `json:"runtimes,omitempty"`
}

// RuntimeRecords says what the daemon wrote into runtimes' layers.json: the entries of layers
// they took from the store and that their containers/storage did not record.
type RuntimeRecords struct {
	// Graphroots are the runtimes' storage roots the daemon records into; none when off.
	Graphroots []string `json:"graphroots"`
	// Recorded counts the entries added; Failures the passes over a graphroot that failed,
	// LastError the last one's error.
	Recorded  int64  `json:"recorded"`
	Failures  int64  `json:"failures"`
	LastError string `json:"lastError,omitempty"`
}

// Session says whether running containers survive a restart or a crash of the daemon.
type Session struct {
	// Kept is set while the service manager keeps the FUSE session (its file descriptor
	// store) for the next daemon.
	Kept bool `json:"kept"`
	// Resumed is set when this daemon took over the session of the previous one.
	Resumed bool `json:"resumed"`
	// Why says why the session is not kept, when it is not.
	Why string `json:"why,omitempty"`
}

// LayerStatus describes one resolved layer.
type LayerStatus struct {
	Refs      []string      `json:"refs"`
	Digest    digest.Digest `json:"digest"`
	TOCDigest digest.Digest `json:"tocDigest"`
	Format    string        `json:"format"`
	Guarantee string        `json:"guarantee"`
	// Size is the compressed blob size; ToFetch what the background fetch set out to fetch.
	Size       int64   `json:"size"`
	ToFetch    int64   `json:"toFetch"`
	OnDemand   int64   `json:"fetchedOnDemand"`
	Prefetched int64   `json:"prefetched"`
	Users      int64   `json:"users"`
	State      State   `json:"state"`
	Error      string  `json:"error,omitempty"`
	Seconds    float64 `json:"prefetchSeconds,omitempty"`
	// Profile is the startup profile the background fetch replayed first, if any.
	Profile *ProfileStatus `json:"profile,omitempty"`
	// ProfileRecorded counts the files the layer's first reads recorded into its
	// repositories' startup profiles, once written.
	ProfileRecorded int64 `json:"profileRecorded,omitempty"`
	// ReadChunks is how many chunks the kernel asked for (reads through FUSE, whatever served
	// them, and every chunk of a file opened with passthrough, PassthroughFiles of them), and
	// ReadCompressed the compressed bytes of those chunks in the blob.
	ReadChunks       int64 `json:"readChunks"`
	ReadCompressed   int64 `json:"readCompressedBytes"`
	PassthroughFiles int64 `json:"passthroughFiles"`
	// ReadWaits counts the reads of a runtime that waited for the registry (their chunks
	// missing from the cache, or still on their way), ReadWaitSeconds their waits summed
	// (reads waiting at the same time count each), and ReadRequests those that sent a request
	// of their own: the round trips the workload paid for (the others waited for chunks a
	// prediction, a region, a profile's replay or another read was fetching).
	ReadWaits       int64   `json:"readWaits"`
	ReadRequests    int64   `json:"readRequests"`
	ReadWaitSeconds float64 `json:"readWaitSeconds"`
}

// ProfileStatus describes the startup profile a layer's background fetch replayed first.
type ProfileStatus struct {
	// Files counts the layer's files the profile named (those not in the cache were
	// fetched first); Bytes is their compressed bytes to fetch, Fetched what was fetched.
	Files   int   `json:"files"`
	Bytes   int64 `json:"bytes"`
	Fetched int64 `json:"fetched"`
	// SameLayer: the profile was recorded from this layer; otherwise from another layer of
	// its repository (an earlier version of the image), matched by path.
	SameLayer bool `json:"sameLayer"`
}

// Counters are totals since the manager started.
type Counters struct {
	Lookups     int64 `json:"lookups"`
	Resolutions int64 `json:"resolutions"`
	// FromRecords counts the resolutions answered from a layer record, without the registry.
	FromRecords    int64 `json:"fromRecords"`
	NotLazy        int64 `json:"notLazy"`
	Failures       int64 `json:"failures"`
	VerifyFailures int64 `json:"verifyFailures"`
	OnDemandBytes  int64 `json:"fetchedOnDemandBytes"`
	PrefetchBytes  int64 `json:"prefetchedBytes"`
	// ProfileBytes counts the bytes background fetches fetched first for startup profiles
	// (not in PrefetchBytes).
	ProfileBytes int64 `json:"profileBytes"`
}

// Latency is a snapshot of the manager's latency histograms.
type Latency struct {
	// Lookups has one histogram per outcome and source of a lookup, every combination
	// present (zero counts included), in a fixed order.
	Lookups []LookupLatency
	// ReadWait is how long reads of files waited for the registry: reads whose chunks were
	// missing from the cache, from the start of their fetch to its end (failed ones included).
	ReadWait metrics.Snapshot
}

// LookupLatency is the histogram of the lookups with one outcome and source.
type LookupLatency struct {
	// Outcome: "served" (the layer is served lazily), "not_lazy" (ENOENT: the runtime pulls
	// the layer normally: not a lazy format, a policy, a key or image the registry does not
	// have), "failed" (EIO: registry, verification, timeout).
	Outcome string
	// Source: what answered: "memory" (a resolution or failure the manager remembered),
	// "record" (the layer's record, without the registry), "registry".
	Source string
	metrics.Snapshot
}

// Status returns a snapshot of every live layer, the cache and the counters.
func (m *Manager) Status() Status {
	m.mu.Lock()
	layers := make([]*Layer, 0, len(m.live))
	for _, l := range m.live {
		layers = append(layers, l)
	}
	m.mu.Unlock()
	st := Status{
		Pins:  m.Pins(),
		Cache: m.cache.Stats(),
		Counters: Counters{
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
	slices.SortFunc(st.Layers, func(a, b LayerStatus) int {
		return strings.Compare(string(a.Digest), string(b.Digest))
	})
	return st
}

// Status describes the layer.
func (l *Layer) Status() LayerStatus {
	l.mu.Lock()
	refs := slices.Clone(l.refs)
	l.mu.Unlock()
	p := &l.prefetch
	p.mu.Lock()
	state, err, planned, elapsed := p.state, p.err, p.planned, p.elapsed
	var prof *ProfileStatus
	if p.profileFiles > 0 {
		prof = &ProfileStatus{Files: p.profileFiles, Bytes: p.profilePlanned, Fetched: l.profiled.Load(), SameLayer: p.profileSame}
	}
	p.mu.Unlock()
	if state == "" {
		state = StateIdle
	}
	s := LayerStatus{
		Refs: refs, Digest: l.desc.Digest, TOCDigest: l.tocKey,
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
func (l *Layer) unstored() error {
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
func (l *Layer) contentFiles(seen map[chunked.Sum]bool) iter.Seq2[chunked.Sum, int64] {
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

func (c *counters) latency() Latency {
	lat := Latency{ReadWait: c.readWait.Snapshot()}
	for o := range numOutcomes {
		for src := range numSources {
			lat.Lookups = append(lat.Lookups, LookupLatency{
				Outcome: outcomeNames[o], Source: sourceNames[src], Snapshot: c.lookupTime[o][src].Snapshot()})
		}
	}
	return lat
}
