package fetcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/layerstore/layerstore/internal/byterange"
)

// Blob reads byte ranges of one registry blob, from one or several sources (a registry and its
// mirrors). It is safe for concurrent use.
type Blob struct {
	eps  []*endpoint // where the blob can be read, the preferred one first
	size int64
	o    options

	cur atomic.Int32 // index in eps of the endpoint asked first; moves on when one fails

	// Counters, over all endpoints.
	requests atomic.Int64
	bytesIn  atomic.Int64
	retries  atomic.Int64
	waiting  atomic.Int64 // callers waiting on another caller's request (tests look at it)

	mu       sync.Mutex
	inflight map[byterange.Range]*call // guarded by mu: spans being fetched, for sharing
}

// endpoint is one place a blob can be read from: the registry, or one of its mirrors. The
// bytes are the same everywhere (a blob is addressed by its digest, and the caller verifies
// them), so any endpoint will do.
type endpoint struct {
	rt  http.RoundTripper // authenticated to the endpoint; used for its own host only
	url *url.URL          // the endpoint's blob URL

	noMulti atomic.Bool // set once: the endpoint does not answer multi-range requests properly

	mu       sync.Mutex
	location *url.URL // guarded by mu: cached redirect target, nil when none

	originMu sync.Mutex
	origin   []netip.Addr // guarded by originMu: the registry's addresses, nil until looked up
}

// call is one span being fetched into sp; done is closed once sp is full or err is set.
type call struct {
	done chan struct{}
	sp   *span
	err  error
}

// Stats are a Blob's counters since it was created.
type Stats struct {
	Requests      int64 // HTTP requests sent, redirect hops included (not a source's authentication)
	BytesReceived int64 // response body bytes read
	Retries       int64 // attempts after a transient failure
}

// newEndpoint checks an endpoint's transport and blob URL.
func newEndpoint(rt http.RoundTripper, blobURL string) (*endpoint, error) {
	if rt == nil {
		return nil, errors.New("fetcher: nil transport")
	}
	u, err := url.Parse(blobURL)
	if err != nil {
		return nil, errors.New("fetcher: malformed blob URL") // err quotes the URL and its secrets
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fetcher: blob URL %s is not an http(s) URL", redact(u))
	}
	return &endpoint{rt: rt, url: u}, nil
}

// newBlob returns a Blob reading from eps, the first one first: see [Blob.Fetch].
func newBlob(eps []*endpoint, size int64, o options) (*Blob, error) {
	if len(eps) == 0 {
		return nil, errors.New("fetcher: no endpoint to read the blob from")
	}
	if size < 0 {
		return nil, fmt.Errorf("fetcher: negative blob size %d", size)
	}
	o.storageRT = bounded(o.storageRT, o.stall)
	for _, ep := range eps {
		ep.rt = bounded(ep.rt, o.stall)
	}
	return &Blob{eps: eps, size: size, o: o, inflight: make(map[byterange.Range]*call)}, nil
}

// Size is the blob's size in bytes.
func (b *Blob) Size() int64 { return b.size }

// Stats returns the Blob's counters.
func (b *Blob) Stats() Stats {
	return Stats{Requests: b.requests.Load(), BytesReceived: b.bytesIn.Load(), Retries: b.retries.Load()}
}

// ReadAt reads len(p) bytes at off. It fills p completely or returns an error; reading past the
// end of the blob returns the bytes up to the end and io.EOF. The bytes are read into p as they
// arrive, and p may hold some of them after an error.
func (b *Blob) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("fetcher: %w: negative offset %d", ErrInvalidRange, off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if off >= b.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), b.size-off)
	r := byterange.Range{Offset: off, Length: n}
	if err := b.checkRanges(ctx, []byterange.Range{r}); err != nil {
		return 0, err
	}
	// The spans are read straight into p, each into its part: no buffer of their own, which
	// the heap would hold as garbage until a collection (a 48 MB TOC read in pieces, a
	// tar-split of tens of MB), and no copy. A request of p's is therefore not shared with
	// concurrent callers (Fetch's are): they would get bytes p's owner may overwrite.
	spans := coalesce([]byterange.Range{r}, b.o.maxGap, b.o.maxSpan)
	dst := make([]*span, len(spans))
	for j, sp := range spans {
		dst[j] = &span{b: p[sp.Offset-off : sp.End()-off]}
	}
	if err := b.inBatches(ctx, len(spans), func(ctx context.Context, lo, hi int) error {
		return b.fetchBatch(ctx, spans[lo:hi], dst[lo:hi])
	}); err != nil {
		return 0, err
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// Fetch returns the bytes of each range, in the order asked. Ranges must lie within the blob.
// See the package documentation for how ranges are coalesced and requested.
//
// The returned slices are read-only: to spare a copy of every byte, they are views of the
// buffers the responses were read into, which they may share with each other (overlapping or
// neighbouring ranges) and with the results of concurrent calls that shared a request.
func (b *Blob) Fetch(ctx context.Context, ranges []byterange.Range) ([][]byte, error) {
	if err := b.checkRanges(ctx, ranges); err != nil {
		return nil, err
	}
	spans := coalesce(ranges, b.o.maxGap, b.o.maxSpan)
	sps := newSpans(len(spans))
	if err := b.fetchShared(ctx, spans, sps); err != nil {
		return nil, err
	}
	out := make([][]byte, len(ranges))
	for k, r := range ranges {
		// Within one span (always, unless the range is longer than the maximum span): no copy;
		// the capacity is cut so that an append cannot write into the span. Else a copy.
		out[k], _ = newPart(r, spans, sps).Bytes() // every span is full
	}
	return out, nil
}

// checkRanges refuses ranges outside the blob, and a done ctx.
func (b *Blob) checkRanges(ctx context.Context, ranges []byterange.Range) error {
	for _, r := range ranges {
		if r.Offset < 0 || r.Length < 0 || r.Offset > b.size || r.Length > b.size-r.Offset {
			return fmt.Errorf("fetcher: %w: %d bytes at %d in a blob of %d",
				ErrInvalidRange, r.Length, r.Offset, b.size)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fetcher: %w", err)
	}
	return nil
}

// fetchShared fills sps, the buffers of spans, joining requests other callers already have in
// flight for identical spans and fetching the rest itself. A span whose request it joins takes
// that request's buffer once it is full; the others get buffers of their own.
func (b *Blob) fetchShared(ctx context.Context, spans []byterange.Range, sps []*span) error {
	pending := make([]int, len(spans))
	for i := range pending {
		pending[i] = i
	}
	for len(pending) > 0 {
		own := make(map[int]*call)
		joined := make(map[int]*call)
		var ownIdx []int
		b.mu.Lock()
		for _, i := range pending {
			if c, ok := b.inflight[spans[i]]; ok {
				joined[i] = c
				continue
			}
			if sps[i].b == nil {
				sps[i].b = make([]byte, spans[i].Length)
			}
			c := &call{done: make(chan struct{}), sp: sps[i]}
			b.inflight[spans[i]] = c
			own[i] = c
			ownIdx = append(ownIdx, i)
		}
		b.mu.Unlock()

		if len(ownIdx) > 0 {
			b.runOwned(ctx, spans, ownIdx, own)
			var firstErr error
			for _, i := range ownIdx {
				err := own[i].err
				// Prefer the failure that made runOwned cancel its other requests.
				if err != nil && (firstErr == nil || isContextErr(firstErr) && !isContextErr(err)) {
					firstErr = err
				}
			}
			if firstErr != nil {
				return firstErr
			}
		}

		pending = pending[:0]
		for i, c := range joined {
			b.waiting.Add(1)
			select {
			case <-c.done:
				b.waiting.Add(-1)
			case <-ctx.Done():
				b.waiting.Add(-1)
				return fmt.Errorf("fetcher: %w", ctx.Err())
			}
			if c.err != nil {
				if isContextErr(c.err) && ctx.Err() == nil {
					// The caller that owned the request gave up; ask again ourselves.
					pending = append(pending, i)
					continue
				}
				return c.err
			}
			sps[i].take(c.sp.b)
		}
	}
	return nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// runOwned fetches the spans idx (sorted), grouped into requests, and completes their calls.
// Every call in calls is completed before it returns.
func (b *Blob) runOwned(ctx context.Context, spans []byterange.Range, idx []int, calls map[int]*call) {
	_ = b.inBatches(ctx, len(idx), func(ctx context.Context, lo, hi int) error {
		batch := idx[lo:hi]
		batchSpans := make([]byterange.Range, len(batch))
		for k, i := range batch {
			batchSpans[k] = spans[i]
		}
		batchSps := make([]*span, len(batch))
		for k, i := range batch {
			batchSps[k] = calls[i].sp
		}
		err := b.fetchBatch(ctx, batchSpans, batchSps)
		b.mu.Lock()
		for _, i := range batch {
			c := calls[i]
			c.err = err
			if b.inflight[spans[i]] == c {
				delete(b.inflight, spans[i])
			}
			close(c.done)
		}
		b.mu.Unlock()
		return err
	})
}

// inBatches runs fn on the batches [lo, hi) of n sorted spans that one request asks for (at
// most Config.MaxRangesPerRequest; one where the registry does not do multi-range requests),
// concurrently, and returns the first error. A failure cancels the context of the others: the
// caller fails anyway, so their requests are spared.
func (b *Blob) inBatches(ctx context.Context, n int, fn func(ctx context.Context, lo, hi int) error) error {
	per := b.o.maxRanges
	if b.eps[b.cur.Load()].noMulti.Load() {
		per = 1
	}
	if n <= per {
		return fn(ctx, 0, n)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, (n+per-1)/per)
	var wg sync.WaitGroup
	for k := range errs {
		wg.Go(func() {
			if errs[k] = fn(ctx, k*per, min(k*per+per, n)); errs[k] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return firstError(errs)
}

// cachedLocation returns the cached redirect target, or nil.
func (ep *endpoint) cachedLocation() *url.URL {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.location
}

func (ep *endpoint) setLocation(u *url.URL) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.location = u
}

// dropLocation forgets u if it is still the cached redirect target.
func (ep *endpoint) dropLocation(u *url.URL) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.location == u {
		ep.location = nil
	}
}
