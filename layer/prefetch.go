package layer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/verify"
)

type prefetchState struct {
	mu      sync.Mutex
	state   protocol.State
	err     error
	cancel  context.CancelFunc
	done    chan struct{}
	planned int64 // compressed bytes the background fetch set out to fetch
	elapsed time.Duration
	// The startup profile replayed first: its files and their compressed bytes, and
	// whether it was recorded from this layer (else another layer of a repository).
	profileFiles   int
	profilePlanned int64
	profileSame    bool
}

func (l *Served) startPrefetch() {
	p := &l.prefetch
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		return
	}
	ctx, cancel := context.WithCancel(l.env.life.ctx)
	p.cancel, p.done, p.state = cancel, make(chan struct{}), protocol.StateFetching
	l.env.sched.touch()
	go func() {
		defer close(p.done)
		start := time.Now()
		err := l.runPrefetch(ctx)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.elapsed = time.Since(start)
		switch {
		case err == nil:
			p.state = protocol.StateComplete
		case ctx.Err() != nil:
			p.state = protocol.StateStopped
		default:
			p.state, p.err = protocol.StateFailed, err
		}
		l.logPrefetch(p.state, err, p.elapsed)
		l.env.releaseMemory()
	}()
}

func (l *Served) logPrefetch(s protocol.State, err error, elapsed time.Duration) {
	log := l.env.log.With("layer", l.desc.Digest, "elapsed", elapsed.Round(time.Millisecond),
		"prefetched", l.prefetched.Load(), "on_demand", l.onDemand.Load())
	switch s {
	case protocol.StateComplete:
		log.Info("layer fully local", "guarantee", l.v.Guarantee())
	case protocol.StateFailed:
		log.Warn("background fetch failed", "err", err)
	default:
		log.Debug("background fetch stopped")
	}
}

func (l *Served) stopPrefetch() {
	p := &l.prefetch
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
	}
}

// waitPrefetch returns when the background fetch, if any, has ended, or ctx has.
func (l *Served) waitPrefetch(ctx context.Context) error {
	p := &l.prefetch
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait returns when the background fetch, if any, has ended.
func (l *Served) wait() { _ = l.waitPrefetch(context.Background()) }

// runPrefetch fetches every chunk the cache does not hold: first the files of the startup
// profile the layer's repositories hold (profile.go), in the profile's order, at once; then
// the rest in blob order (so eStargz's prioritized files come first, at once: the producer
// said the workload reads them first; the rest after the scheduler's quiet period; with a
// profile replayed, the prioritized files wait with the rest: the profile is what a start of
// the image read, the producer's list a guess made at build time, and both at once would
// share the link the start's reads need), in
// batches of about the configured size spread over the scheduler's slots; then it proves the
// DiffID where the format allows.
func (l *Served) runPrefetch(ctx context.Context) error {
	keys, planned := l.plan()
	var prof replayPlan
	if len(keys) > 0 {
		prof = l.profileFiles()
	}
	keys, nprof := l.profileFirst(keys, prof)
	var profPlanned int64
	for _, k := range keys[:nprof] {
		profPlanned += l.ref(k).Length
	}
	l.prefetch.mu.Lock()
	l.prefetch.planned = planned
	if nprof > 0 {
		l.prefetch.profileFiles, l.prefetch.profilePlanned, l.prefetch.profileSame = len(prof.files), profPlanned, prof.same
	}
	l.prefetch.mu.Unlock()
	if nprof > 0 {
		l.env.log.Debug("replaying the startup profile", "layer", l.desc.Digest, "files", len(prof.files),
			"bytes", profPlanned, "same_layer", prof.same)
	}

	prioEnd := l.idx.PrefetchEnd() // the end of the prioritized files in the blob
	if nprof > 0 {
		prioEnd = 0
	}
	batches := make(chan prefetchBatch)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range cap(l.env.sched.slots) {
		wg.Go(func() {
			for b := range batches {
				if err := l.prefetchBatch(ctx, b); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		})
	}
	go func() {
		defer close(batches)
		for len(keys) > 0 {
			var b prefetchBatch
			var n int
			if nprof > 0 {
				n = l.replayBatchLen(keys[:nprof])
				b = prefetchBatch{keys: l.sortByOffset(keys[:n]), replay: true}
				nprof -= n
			} else {
				n = l.batchLen(keys, prioEnd)
				b = prefetchBatch{keys: keys[:n], prio: l.ref(keys[n-1]).End() <= prioEnd}
			}
			select {
			case batches <- b:
				keys = keys[n:]
			case <-ctx.Done():
				return
			case err := <-errs:
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.unstored(); err != nil {
		return err
	}
	if l.v.CanProveDiffID() && l.v.Guarantee() < verify.DiffIDVerified {
		if err := l.v.CheckDiffID(ctx, l.timedBlob(), l.payload); err != nil {
			if errors.Is(err, verify.ErrDigestMismatch) {
				l.env.counters.verifyFailures.Add(1)
			}
			if l.v.Err() != nil {
				// The comparison CheckDiffID ran first failed: the layer is refused, with
				// what a refusal does (its record removed, its identity remembered).
				_ = l.checkTarSplit(ctx)
			}
			return fmt.Errorf("proving the DiffID: %w", err)
		}
		l.saveRecord() // the guarantee, and without the tar-split no longer needed
	}
	return nil
}

// prefetchBatch is the chunks of one background request, in blob order; replay marks those of
// the startup profile, which go out at once, and prio those of prioritized files, which go
// out at once too, at most prioSlots at a time.
type prefetchBatch struct {
	keys   []chunkKey
	replay bool
	prio   bool
}

func (l *Served) prefetchBatch(ctx context.Context, b prefetchBatch) error {
	keys := b.keys
	first, last := l.ref(keys[0]), l.ref(keys[len(keys)-1])
	u := deferred
	switch {
	case b.replay:
		u = replaying
	case b.prio:
		u = prioritized
	}
	n := last.End() - first.Offset
	if b.replay {
		// A profile's files may lie far apart in the blob: only their bytes are fetched.
		n = 0
		for _, k := range keys {
			n += l.ref(k).Length
		}
	}
	release, err := l.env.sched.acquire(ctx, n, u)
	if err != nil {
		return err
	}
	defer release()
	// What the container's start fetched while this batch waited its turn is not fetched
	// again.
	if keys = l.uncached(keys); len(keys) == 0 {
		return nil
	}
	if b.replay {
		l.env.sched.aheadStart()
		defer l.env.sched.aheadEnd()
	}
	kind := background
	if b.replay {
		kind = replay
	}
	needed, _ := l.fetchChunks(ctx, keys, want{kind: kind})
	if _, err := wait(ctx, needed); err != nil {
		return err
	}
	// The chunks a read fetched are stored after the read returns: the layer is complete
	// (unstored) only once they are.
	if err := settle(ctx, needed); err != nil {
		return err
	}
	if l.cacheFull.Swap(false) {
		// Fetching the rest would only download what the cache cannot keep.
		return fmt.Errorf("storing fetched content: %w", cache.ErrNoSpace)
	}
	return nil
}

// uncached returns keys (in blob order) without the chunks the cache has come to hold since
// the plan was made: a file completed meanwhile (read whole, predicted, stored through another
// layer) is not fetched again, nor the chunks of a file the layer has read or predicted in
// part.
func (l *Served) uncached(keys []chunkKey) []chunkKey {
	var out []chunkKey
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j].file == keys[i].file {
			j++
		}
		file := keys[i].file
		e := l.idx.Meta(file)
		switch {
		case l.env.cache.Has(e.Digest):
		case l.touched(file):
			h, err := l.env.files.acquire(e.Digest, e.Size)
			if err != nil {
				out = append(out, keys[i:j]...)
				break
			}
			for _, k := range keys[i:j] {
				if !h.holds(l.ref(k)) {
					out = append(out, k)
				}
			}
			l.env.files.release(h)
		default:
			out = append(out, keys[i:j]...)
		}
		i = j
	}
	return out
}

// touched reports whether the layer has read file cold or predicted it.
func (l *Served) touched(file chunked.EntryID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cold[file] > 0 || l.predicted[file]
}

func (l *Served) ref(k chunkKey) chunked.Chunk { c, _ := l.idx.Chunk(k.file, k.i); return c }

// batchLen returns how many of keys (in blob order) make one background request: their
// compressed span within the batch size, their uncompressed content within maxBatchContent,
// since every chunk of a batch is held in memory, decompressed, until the batch is stored (a
// layer of zeros compresses a thousandfold), and at most maxBatchChunks of them. The
// prioritized files end at prioEnd in the blob (0: none, or not fetched at once).
func (l *Served) batchLen(keys []chunkKey, prioEnd int64) int {
	start := l.ref(keys[0]).Offset
	content := l.ref(keys[0]).Size
	// A batch of prioritized files stays within them, so that it goes out at once.
	prio := l.ref(keys[0]).End() <= prioEnd
	limit := l.env.batch
	if prio {
		limit = l.link.urgentSpan(limit)
	}
	n := 1
	for n < len(keys) {
		c := l.ref(keys[n])
		if c.End()-start > limit || content+c.Size > maxBatchContent || n >= maxBatchChunks ||
			(prio && c.End() > prioEnd) {
			break
		}
		content += c.Size
		n++
	}
	return n
}

// urgentBatch is the least compressed span of one request of what is fetched at once, before
// the quiet period (eStargz's prioritized files, a startup profile's): a container starting
// meanwhile reads what these did not fetch, and its reads share the link with the requests in
// flight; at most the slots' count of these is ahead of each read. The span grows with the
// link's measured rate (urgentSpan), so that each holds it about urgentTime, where batches of
// the configured size held a slow link for seconds (benchmarks/results,
// 2026-11-27-readybench-urgent-batch).
const urgentBatch = 1 << 20

// maxBatchContent bounds the uncompressed bytes of one background request: with the default
// concurrency of 4, background fetching holds at most 16 MiB of content (or 4 chunks, when one
// chunk alone is larger: an eStargz chunk is 4 MiB by default) beside its compressed bytes.
// Four requests of 4 MiB keep even a fast link busy (1 Gbit/s moves one in 34 ms, 34 round trips
// of 1 ms). With 32 MiB, the daemon's peak RSS through the pin of a 6 GB image was 159-175 MiB
// and through lazybench's background fetch 187-237 MiB; with 4 MiB, 105-121 and 117-135, the
// eStargz pin 4-5% longer, the others within their spread
// (benchmarks/results/2026-12-06-batchcontent-ab).
const maxBatchContent = 4 << 20

// maxBatchChunks bounds the chunks of one background request. Each chunk in flight costs,
// beside its content, its fetch and its part of the batch's store (several hundred bytes): a
// layer of many small files would otherwise put tens of thousands of them in one batch (100k
// files of 1.3 KiB on average, 32 MiB compressed, made four batches of 25k, and the background
// fetch peaked at 320-360 MiB of RSS; 88-94 MiB with this bound, and faster, the collector
// having less to do: benchmarks/results/2026-12-06-scalebench-batchchunks-ab). A batch of
// chunks of tens of KiB (zstd:chunked) or of MiB (eStargz) reaches the batch size first.
const maxBatchChunks = 1024

// plan lists the chunks of every file whose content is not complete in the cache, once per
// distinct content, in blob order, with their compressed size in all.
func (l *Served) plan() ([]chunkKey, int64) {
	var keys []chunkKey
	var offs []int64 // the keys' blob offsets
	var total int64
	seen := map[chunked.Sum]bool{}
	for id := range chunked.EntryID(l.idx.Len()) {
		e := l.idx.Meta(id)
		if e.Type != chunked.TypeReg || e.Inode != id || e.Size == 0 || e.Digest.IsZero() ||
			seen[e.Digest] || l.env.cache.Has(e.Digest) {
			continue
		}
		seen[e.Digest] = true
		for i := range l.idx.NumChunks(id) { // one at a time: a hostile file has millions
			c, _ := l.idx.Chunk(id, i)
			keys = append(keys, chunkKey{id, i})
			offs = append(offs, c.Offset)
			total += c.Length
		}
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(offs[a], offs[b]) })
	sorted := make([]chunkKey, len(keys))
	for i, j := range order {
		sorted[i] = keys[j]
	}
	return sorted, total
}

// payload serves CheckDiffID the complete files from the cache.
func (l *Served) payload(_ context.Context, id chunked.EntryID) (io.ReadCloser, error) {
	e := l.idx.Entry(id)
	h, err := l.env.files.acquire(e.Digest, e.Size)
	if err != nil {
		return nil, err
	}
	if !h.f.Complete() {
		l.env.files.release(h)
		return nil, fmt.Errorf("%s is no longer complete in the cache", e.Name)
	}
	return &payloadReader{SectionReader: io.NewSectionReader(h.f, 0, e.Size), release: func() { l.env.files.release(h) }}, nil
}

type payloadReader struct {
	*io.SectionReader
	release func()
	once    sync.Once
}

func (r *payloadReader) Close() error {
	r.once.Do(r.release)
	return nil
}
