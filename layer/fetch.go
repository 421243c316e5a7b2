package layer

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/verify"
)

// fetchKind is why chunks are fetched, which decides how the fetch shares the link and the
// processors with the others.
type fetchKind int

const (
	// onDemand: a read a runtime waits for. Background work yields while it runs, and it
	// returns before its chunks are written to the cache.
	onDemand fetchKind = iota
	// ahead: the next chunk of a file read in sequence, fetched before the reader asks
	// (fetchAhead). Nobody waits for it yet: it does not hold background work up, and stores
	// before it forgets its calls, as background work does.
	ahead
	// background: the whole layer, fetched and verified behind the reads (prefetch.go). It
	// yields to on-demand fetches, and verifies at most one chunk per processor at a time.
	background
)

// fetchCall is one chunk being fetched; every reader of the chunk waits for the same call.
// A failed call stays in flight for the negative TTL (failedUntil), so that readers asking
// again meanwhile fail at once: the kernel retries a failed readahead with a small read, which
// would otherwise wait a whole read timeout again on a registry that hangs.
type fetchCall struct {
	done        chan struct{}
	data        []byte       // the chunk's verified content
	c           verify.Chunk // set when fetched here (not taken from the cache), for storing
	err         error
	failedUntil time.Time // guarded by Layer.mu; set once err is
}

// claimable reports whether a new fetch may replace c: c failed and its failure has been
// remembered long enough. Called with l.mu held.
func (c *fetchCall) claimable(now time.Time) bool {
	return !c.failedUntil.IsZero() && !now.Before(c.failedUntil)
}

// fetch returns the verified content of chunks idx of one file, fetching those nobody is
// fetching yet in one batch of range requests, together with the chunks that follow the last
// of them in the blob (readAhead) that nobody is fetching either. A demand read (one a runtime
// waits for) makes background work yield and returns before its chunks are written to the
// cache; background batches write first. h, when not nil, is the caller's handle on the
// file's cache entry, where it found the chunks missing.
func (l *Layer) fetch(ctx context.Context, file chunked.EntryID, idx []int, h *handle) ([][]byte, error) {
	keys := make([]chunkKey, len(idx))
	for i, c := range idx {
		keys[i] = chunkKey{file, c}
	}
	var stored func(chunkKey) []byte
	if h != nil {
		stored = func(k chunkKey) []byte {
			ref := l.ref(k)
			if ref.Size == 0 || len(h.f.Missing(ref.FileOffset, ref.Size)) > 0 {
				return nil
			}
			b, err := h.f.ReadChunk(ref)
			if err != nil {
				return nil
			}
			return b
		}
	}
	return l.fetchKeys(ctx, keys, func() []chunkKey { return l.readAhead(file, idx[len(idx)-1]) }, stored, onDemand)
}

// fetchKeys fetches keys, which the caller waits for, and the chunks extra returns (when not
// nil), which it does not: extra chunks somebody is already fetching are left to them.
//
// A chunk the caller found missing may have been stored, and so no longer be in flight, by
// the time it is claimed here: stored (when not nil) looks for each claimed key in the cache
// again, after the claim, so that such a chunk is not fetched twice. (Storing writes to the
// cache before it forgets the call.)
func (l *Layer) fetchKeys(ctx context.Context, keys []chunkKey, extra func() []chunkKey, stored func(chunkKey) []byte, kind fetchKind) ([][]byte, error) {
	calls := make([]*fetchCall, len(keys))
	var mine []chunkKey
	var mineCalls []*fetchCall
	now := l.m.opts.now()
	l.mu.Lock()
	for i, k := range keys {
		if c := l.inflight[k]; c != nil && !c.claimable(now) {
			calls[i] = c
			continue
		}
		c := &fetchCall{done: make(chan struct{})}
		l.inflight[k] = c
		calls[i] = c
		mine = append(mine, k)
		mineCalls = append(mineCalls, c)
	}
	l.mu.Unlock()
	if stored != nil {
		mine, mineCalls = l.takeStored(mine, mineCalls, stored)
	}
	if len(mine) > 0 && extra != nil {
		more := extra()
		l.mu.Lock()
		for _, k := range more {
			if c := l.inflight[k]; c == nil || c.claimable(now) {
				c := &fetchCall{done: make(chan struct{})}
				l.inflight[k] = c
				mine = append(mine, k)
				mineCalls = append(mineCalls, c)
			}
		}
		l.mu.Unlock()
	}

	if len(mine) > 0 {
		if kind == onDemand {
			l.m.sched.demandStart()
		}
		l.run(ctx, mine, mineCalls, kind)
		if kind == onDemand {
			l.m.sched.demandEnd()
		}
		l.forgetFailed(mine, mineCalls)
		if kind == onDemand {
			l.storeLater(mine, mineCalls)
		} else {
			l.store(mine, mineCalls)
		}
	}
	out := make([][]byte, len(keys))
	for i, c := range calls {
		select {
		case <-c.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if c.err != nil {
			return nil, c.err
		}
		out[i] = c.data
	}
	return out, nil
}

// takeStored completes the calls whose chunks stored finds, forgets them, and returns the
// other keys and calls.
func (l *Layer) takeStored(keys []chunkKey, calls []*fetchCall, stored func(chunkKey) []byte) ([]chunkKey, []*fetchCall) {
	var restKeys, doneKeys []chunkKey
	var restCalls, doneCalls []*fetchCall
	for i, k := range keys {
		if b := stored(k); b != nil {
			calls[i].data = b
			close(calls[i].done)
			doneKeys, doneCalls = append(doneKeys, k), append(doneCalls, calls[i])
			continue
		}
		restKeys, restCalls = append(restKeys, k), append(restCalls, calls[i])
	}
	if len(doneKeys) > 0 {
		l.forget(doneKeys, doneCalls, func(*fetchCall) bool { return true })
	}
	return restKeys, restCalls
}

// run fetches and verifies the chunks of calls, and completes the calls. It does not depend on
// the caller's context: other readers may be waiting for the same chunks.
func (l *Layer) run(ctx context.Context, keys []chunkKey, calls []*fetchCall, kind fetchKind) {
	ctx, cancel := l.m.bound(ctx, l.m.opts.readTimeout)
	defer cancel()
	refs := make([]chunked.Chunk, len(keys))
	var ranges []chunked.Range
	for i, k := range keys {
		refs[i] = l.idx.Chunks(k.file)[k.i]
		if refs[i].Length > 0 {
			ranges = append(ranges, refs[i].Range)
		}
	}
	bufs, err := l.blob.Fetch(ctx, ranges)
	if err != nil {
		for _, c := range calls {
			c.err = err
			close(c.done)
		}
		return
	}
	var fetched int64
	for _, r := range ranges {
		fetched += r.Length
	}
	if kind != background {
		l.onDemand.Add(fetched)
		l.m.counters.onDemandBytes.Add(fetched)
	} else {
		l.prefetched.Add(fetched)
		l.m.counters.prefetchBytes.Add(fetched)
	}
	// Hand each chunk its bytes in order, then verify them in parallel.
	raws := make([][]byte, len(keys))
	j := 0
	for i := range keys {
		if refs[i].Length > 0 {
			raws[i] = bufs[j]
			j++
		}
	}
	parallel(len(keys), func(i int) {
		if kind == background {
			// Background decompression would take every core: it steps aside, chunk by
			// chunk, while a read a runtime waits for is being fetched and verified, and
			// keeps at most one runnable goroutine per core, so that the goroutines serving
			// FUSE requests find a processor soon.
			_ = l.m.sched.yield(ctx)
			l.m.backgroundCPU <- struct{}{}
			defer func() {
				<-l.m.backgroundCPU
				runtime.Gosched()
			}()
		}
		c, err := l.v.VerifyChunk(keys[i].file, keys[i].i, raws[i])
		if err != nil {
			l.m.counters.verifyFailures.Add(1)
			l.m.opts.log.Warn("chunk refused", "layer", l.desc.Digest, "err", err)
		}
		calls[i].c, calls[i].data, calls[i].err = c, c.Bytes(), err
		close(calls[i].done)
	})
}

// parallel calls fn for 0..n-1 on up to GOMAXPROCS goroutines.
func parallel(n int, fn func(int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
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

// readAhead returns the chunks that follow chunk i of file in the blob, within the read-ahead
// window past its end: the rest of the file, then the next files in TOC order (the order of
// their content in the blob), skipping files complete in the cache. A cold read costs a round
// trip; the files beside it in the blob (the same directory's) are often read next, and a
// small window costs little bandwidth. It stops at the first chunk not further in the blob.
func (l *Layer) readAhead(file chunked.EntryID, i int) []chunkKey {
	window := l.m.opts.readAhead
	if window <= 0 {
		return nil
	}
	cs := l.idx.Chunks(file)
	pos, limit := cs[i].Offset, cs[i].End()+window
	content := int64(0) // uncompressed: a window of zeros may hold a thousand times its size
	var out []chunkKey
	// take adds the chunks of id from the from-th on; false once one is not next in the blob.
	take := func(id chunked.EntryID, from int) bool {
		cs := l.idx.Chunks(id)
		for j := from; j < len(cs); j++ {
			c := cs[j]
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
		e := l.idx.Entry(id)
		if e.Type != chunked.TypeReg || e.Inode != id || e.Size == 0 || e.Digest.IsZero() || l.m.cache.Has(e.Digest) {
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

// forgetFailed marks failed calls to be replaced after the negative TTL (at once when it is
// zero): until then, readers of their chunks get the same error without a request.
func (l *Layer) forgetFailed(keys []chunkKey, calls []*fetchCall) {
	until := l.m.opts.now().Add(l.m.opts.negativeTTL)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, k := range keys {
		c := calls[i]
		if c.err == nil || l.inflight[k] != c {
			continue
		}
		if l.m.opts.negativeTTL <= 0 {
			delete(l.inflight, k)
			continue
		}
		c.failedUntil = until
	}
}

// forget removes the calls of keys that match from the chunks in flight.
func (l *Layer) forget(keys []chunkKey, calls []*fetchCall, match func(*fetchCall) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, k := range keys {
		if match(calls[i]) && l.inflight[k] == calls[i] {
			delete(l.inflight, k)
		}
	}
}

// store writes the verified chunks of finished calls to the cache, then forgets the calls:
// from then on readers find the chunks in the cache. Files whose every chunk is among them
// (small files, whole in one background batch) are stored whole, in one group commit for all
// of them (cache.PutFiles: two syncfs calls rather than several fsyncs per file); the chunks
// of the other files are stored one by one.
func (l *Layer) store(keys []chunkKey, calls []*fetchCall) {
	var whole []cache.Content
	var wholeIDs []chunked.EntryID
	byFile := map[chunked.EntryID][]int{}
	var order []chunked.EntryID
	for i, c := range calls {
		if c.err != nil || l.idx.Entry(keys[i].file).Digest.IsZero() {
			continue
		}
		f := keys[i].file
		if _, ok := byFile[f]; !ok {
			order = append(order, f)
		}
		byFile[f] = append(byFile[f], i)
	}
	for _, f := range order {
		if cs := l.wholeFile(f, keys, calls, byFile[f]); cs != nil {
			e := l.idx.Entry(f)
			whole = append(whole, cache.Content{Sum: e.Digest, Size: e.Size, Chunks: cs})
			wholeIDs = append(wholeIDs, f)
			continue
		}
		for _, i := range byFile[f] {
			l.keep(f, calls[i].c)
		}
	}
	if len(whole) > 0 {
		for i, err := range l.m.cache.PutFiles(whole) {
			switch {
			case err == nil || errors.Is(err, cache.ErrClosed):
			case errors.Is(err, cache.ErrNoSpace):
				// Logged by the cache, at a bounded rate; the background fetch stops.
				l.cacheFull.Store(true)
			case errors.Is(err, cache.ErrBadChunk):
				// Not a tiling the cache takes whole: store the chunks one by one.
				for _, c := range whole[i].Chunks {
					l.keep(wholeIDs[i], c)
				}
			default:
				l.m.opts.log.Warn("caching a file failed", "file", l.idx.Entry(wholeIDs[i]).Name, "err", err)
			}
		}
	}
	l.forget(keys, calls, func(c *fetchCall) bool { return c.err == nil })
}

// storeLater stores in the background, so that a demand read returns first.
func (l *Layer) storeLater(keys []chunkKey, calls []*fetchCall) {
	l.m.goTracked(func() { l.store(keys, calls) })
}

// fetchAhead fetches chunk i of file in the background, unless somebody is fetching it: a
// reader going through a file in sequence then finds the next chunk fetched and verified, or
// on its way, when it gets there, rather than paying a round trip and a verification per chunk.
func (l *Layer) fetchAhead(file chunked.EntryID, i int) {
	k := chunkKey{file, i}
	l.mu.Lock()
	busy := l.inflight[k] != nil
	l.mu.Unlock()
	if !busy {
		l.m.goTracked(func() { _, _ = l.fetchKeys(l.m.ctx, []chunkKey{k}, nil, nil, ahead) })
	}
}

// wholeFile returns the chunks of file f in order when calls (at indexes idx) hold every one
// of them; nil otherwise.
func (l *Layer) wholeFile(f chunked.EntryID, keys []chunkKey, calls []*fetchCall, idx []int) []verify.Chunk {
	n := len(l.idx.Chunks(f))
	if len(idx) < n {
		return nil
	}
	cs := make([]verify.Chunk, n)
	have := 0
	for _, i := range idx {
		k := keys[i].i
		if cs[k].Ref().Size == 0 {
			have++
		}
		cs[k] = calls[i].c
	}
	if have != n {
		return nil
	}
	return cs
}
