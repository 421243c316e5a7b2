package layer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/verify"
)

// fetchKind is why chunks are fetched, which decides how the fetch shares the link and the
// processors with the others.
type fetchKind int

const (
	// onDemand: a read a runtime waits for. Background work yields while it runs, and it
	// returns before its chunks are written to the cache.
	onDemand fetchKind = iota
	// ahead: the next chunk of a file read in sequence (fetchAhead), the rest of a region
	// (fetchRegion), what a prediction reads (predict.go): fetched before a reader asks.
	// Nobody waits for it yet: it does not hold background work up, and stores before it
	// forgets its fetches, as background work does.
	ahead
	// background: the whole layer, fetched and verified behind the reads (prefetch.go). It
	// yields to on-demand fetches, and verifies at most one chunk per processor at a time.
	background
	// replay: background work fetching a startup profile's files (profile.go): the same as
	// background but counted apart.
	replay
)

// isBackground reports whether fetches of the kind are the background fetch's.
func (k fetchKind) isBackground() bool { return k == background || k == replay }

// A fetch is one chunk being fetched, named by its key; every reader of the chunk waits for
// the same fetch. A failed fetch stays in flight for the negative TTL (failedUntil), so that
// readers asking again meanwhile fail at once: the kernel retries a failed readahead with a
// small read, which would otherwise wait a whole read timeout again on a registry that hangs.
type fetch struct {
	key   chunkKey
	chunk chunked.Chunk // where the chunk is: its bytes in the blob, its place in the file
	done  chan struct{}
	// settled is closed once the chunk is in the cache as far as this fetch puts it there
	// (stored, found there, or failed): an on-demand fetch completes done before it stores.
	settled chan struct{}

	// Written once, before done is closed.
	data     []byte           // the chunk's verified content
	verified verify.ChunkData // set when fetched here (not taken from the cache), for storing
	err      error

	failedUntil time.Time // guarded by Served.mu; set once err is

	// wanted: a reader waits for it (want.waits): a background fetch does not put its
	// verification below the runtimes' priority (idlecpu.go).
	wanted atomic.Bool
}

// readChunks reads chunks first..last of file id into p, which holds the file from off: the
// cold path of read, whose cache file h (nil when the cache is unavailable) is not complete.
// The chunks h holds are read from there, the others fetched (fetchMissing); a file read in
// sequence (the chunk before the last one read is present, the one after it is not) also has
// the next chunk fetched ahead.
func (l *Served) readChunks(ctx context.Context, h *handle, id chunked.EntryID, p []byte, off int64, first, last int, kind fetchKind) (int, error) {
	chunk := func(i int) chunked.Chunk { c, _ := l.idx.Chunk(id, i); return c }
	var missing []int
	for i := first; i <= last; i++ {
		if h != nil {
			// Only the part of the chunk the read wants: the kernel reads a large file in
			// pieces far smaller than its chunks.
			c := chunk(i)
			lo, hi := max(off, c.FileOffset), min(off+int64(len(p)), c.FileOffset+c.Size)
			if _, err := h.f.ReadChunkAt(c, p[lo-off:hi-off], lo); err == nil {
				continue
			}
		}
		missing = append(missing, i)
	}
	next := 0 // none: chunk 0 never follows another
	if kind == onDemand && h != nil && last > 0 && last+1 < l.idx.NumChunks(id) {
		// Read in sequence (the previous chunk is here, the next one is not): fetch the
		// next one meanwhile.
		prev, n := chunk(last-1), chunk(last+1)
		if len(h.f.Missing(prev.FileOffset, prev.Size)) == 0 && len(h.f.Missing(n.FileOffset, n.Size)) > 0 {
			next = last + 1
		}
	}
	if len(missing) == 0 {
		if next > 0 {
			l.fetchAhead(chunkKey{id, next})
		}
		return len(p), nil
	}
	got, err := l.fetchMissing(ctx, id, missing, h, next, kind)
	if err != nil {
		return 0, err
	}
	for k, b := range got {
		byterange.Copy(p, off, b, chunk(missing[k]).FileOffset)
	}
	return len(p), nil
}

// fetchMissing returns the verified content of chunks idx of file, which a read found missing
// in its cache file h (nil when it has none); next, when above 0, is a chunk to fetch ahead,
// and kind onDemand for a read a runtime waits for, ahead for a prediction's (predict.go).
// The chunks are fetched as every caller's are (fetchChunks), then waited for.
//
// A read that had to wait for the registry (a chunk of its own to fetch, or one another read
// or the fetch-ahead was still fetching) counts its wait in the read-wait histogram and in
// the layer's status (readSet.wait); a prediction's does not.
func (l *Served) fetchMissing(ctx context.Context, file chunked.EntryID, idx []int, h *handle, next int, kind fetchKind) ([][]byte, error) {
	keys := make([]chunkKey, len(idx))
	for i, c := range idx {
		keys[i] = chunkKey{file, c}
	}
	start := time.Now()
	needed, own := l.fetchChunks(ctx, keys, want{kind: kind, h: h, next: next, waits: true})
	waits := own || !allDone(needed)
	out, err := wait(ctx, needed)
	if waits && kind == onDemand {
		d := time.Since(start)
		l.env.counters.readWait.Observe(d)
		l.reads.wait(d, own)
		if l.env.log.Enabled(ctx, slog.LevelDebug) { // a slow start's reads, one by one
			l.env.log.Debug("read waited for the registry", "layer", l.desc.Digest, "path", l.idx.Path(file),
				"chunk", idx[0], "chunks", len(idx), "request", own, "waited", d, "err", err)
		}
	}
	return out, err
}

// A want is what a caller of fetchChunks asks besides the chunks themselves.
type want struct {
	kind fetchKind
	// h is the caller's handle on the chunks' cache file, nil when it has none: a chunk
	// stored since the caller looked is taken from there.
	h *handle
	// next, when above 0, is a chunk of the same file fetched ahead, beside the others (the
	// file is read in sequence).
	next int
	// waits: the caller waits for the chunks, as a reader does; a background fetch of one
	// then verifies it at the daemon's priority, not below (idlecpu.go).
	waits bool
	// detach: the fetch is run on the manager's work group, after fetchChunks returns and
	// with its context (the manager's): a fetch beside a read, which nobody waits for yet.
	// then, when not nil, is called once it has run, or at once when nothing was left to
	// fetch.
	detach bool
	then   func()
}

// fetchChunks is how chunks of the layer come to be present, whoever asks: a read of the
// runtime (onDemand), a prediction (ahead), the background fetch or a profile's replay. w.kind
// decides how the work is scheduled, not what is done. It returns the fetches of keys, in
// order, for the caller to wait for (wait) or to see stored (settle), and whether any was
// its own to fetch. Step by step:
//
//  1. claim: the chunks nobody is fetching become this call's fetches; the others' fetches
//     are shared;
//  2. look in the cache again (w.h): a chunk stored since the caller looked (a fetch writes
//     to the cache before it is forgotten) is taken from there rather than fetched twice;
//  3. if anything is left to fetch for a read of the runtime, claim the chunks that follow
//     the last one in the blob (readAhead) too, those nobody is fetching (nobody waits for
//     them), and fetch the region around the first (fetchRegion); the other kinds fetch
//     what they name only (a prediction's file is coming whole, or is too large to);
//  4. fetch w.next ahead, on its own, unless the read-ahead took it;
//  5. mark the fetches wanted when the caller waits for them;
//  6. run: fetch this call's chunks in one batch of range requests, verify each as it
//     arrives, complete each fetch, and store them (before run returns, or after for a read
//     of the runtime); now, or on the manager's work group (w.detach, and a read of the
//     runtime, which waits for its own chunks only, not for the read-ahead behind them).
func (l *Served) fetchChunks(ctx context.Context, keys []chunkKey, w want) (all []*fetch, own bool) {
	all, mine := l.claim(w.h, keys)
	own = len(mine) > 0
	if own && w.kind == onDemand {
		_, more := l.claim(nil, l.readAhead(keys[len(keys)-1]))
		mine = append(mine, more...)
		l.fetchRegion(keys[0], w.h)
	}
	if w.next > 0 {
		l.fetchAhead(chunkKey{keys[0].file, w.next})
	}
	if w.waits {
		for _, f := range all {
			f.wanted.Store(true)
		}
	}
	switch {
	case !w.detach && w.kind == onDemand && len(mine) > 0:
		// The reader waits for its own chunks (fetchMissing), each completed once it has
		// arrived and verified, not for the read-ahead behind them in the same request.
		l.env.life.goTracked(func() { l.run(ctx, mine, w.kind) })
	case !w.detach:
		l.run(ctx, mine, w.kind)
	case len(mine) > 0:
		l.env.life.goTracked(func() {
			if w.then != nil {
				defer w.then()
			}
			l.run(ctx, mine, w.kind)
		})
	case w.then != nil:
		w.then()
	}
	return all, own
}

// allDone reports whether every fetch of fetches has completed.
func allDone(fetches []*fetch) bool {
	for _, f := range fetches {
		select {
		case <-f.done:
		default:
			return false
		}
	}
	return true
}

// fetchAhead fetches chunk k in the background, unless somebody is fetching it: a reader
// going through a file in sequence then finds the next chunk fetched and verified, or on its
// way, when it gets there, rather than paying a round trip and a verification per chunk.
func (l *Served) fetchAhead(k chunkKey) {
	l.fetchChunks(l.env.life.ctx, []chunkKey{k}, want{kind: ahead, detach: true})
}

// fetchRegion fetches, beside a cold read of chunk k and without the reader waiting
// for it, the rest of the region of the file around that chunk: the file's bytes in the
// aligned window of regionBase bytes that holds the chunk's start, a window that doubles with
// every cold read of the same file, up to regionMax, from the first cold read of a file that
// is mapped (executed, or a library predicted: predict.go) and from the second of others (a
// file read from its start has the kernel's readahead and ours; a second cold read shows
// reads here and there). Formats differ in chunk size (eStargz's
// are 4 MiB of content by default; zstd:chunked cuts a file into chunks of some tens of KiB),
// and a program mapped from the layer faults its pages in here and there: without regions, a
// zstd:chunked layer costs a round trip per fault where eStargz costs one per 4 MiB. A file
// read once costs at most its first window; a file read again and again is fetched in ever
// larger parts. A region holds at most its window of content (the chunks that start in it,
// until it is full), and nothing is done when read-ahead is off or regionSlots region
// fetches are in flight already: regions hold at most regionSlots x regionMax of content.
func (l *Served) fetchRegion(k chunkKey, h *handle) {
	if l.env.readAhead <= 0 {
		return
	}
	keys := l.region(k.file, k.i)
	if len(keys) == 0 {
		return
	}
	select {
	case l.env.regions <- struct{}{}:
	default:
		return
	}
	l.fetchChunks(l.env.life.ctx, keys, want{kind: ahead, h: h, detach: true, then: func() { <-l.env.regions }})
}

// region counts a cold read of chunk i of file and returns the other chunks of the file's
// region around it (fetchRegion): at most the window's size of content.
func (l *Served) region(file chunked.EntryID, i int) []chunkKey {
	l.mu.Lock()
	if len(l.cold) >= maxColdFiles {
		clear(l.cold)
	}
	n := l.cold[file]
	if n < 255 {
		l.cold[file] = n + 1
	}
	mapped := l.predicted[file]
	l.mu.Unlock()
	if !mapped {
		// Read, not mapped, as far as anyone knows: a reader going through the file from its
		// start has the kernel's readahead and ours; a second cold read shows reads here and
		// there.
		if n == 0 {
			return nil
		}
		n--
	}
	size := int64(regionMax)
	if n < 8 && regionBase<<n < regionMax {
		size = regionBase << n
	}
	c, _ := l.idx.Chunk(file, i)
	lo := c.FileOffset / size * size
	var keys []chunkKey
	content := int64(0) // at most size: the chunks that start in the window, until it is full
	for j := l.idx.ChunkAt(file, lo); j >= 0 && j < l.idx.NumChunks(file); j++ {
		r, _ := l.idx.Chunk(file, j)
		if r.FileOffset >= lo+size || content+r.Size > size {
			break
		}
		if r.FileOffset >= lo && r.Length > 0 && j != i {
			content += r.Size
			keys = append(keys, chunkKey{file, j})
		}
	}
	return keys
}

// Regions (fetchRegion): the first window of a file, the largest, how many files' cold reads
// are counted (the count starts again past it), and how many region fetches run at once.
const (
	regionBase   = 1 << 20
	regionMax    = 4 << 20
	maxColdFiles = 4096
	regionSlots  = 4
)

// claim returns the fetches of keys, in order. The chunks nobody is fetching (or whose failure
// has been remembered long enough) get new fetches; those whose chunk the cache file h, when
// not nil, holds by now are completed from there and forgotten, and the others are also
// returned as mine: the caller must run them, or complete them otherwise.
func (l *Served) claim(h *handle, keys []chunkKey) (all, mine []*fetch) {
	now := l.env.now()
	l.mu.Lock()
	for _, k := range keys {
		f := l.inflight[k]
		if f == nil || (!f.failedUntil.IsZero() && !now.Before(f.failedUntil)) {
			f = &fetch{key: k, chunk: l.ref(k), done: make(chan struct{}), settled: make(chan struct{})}
			l.inflight[k] = f
			mine = append(mine, f)
		}
		all = append(all, f)
	}
	l.mu.Unlock()
	return all, l.takeCached(h, mine)
}

// takeCached completes the fetches of mine whose chunk the cache file h holds by now, forgets
// them, and returns the others.
func (l *Served) takeCached(h *handle, mine []*fetch) []*fetch {
	if h == nil {
		return mine
	}
	var rest, found []*fetch
	for _, f := range mine {
		c := f.chunk
		if h.holds(c) {
			if b, err := h.f.ReadChunk(c); err == nil {
				f.data = b
				close(f.done)
				close(f.settled)
				found = append(found, f)
				continue
			}
		}
		rest = append(rest, f)
	}
	l.forget(found)
	return rest
}

// settle returns once every one of fetches has settled (its chunk stored), or ctx has ended.
func settle(ctx context.Context, fetches []*fetch) error {
	for _, f := range fetches {
		select {
		case <-f.settled:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// wait returns the content of fetches, in order, once every one has completed: the first
// error of one, or ctx's.
func wait(ctx context.Context, fetches []*fetch) ([][]byte, error) {
	out := make([][]byte, len(fetches))
	for i, f := range fetches {
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.err != nil {
			return nil, f.err
		}
		out[i] = f.data
	}
	return out, nil
}

// run fetches the chunks of batch in one set of range requests, verifies them, completes
// each fetch, and stores the verified chunks: for a demand read, after it returns (its
// fetches stay in flight until then, so nobody fetches them again); otherwise before run
// returns. A failed fetch is remembered for the negative TTL. A demand fetch holds background
// work up while it runs; a fetch ahead of the reads (a prediction's, a region's) holds up the
// rest of the layer while it runs and for the quiet period after it, without holding up what
// is fetched at once (prioritized files, a profile's replay).
func (l *Served) run(ctx context.Context, batch []*fetch, kind fetchKind) {
	if len(batch) == 0 {
		return
	}
	switch kind {
	case onDemand:
		l.env.sched.demandStart()
	case ahead:
		l.env.sched.aheadStart() // a container is starting: the rest of the layer waits its turn
	}
	l.fetchAndVerify(ctx, batch, kind)
	switch kind {
	case onDemand:
		l.env.sched.demandEnd()
	case ahead:
		l.env.sched.aheadEnd()
	}
	if kind == onDemand {
		l.env.life.goTracked(func() { l.store(batch) })
	} else {
		l.store(batch)
	}
}

// fetchAndVerify fetches the bytes of batch's chunks, verifies each as its bytes arrive, and
// completes its fetch once verified: a reader waits for its own chunk, decompressed while it
// comes in, not for the rest of the batch. It does not depend on the caller's context: other
// readers may be waiting for the same chunks; the read timeout and the manager's lifetime
// bound it.
func (l *Served) fetchAndVerify(ctx context.Context, batch []*fetch, kind fetchKind) {
	ctx, cancel := l.env.life.bound(ctx, l.env.readTimeout)
	defer cancel()
	ids := make([]verify.ChunkID, len(batch))
	for i, f := range batch {
		ids[i] = verify.ChunkID{File: f.key.file, I: f.key.i}
	}
	got, err := l.v.ReadChunks(ctx, l.blob, ids)
	if err != nil {
		for _, f := range batch {
			l.fail(f, err)
		}
		return
	}
	// Verify in parallel, each chunk as it arrives: the chunks' bytes leave verify only
	// verified.
	parallel(cap(l.env.sched.cpu), len(batch), func(i int) {
		f := batch[i]
		var c verify.ChunkData
		var err error
		verifyChunk := func() { c, err = got.Verify(i) }
		if !kind.isBackground() {
			verifyChunk()
		} else {
			// The background fetch's chunks (the rest of the layer, and prioritized files,
			// which name whole files, a large library for the little a start reads of it)
			// below the runtimes' priority, but for one a reader waits for. A replay fetches
			// the chunks a start read, and verifies them as a read does (below, learned starts
			// on a fast link were slower when it did not: benchmarks/README.md, the row of
			// the background fetch below the runtimes' priority). Its bytes come first: the
			// turn is for the processors, not for the link.
			got.Arrived(i)
			release := l.env.sched.verifying(ctx)
			if kind == background && !f.wanted.Load() {
				l.env.sched.idle.run(verifyChunk)
			} else {
				verifyChunk()
			}
			release()
		}
		switch {
		case err == nil:
			l.counted(kind, f.chunk.Length)
			f.verified, f.data = c, c.Bytes()
			close(f.done)
		case readFailed(got, err): // its bytes did not come: no verdict on the chunk
			l.fail(f, err)
		default:
			l.counted(kind, f.chunk.Length)
			l.env.counters.verifyFailures.Add(1)
			l.env.log.Warn("chunk refused", "layer", l.desc.Digest, "err", err)
			l.fail(f, err)
		}
	})
	if took, err := got.Wait(); err == nil {
		l.link.observe(got.Size(), took)
	}
}

// readFailed reports whether err, a chunk's failure, is that of the read of got: its bytes did
// not come.
func readFailed(got *verify.Fetched, err error) bool {
	_, rerr := got.Wait()
	return rerr != nil && errors.Is(err, rerr)
}

// counted counts n compressed bytes fetched for a fetch of kind.
func (l *Served) counted(kind fetchKind, n int64) {
	switch kind {
	case replay:
		l.prefetched.Add(n)
		l.profiled.Add(n)
		l.env.counters.profileBytes.Add(n)
	case background:
		l.prefetched.Add(n)
		l.env.counters.prefetchBytes.Add(n)
	default:
		l.onDemand.Add(n)
		l.env.counters.onDemandBytes.Add(n)
	}
}

// parallel calls fn for 0..n-1 on up to workers goroutines.
func parallel(workers, n int, fn func(int)) {
	workers = min(n, workers)
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// readAhead returns the chunks that follow chunk k in the blob, within the read-ahead
// window past its end: the rest of the file, then the next files in TOC order (the order of
// their content in the blob), skipping files complete in the cache. A cold read costs a round
// trip; the files beside it in the blob (the same directory's) are often read next, and a
// small window costs little bandwidth. It stops at the first chunk not further in the blob.
func (l *Served) readAhead(k chunkKey) []chunkKey {
	window := l.env.readAhead
	if window <= 0 {
		return nil
	}
	file, i := k.file, k.i
	ci, _ := l.idx.Chunk(file, i)
	pos, limit := ci.Offset, ci.End()+window
	content := int64(0) // uncompressed: a window of zeros may hold a thousand times its size
	var out []chunkKey
	// take adds the chunks of id from the from-th on; false once one is not next in the blob.
	take := func(id chunked.EntryID, from int) bool {
		for j := from; j < l.idx.NumChunks(id); j++ {
			c, _ := l.idx.Chunk(id, j)
			if c.Length == 0 {
				continue // no bytes (zeros)
			}
			if c.Offset < pos || c.End() > limit || content+c.Size > readAheadContent*window {
				return false
			}
			pos = c.Offset
			content += c.Size
			out = append(out, chunkKey{id, j})
		}
		return true
	}
	if !take(file, i+1) {
		return out
	}
	for id, scanned := file+1, 0; int(id) < l.idx.Len() && scanned < readAheadEntries; id, scanned = id+1, scanned+1 {
		e := l.idx.Meta(id)
		if e.Type != chunked.TypeReg || e.Inode != id || e.Size == 0 || e.Digest.IsZero() || l.env.cache.Has(e.Digest) {
			continue
		}
		if !take(id, 0) {
			break
		}
	}
	return out
}

// readAheadEntries bounds the TOC entries readAhead looks at (directories and links between
// files hold no bytes), and readAheadContent the uncompressed bytes it adds, in windows.
const (
	readAheadEntries = 256
	readAheadContent = 16
)

// fail completes fetch f with err, and marks it to be replaced after the negative TTL (at once
// when it is zero): until then, readers of its chunk get the same error without a request.
// The TTL runs from the failure, not from the end of the batch it was part of.
func (l *Served) fail(f *fetch, err error) {
	f.err = err
	now := l.env.now()
	l.mu.Lock()
	if l.inflight[f.key] == f {
		ttl := l.env.negativeTTL
		if transientFailure(err) {
			ttl = min(ttl, transientNegativeTTL)
		}
		if ttl <= 0 {
			delete(l.inflight, f.key)
		} else {
			f.failedUntil = now.Add(ttl)
		}
	}
	l.mu.Unlock()
	close(f.done)
}

// transientNegativeTTL is how long a fetch that failed for the network's or the registry's
// sake (after its retries) is remembered: long enough for the kernel's immediate retry of the
// failed readahead, short enough that the next reader, another container of an image sharing
// the layer, asks the registry again instead of failing without a request.
const transientNegativeTTL = 250 * time.Millisecond

// transientFailure reports whether a fetch failed for the network's or registry's sake (its
// retries used up, or the read's time), not for the content's (a chunk that did not verify)
// or for good (not found, unauthorized).
func transientFailure(err error) bool {
	return errors.Is(err, fetcher.ErrTransient) || errors.Is(err, context.DeadlineExceeded)
}

// forget removes the fetches of batch that succeeded from the chunks in flight: from then on,
// readers look for their chunks in the cache.
func (l *Served) forget(batch []*fetch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range batch {
		if f.err == nil && l.inflight[f.key] == f {
			delete(l.inflight, f.key)
		}
	}
}

// store writes the verified chunks of a completed batch to the cache, then forgets their
// fetches. Files whose every chunk is in the batch (small files, whole in one background
// batch) are stored whole, in one group commit for all of them (cache.PutFiles: two syncfs
// calls rather than several fsyncs per file); the chunks of each other file are stored in one
// Put (two fsyncs: a batch of zstd:chunked holds tens of chunks of a large file).
func (l *Served) store(batch []*fetch) {
	byFile := map[chunked.EntryID][]*fetch{}
	var order []chunked.EntryID
	for _, f := range batch {
		if f.err != nil || l.idx.Entry(f.key.file).Digest.IsZero() {
			continue
		}
		if _, ok := byFile[f.key.file]; !ok {
			order = append(order, f.key.file)
		}
		byFile[f.key.file] = append(byFile[f.key.file], f)
	}
	var whole []cache.Content
	var wholeIDs []chunked.EntryID
	for _, id := range order {
		if cs := l.wholeFile(id, byFile[id]); cs != nil {
			e := l.idx.Meta(id)
			whole = append(whole, cache.Content{Sum: e.Digest, Size: e.Size, Chunks: cs})
			wholeIDs = append(wholeIDs, id)
			continue
		}
		cs := make([]verify.ChunkData, len(byFile[id]))
		for i, f := range byFile[id] {
			cs[i] = f.verified
		}
		l.putChunks(id, cs...)
	}
	if len(whole) > 0 {
		for i, err := range l.env.cache.PutFiles(whole) {
			switch {
			case err == nil || errors.Is(err, cache.ErrClosed):
			case errors.Is(err, cache.ErrNoSpace):
				// Logged by the cache, at a bounded rate; the background fetch stops.
				l.cacheFull.Store(true)
			case errors.Is(err, cache.ErrBadChunk):
				// Not a tiling the cache takes whole: store the chunks one by one.
				for _, c := range whole[i].Chunks {
					l.putChunks(wholeIDs[i], c)
				}
			default:
				l.env.log.Warn("caching a file failed", "file", l.idx.Entry(wholeIDs[i]).Name, "err", err)
			}
		}
	}
	l.forget(batch)
	for _, f := range batch {
		close(f.settled)
	}
}

// putChunks ensures verified chunks of file land in the cache, all in one Put (two syncs); a chunk
// the cache refuses as such is left out and the others kept. Failures only cost a refetch later.
func (l *Served) putChunks(file chunked.EntryID, cs ...verify.ChunkData) {
	e := l.idx.Meta(file)
	if e.Digest.IsZero() {
		return
	}
	h, err := l.env.files.acquire(e.Digest, e.Size)
	if err != nil {
		l.env.log.Warn("cache unavailable", "err", err)
		return
	}
	defer l.env.files.release(h)
	// A full cache disk fails every write: the cache logs that at a bounded rate.
	err = h.f.Put(cs...)
	if errors.Is(err, cache.ErrBadChunk) && len(cs) > 1 {
		for _, c := range cs { // keep the others of a chunk the cache refuses
			err = errors.Join(err, h.f.Put(c))
		}
	}
	switch {
	case err == nil || errors.Is(err, cache.ErrClosed):
	case errors.Is(err, cache.ErrNoSpace):
		l.cacheFull.Store(true)
	default:
		l.env.log.Warn("caching a chunk failed", "file", e.Name, "err", err)
	}
}

// wholeFile returns the verified chunks of file id in order when fetches hold every one of
// them; nil otherwise.
func (l *Served) wholeFile(id chunked.EntryID, fetches []*fetch) []verify.ChunkData {
	n := l.idx.NumChunks(id)
	if len(fetches) < n {
		return nil
	}
	cs := make([]verify.ChunkData, n)
	have := 0
	for _, f := range fetches {
		if cs[f.key.i].Ref().Size == 0 {
			have++
		}
		cs[f.key.i] = f.verified
	}
	if have != n {
		return nil
	}
	return cs
}
