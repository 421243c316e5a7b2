package layer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/execdeps"
	"github.com/layerstore/layerstore/verify"
)

// Served is a resolved, verified layer, as the store serves it. It implements storefs.Layer;
// its methods are safe for concurrent use and keep working after the manager forgot the layer.
type Served struct {
	env    *env // what it shares with the manager's other layers
	id     identity
	desc   fetcher.ImageLayer
	tocKey digest.Digest
	v      *verify.Verifier
	idx    *chunked.Index
	blob   RemoteBlob
	// rec is the record the index and tar-split are mapped from, nil when they are on the
	// heap. It lives as long as the index (see records.open).
	rec *cache.Record

	users  atomic.Int64 // runtime references over every key and reference
	looked atomic.Bool  // a runtime looked the layer up (resolved ahead ones wait for it)
	// liveSince is when the layer was made live (Manager.addLive, under Manager.mu): the
	// resolution that made it live names it only once remembered, and the janitor keeps it
	// for the resolution's time meanwhile (Manager.expire).
	liveSince time.Time
	// startGuess is the prediction of the program of the image the layer was last looked up
	// for (start.go); nil before one.
	startGuess atomic.Pointer[startGuess]

	recordMu sync.Mutex // serializes saveRecord

	mu        sync.Mutex
	refs      []string                  // the image references the layer was resolved through
	repos     map[string]bool           // their repositories, each known to serve the blob
	inflight  map[chunkKey]*fetch       // the chunks being fetched, and failures remembered
	cold      map[chunked.EntryID]uint8 // cold reads of each file so far (region), bounded
	blobCopy  *blobCopy                 // the verified blob, while export reads it
	predicted map[chunked.EntryID]bool  // the files predicted (predict.go), bounded

	onDemand, prefetched atomic.Int64 // compressed bytes fetched for reads and in the background
	profiled             atomic.Int64 // of prefetched, the bytes the startup profile's replay fetched
	recording            recording    // the startup profile being recorded (profile.go)
	cacheFull            atomic.Bool  // a store found the cache's filesystem full (cache.ErrNoSpace)
	refused              atomic.Bool  // the TOC and the tar-split disagree (counted and logged once)
	link                 linkRate     // the rate its fetches get (fetchAndVerify), sizing urgent requests
	prefetch             prefetchState
	reads                readSet // the chunks the kernel asked for (reads.go)

	// refusal is closed when refused is set (Refusal).
	refusal chan struct{}

	// yieldComparison cancels the comparison of the TOC with the tar-split that a modern
	// lookup left to the background (Manager.addLive), so that a lookup that waits for it
	// runs it at its own priority; nil when none was left. Set before the layer is live.
	yieldComparison context.CancelFunc
}

type chunkKey struct {
	file chunked.EntryID
	i    int
}

func newLayer(e *env, id identity, ref string, desc fetcher.ImageLayer, v *verify.Verifier, blob RemoteBlob) *Served {
	return &Served{
		env:      e,
		id:       id,
		desc:     desc,
		tocKey:   v.Layout().TOCDigest,
		v:        v,
		idx:      v.Index(),
		blob:     blob,
		refs:     []string{ref},
		repos:    map[string]bool{repository(ref): true},
		inflight: map[chunkKey]*fetch{},
		cold:     map[chunked.EntryID]uint8{},
		refusal:  make(chan struct{}),
	}
}

// tarSize is the size of the layer's uncompressed tar when it is known without reading the
// whole layer: from the tar-split of zstd:chunked once compared with the TOC
// (verify.Verifier.CheckTarSplit), else from the eStargz producers' uncompressed-size
// annotation (a claim of the manifest). Otherwise -1.
func tarSize(v *verify.Verifier, annotations map[string]string) int64 {
	if n := v.TarSize(); n >= 0 {
		return n
	}
	if v.CanProveDiffID() {
		return -1 // a tar-split not compared yet: its size is not proven
	}
	if n, err := strconv.ParseInt(annotations[chunked.AnnotationUncompressedSize], 10, 64); err == nil && n >= 0 {
		return n
	}
	return -1
}

// checkTarSplit runs the comparison of the layer's TOC with its tar-split (at once when it has
// run). Its failure refuses the layer: lookups fail with it (Manager.lookup), so do reads and
// the background fetch (the verifier verifies nothing more), and status shows it; it is
// counted as a verification failure and logged once.
func (l *Served) checkTarSplit(ctx context.Context) error {
	err := l.v.CheckTarSplit(ctx, l.timedBlob())
	if l.v.Err() != nil && l.refused.CompareAndSwap(false, true) {
		l.env.counters.failures.Add(1)
		if !errors.Is(l.v.Err(), verify.ErrUnproven) { // a read that failed is no digest's
			l.env.counters.verifyFailures.Add(1)
		}
		l.env.log.Error("layer refused: its TOC is not proven by its tar-split; files already served showed the TOC's metadata",
			"layer", l.desc.Digest, "err", err)
		close(l.refusal)
		l.stopPrefetch()
		l.env.refusals.add(l.id, l.v.Err())
		l.env.records.remove(recordName(l.id))
	}
	return err
}

// readTarSplit reads the tar-split for the background comparison, finally: a read that fails
// refuses the layer (verify.Verifier.ReadTarSplit), with the refusal's bookkeeping
// (checkTarSplit, which then returns the verdict at once).
func (l *Served) readTarSplit(ctx context.Context) error {
	err := l.v.ReadTarSplit(ctx, l.timedBlob(), true)
	if err != nil && l.v.Err() != nil {
		return l.checkTarSplit(ctx)
	}
	return err
}

// timedBlob is the layer's blob for the verifier's own reads (the tar-split's, read by the
// first comparison), each bounded by the read timeout as the layer's fetches are: a registry
// that holds the read would otherwise hold the comparison, which a lookup by blob digest
// waits for.
func (l *Served) timedBlob() verify.Source { return timedSource{l.blob, l.env.readTimeout} }

type timedSource struct {
	src     verify.Source
	timeout time.Duration
}

func (s timedSource) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.src.ReadAt(ctx, p, off)
}

// Refused returns the error that refuses the layer (its TOC and tar-split disagree, or its
// tar-split is not the one the TOC names or could not be read in time), nil
// while it is served: the namespace stops answering anything of its tree once it is set.
func (l *Served) Refused() error { return l.v.Err() }

// Refusal returns a channel closed once the layer is refused (when checkTarSplit finds the
// disagreement), so that the namespace drops what the kernel cached of its tree.
func (l *Served) Refusal() <-chan struct{} { return l.refusal }

// refusals remembers the identities of the layers refused because their TOC and tar-split
// disagree, so that a later resolution of the same identity (after the keep TTL forgot the
// layer, through another reference) is refused at once instead of being served again until a
// new comparison. The verdict depends only on bytes the identity names by digest (the TOC,
// and the tar-split through the TOC or the annotation), so it never goes stale. Bounded: the
// oldest is forgotten beyond maxRefusals. Its lock is a leaf.
type refusals struct {
	mu    sync.Mutex
	errs  map[identity]error
	order []identity
}

const maxRefusals = 4096

func (r *refusals) add(id identity, err error) {
	if r == nil || err == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errs == nil {
		r.errs = map[identity]error{}
	}
	if _, ok := r.errs[id]; ok {
		return
	}
	if len(r.order) >= maxRefusals {
		delete(r.errs, r.order[0])
		r.order = r.order[1:]
	}
	r.errs[id] = err
	r.order = append(r.order, id)
}

func (r *refusals) err(id identity) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs[id]
}

// addRef records that ref resolved to the layer, and that its repository serves the blob; a
// repository new to the layer is written to its record, so that lookups through it are
// answered from the record after a restart.
func (l *Served) addRef(ref string) {
	repo := repository(ref)
	l.mu.Lock()
	newRepo := !l.repos[repo]
	l.repos[repo] = true
	if !slices.Contains(l.refs, ref) {
		l.refs = append(l.refs, ref)
	}
	l.mu.Unlock()
	if newRepo {
		l.saveRecord()
	}
}

// references returns the image references the layer was resolved through.
func (l *Served) references() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.refs)
}

// restoreRefs adds what a layer's record remembers: its references and repositories.
func (l *Served) restoreRefs(refs, repos []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range repos {
		l.repos[r] = true
	}
	for _, r := range refs {
		if !slices.Contains(l.refs, r) {
			l.refs = append(l.refs, r)
		}
	}
}

// saveRecord writes the layer's record again, in the background: its repositories or its
// guarantee changed. The record's data is built on the heap: it is released after.
func (l *Served) saveRecord() {
	l.env.life.goTracked(func() {
		if err := l.writeRecord(); err != nil {
			l.env.log.Warn("updating the layer record failed", "layer", l.desc.Digest, "err", err)
		}
		// A tar-split the comparison read is in the record now, for a restart; the live
		// layer's CheckDiffID reads it again. Off the heap, where a layer fetched slowly or
		// never whole would keep it (up to the TOC limit per layer).
		l.v.ReleaseTarSplit()
		if l.rec != nil {
			_ = l.rec.Unresident() // the pages of the index and tar-split the write read
		}
		l.env.releaseMemory()
	})
}

// writeRecord writes the layer's record as the layer is now. Writes of one layer are
// serialized, each writing the state of its time.
func (l *Served) writeRecord() error {
	l.recordMu.Lock()
	defer l.recordMu.Unlock()
	l.mu.Lock()
	refs := slices.Clone(l.refs)
	repos := make([]string, 0, len(l.repos))
	for r := range l.repos {
		repos = append(repos, r)
	}
	l.mu.Unlock()
	_, err := l.env.records.save(l.desc, l.v, repos, refs)
	return err
}

// hasRepo reports whether repo is known to serve the layer's blob.
func (l *Served) hasRepo(repo string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.repos[repo]
}

// Index implements storefs.Layer.
func (l *Served) Index() *chunked.Index { return l.idx }

// BlobSize implements storefs.Layer.
func (l *Served) BlobSize() int64 { return l.desc.Size }

// Digest returns the layer's compressed blob digest.
func (l *Served) Digest() digest.Digest { return l.desc.Digest }

// info is the part of c/storage's Layer record that an additional layer store provides.
type info struct {
	TOCDigest            digest.Digest     `json:"toc-digest,omitempty"`
	Flags                map[string]string `json:"flags,omitempty"`
	CompressedDiffDigest digest.Digest     `json:"compressed-diff-digest,omitempty"`
	CompressedSize       int64             `json:"compressed-size"`
	DiffDigest           digest.Digest     `json:"diff-digest,omitempty"`
	DiffSize             int64             `json:"diff-size"`
	Compression          int               `json:"compression"`
}

// c/storage's archive.Compression values.
const (
	compressionGzip = 2
	compressionZstd = 4
)

// Info implements storefs.Layer. Seen through its TOC digest (a modern runtime), the layer says
// which DiffID the runtime must expect, claims the DiffID only once proven, and gives the tar's
// size once known; seen through its blob
// digest (an older runtime, which needs both digests), it names the blob and the DiffID.
func (l *Served) Info(key digest.Digest) []byte {
	in := info{CompressedSize: l.desc.Size, DiffSize: -1, Compression: compressionGzip}
	if l.v.Layout().Format.Zstd() {
		in.Compression = compressionZstd
	}
	if l.desc.DiffID != "" {
		in.Flags = map[string]string{"expected-layer-diffid": l.desc.DiffID.String()}
	}
	if key == l.desc.Digest {
		in.CompressedDiffDigest = l.desc.Digest
		in.DiffDigest = l.desc.DiffID
		in.DiffSize = tarSize(l.v, l.desc.Annotations) // never -1: such layers are not served by blob digest
	} else {
		in.TOCDigest = key
		// The tar's size as soon as it is known (the eStargz annotation, the tar-split's once
		// compared with the TOC): what the runtime reports as the image's size, which the
		// kubelet's image collection reasons with. containers/storage trusts a size only with
		// the DiffID beside it, which is claimed only once proven.
		in.DiffSize = tarSize(l.v, l.desc.Annotations)
		if l.v.Guarantee() >= verify.DiffIDVerified {
			in.DiffDigest = l.desc.DiffID
		}
	}
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // a struct of strings and integers always marshals
	}
	return b
}

// Backing implements storefs.Layer: the cache's file, when its content is complete.
func (l *Served) Backing(id chunked.EntryID) *os.File {
	e := l.idx.Meta(id)
	if l.v.Err() != nil || e.Type != chunked.TypeReg || e.Size == 0 || e.Digest.IsZero() || !l.env.cache.Has(e.Digest) {
		return nil
	}
	h, err := l.env.files.acquire(e.Digest, e.Size)
	if err != nil {
		return nil
	}
	defer l.env.files.release(h)
	p, err := h.f.Path()
	if err != nil {
		return nil
	}
	// The file stays in place while it is open: eviction removes the name, not the inode.
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	l.reads.notePassthrough(l.idx, id, e.Size)
	l.recordRead(id, e.Size) // read by the kernel from here on, never through ReadFile
	return f
}

// ReadFile implements storefs.Layer: it reads verified content of regular file id, from the cache
// where present and from the registry otherwise. A read of the start of a shared object
// predicts it, unless the layer replays a startup profile: a library being loaded (dlopen,
// predict.go).
func (l *Served) ReadFile(ctx context.Context, id chunked.EntryID, p []byte, off int64) (int, error) {
	n, err := l.read(ctx, id, p, off, onDemand)
	if err == nil && off == 0 && execdeps.IsSharedObject(p[:n]) && !l.replaysProfile() {
		l.predict(nil, id)
	}
	return n, err
}

// Executing implements storefs.Layer: the files the loader of file id will open are
// predicted (predict.go), and the guess of the image's program (start.go) is settled: right
// when id is that program, wrong when a program no prediction foresaw runs first.
func (l *Served) Executing(id chunked.EntryID) {
	fresh := l.predict(nil, id)
	if g := l.startGuess.Load(); g != nil {
		g.executing(fileRef{l, id}, fresh)
	}
}

// read reads verified content of regular file id: a read a runtime waits for (onDemand), or a
// prediction's (ahead), which is neither recorded nor counted as the workload's and fetches
// nothing ahead of itself in sequence.
func (l *Served) read(ctx context.Context, id chunked.EntryID, p []byte, off int64, kind fetchKind) (int, error) {
	if err := l.v.Err(); err != nil {
		return 0, err // the layer is refused (checkTarSplit)
	}
	e := l.idx.Meta(id)
	if off < 0 {
		return 0, fmt.Errorf("negative offset %d", off)
	}
	if off >= e.Size || len(p) == 0 {
		return 0, nil
	}
	if rest := e.Size - off; int64(len(p)) > rest {
		p = p[:rest]
	}
	end := off + int64(len(p))
	if kind == onDemand {
		l.recordRead(id, end)
	}
	// The read's chunks, found once: for the read set, and below for the read itself.
	first, last := l.idx.ChunkAt(id, off), l.idx.ChunkAt(id, end-1)
	if kind == onDemand {
		l.reads.mark(l.idx, id, first, last)
	}
	var h *handle
	if !e.Digest.IsZero() {
		var err error
		if h, err = l.env.files.acquire(e.Digest, e.Size); err != nil {
			l.env.log.Warn("cache unavailable, reading from the registry", "err", err)
			h = nil
		} else {
			defer l.env.files.release(h)
			if h.f.Complete() {
				return h.f.ReadAt(p, off)
			}
		}
	}
	if first < 0 || last < 0 {
		return 0, fmt.Errorf("%s: offset %d has no chunk", l.idx.Path(id), off)
	}
	return l.readChunks(ctx, h, id, p, off, first, last, kind)
}
