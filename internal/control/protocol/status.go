package protocol

import (
	"time"

	"github.com/layerstore/layerstore/internal/metrics"
)

// Status is what GET /status answers: a snapshot of the layer manager (and of what the daemon
// adds to it).
type Status struct {
	Layers   []LayerStatus `json:"layers"`
	Pins     []Pin         `json:"pins,omitempty"`
	Cache    CacheStats    `json:"cache"`
	Counters Counters      `json:"counters"`
	// Latency holds the histograms the metrics endpoint writes; not part of the JSON status.
	Latency Latency `json:"-"`
	// Session is what becomes of the store's FUSE session when the daemon restarts; set by the
	// daemon, not by the layer manager.
	Session *SessionStatus `json:"session,omitempty"`
	// Runtimes is what the daemon recorded in the runtimes' own storage for them; set by the
	// daemon, not by the layer manager.
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

// SessionStatus says whether running containers survive a restart or a crash of the daemon.
type SessionStatus struct {
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
	Refs []string `json:"refs"`
	// Digest is the layer's blob digest and TOCDigest its TOC's, as "algorithm:hex" (plain
	// strings: the protocol links no digest package).
	Digest    string `json:"digest"`
	TOCDigest string `json:"tocDigest"`
	Format    string `json:"format"`
	Guarantee string `json:"guarantee"`
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

// CacheStats are the cache's figures for status and metrics.
type CacheStats struct {
	Bytes     int64 `json:"bytes"`     // content bytes held (see the cache's Usage)
	MaxBytes  int64 `json:"maxBytes"`  // the size bound
	Files     int   `json:"files"`     // files held, complete or partial
	Complete  int   `json:"complete"`  // of which complete
	Hits      int64 `json:"hits"`      // reads that found all their bytes
	Misses    int64 `json:"misses"`    // reads that found some bytes missing
	Evictions int64 `json:"evictions"` // files and records removed to stay within the bound
}

// Pin is a pinned image: every lazily served layer of one platform of it resolved, fetched,
// verified and kept out of the cache's eviction, with its record, across restarts.
type Pin struct {
	Ref      string `json:"ref"`
	Platform string `json:"platform,omitempty"` // "" for the host's
	// Layers are the image's layers the store serves, by blob digest; Normal counts those it
	// does not (not lazily pullable: the runtime pulls them itself).
	Layers []string `json:"layers"`
	Normal int      `json:"pulledNormally"`
	// Bytes is the uncompressed content of the pinned layers' files; Present what the cache
	// holds of it.
	Bytes   int64     `json:"bytes"`
	Present int64     `json:"present"`
	Pinned  time.Time `json:"pinned"`
	// Error says why the pin is not complete: its layer records are gone, or fetching what a
	// previous run left missing failed. Status only; pinning the image again retries.
	Error string `json:"error,omitempty"`
}

// State is where a layer's background fetch is.
type State string

// States of a layer.
const (
	StateIdle     State = "idle"     // no background fetch (turned off, or not started)
	StateFetching State = "fetching" // background fetch running
	StateComplete State = "complete" // every file is local
	StateStopped  State = "stopped"  // stopped: the layer's users went away, or shutdown
	StateFailed   State = "failed"   // background fetch gave up; reads still fetch on demand
)
