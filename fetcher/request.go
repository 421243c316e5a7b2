package fetcher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/layerstore/layerstore/internal/byterange"
)

// errMultiRefused: the server answered a multi-range request with 400 or 416.
var errMultiRefused = errors.New("multi-range request refused")

// fetchBatch fetches spans (sorted, disjoint) into dst, the buffer of each, from the preferred
// endpoint, and when that fails for any reason but the caller's context, from the next
// endpoints in turn (a span filled in part goes on from where it stopped: the bytes are the
// same everywhere). An endpoint that failed stops being the preferred one, so that later
// fetches do not wait for it again.
func (b *Blob) fetchBatch(ctx context.Context, spans []byterange.Range, dst []*span) error {
	first := int(b.cur.Load())
	var firstErr error
	var others []string
	for k := range len(b.eps) {
		i := (first + k) % len(b.eps)
		ep := b.eps[i]
		err := b.fetchBatchFrom(ctx, ep, spans, dst)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		if firstErr == nil {
			firstErr = err
		} else {
			others = append(others, err.Error())
		}
		if len(b.eps) > 1 {
			next := (i + 1) % len(b.eps)
			if b.cur.CompareAndSwap(int32(i), int32(next)) {
				b.o.log.Debug("blob source failed; reading from the next one",
					"failed", redact(ep.url), "next", redact(b.eps[next].url), "err", err)
			}
		}
	}
	if len(others) == 0 {
		return firstErr
	}
	return fmt.Errorf("%w (other sources also failed: %s)", firstErr, strings.Join(others, "; "))
}

// fetchBatchFrom fetches spans into dst from one endpoint with as few requests as it allows,
// falling back to one request per span when it turns out not to do multi-range requests.
func (b *Blob) fetchBatchFrom(ctx context.Context, ep *endpoint, spans []byterange.Range, dst []*span) error {
	if len(spans) > 1 && ep.noMulti.Load() {
		return b.fetchSingles(ctx, ep, spans, dst)
	}
	set := &spanSet{spans: spans, sps: dst}
	err := b.withRetries(ctx, ep, func(ctx context.Context) error { return b.attempt(ctx, ep, set) })
	if err != nil && !errors.Is(err, errMultiRefused) {
		return err
	}
	var rest []byterange.Range
	var restDst []*span
	for i, sp := range spans {
		if !dst[i].full() {
			rest, restDst = append(rest, sp), append(restDst, dst[i])
		}
	}
	if len(rest) == 0 {
		return nil
	}
	if len(spans) == 1 {
		// Unreachable: an attempt for one span fills it or fails. Guards against a loop.
		return &Error{URL: redact(ep.url), Err: fmt.Errorf("%w: range not served", ErrBadResponse)}
	}
	b.markNoMulti(ep)
	return b.fetchSingles(ctx, ep, rest, restDst)
}

func (b *Blob) markNoMulti(ep *endpoint) {
	if !ep.noMulti.Swap(true) {
		b.o.log.Debug("registry does not serve multi-range requests; using single ranges",
			"url", redact(ep.url))
	}
}

// fetchSingles fetches each span into its buffer of dst with its own request, concurrently
// (within the host limit).
func (b *Blob) fetchSingles(ctx context.Context, ep *endpoint, spans []byterange.Range, dst []*span) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(spans))
	var wg sync.WaitGroup
	for i, sp := range spans {
		wg.Go(func() {
			if errs[i] = b.fetchBatchFrom(ctx, ep, []byterange.Range{sp}, dst[i:i+1]); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return firstError(errs)
}

// firstError returns the first error, preferring one that is not a context error (those
// usually follow from a cancellation caused by the real failure).
func firstError(errs []error) error {
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || isContextErr(first) && !isContextErr(err)) {
			first = err
		}
	}
	return first
}

// withRetries runs fn, each attempt holding a host slot and bounded by the request timeout,
// until it succeeds, fails for good, or the attempts are used up.
func (b *Blob) withRetries(ctx context.Context, ep *endpoint, fn func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		release, err := b.o.limiter.Acquire(ctx, ep.url.Host)
		if err != nil {
			return fmt.Errorf("fetcher: waiting for a request slot for %s: %w", ep.url.Host, err)
		}
		actx, cancel := context.WithTimeout(ctx, b.o.timeout)
		err = fn(actx)
		cancel()
		release()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("fetcher: GET %s: %w", redact(ep.url), ctx.Err())
		}
		var fe *Error
		if !errors.As(err, &fe) || !errors.Is(fe.Err, ErrTransient) {
			return err
		}
		if attempt >= b.o.maxAttempts {
			fe.Attempts = attempt
			return fe
		}
		delay := b.backoff(attempt)
		if fe.hasRetryAfter {
			delay = min(fe.retryAfter, b.o.maxBackoff)
		}
		b.retries.Add(1)
		b.o.log.Debug("retrying blob request", "attempt", attempt, "delay", delay, "err", err)
		if err := b.o.sleep(ctx, delay); err != nil {
			return fmt.Errorf("fetcher: GET %s: %w", redact(ep.url), err)
		}
	}
}

// backoff is the jittered delay after the given failed attempt (1-based).
func (b *Blob) backoff(attempt int) time.Duration {
	return backoff(b.o.initialBackoff, b.o.maxBackoff, attempt)
}

// backoff is the delay after the given failed attempt (1-based) of every request the package
// retries: initial, doubling after each attempt up to limit, jittered down by up to half.
func backoff(initial, limit time.Duration, attempt int) time.Duration {
	d := limit
	if attempt < 32 {
		d = min(initial<<(attempt-1), limit)
		if d <= 0 { // overflow
			d = limit
		}
	}
	return d/2 + rand.N(d/2+1)
}

// attempt asks once for the spans of set not yet filled and stores what the answer holds.
func (b *Blob) attempt(ctx context.Context, ep *endpoint, set *spanSet) error {
	want := set.missing()
	if len(want) == 0 {
		return nil
	}
	multi := len(want) > 1
	resp, u, err := b.get(ctx, ep, rangeHeader(want))
	if err != nil {
		return err
	}
	defer closeBody(resp)
	code := resp.StatusCode
	switch {
	case code == http.StatusPartialContent:
		return b.readPartial(resp, u, set)
	case code == http.StatusOK:
		if multi {
			b.markNoMulti(ep)
		}
		return b.readFull(resp, u, set)
	case code == http.StatusBadRequest || code == http.StatusRequestedRangeNotSatisfiable:
		if multi {
			return errMultiRefused
		}
		return &Error{URL: redact(u), StatusCode: code, Err: ErrRangeUnsupported}
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return &Error{URL: redact(u), StatusCode: code, Err: ErrUnauthorized}
	case code == http.StatusNotFound:
		return &Error{URL: redact(u), StatusCode: code, Err: ErrNotFound}
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		e := &Error{URL: redact(u), StatusCode: code, Err: ErrTransient}
		if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
			e.retryAfter, e.hasRetryAfter = b.parseRetryAfter(resp.Header.Get("Retry-After"))
		}
		return e
	}
	return &Error{URL: redact(u), StatusCode: code, Err: fmt.Errorf("%w: unexpected status", ErrBadResponse)}
}

// get sends the request for rng to the cached redirect target or to the registry, following
// redirects, and returns the final response and the URL that gave it.
func (b *Blob) get(ctx context.Context, ep *endpoint, rng string) (*http.Response, *url.URL, error) {
	u, cached := ep.cachedLocation(), true
	if u == nil {
		u, cached = ep.url, false
	}
	redirected := false
	for hops := 0; ; {
		resp, err := b.send(ctx, ep, u, rng)
		if err != nil {
			return nil, nil, err
		}
		switch resp.StatusCode {
		case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
			http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			loc := resp.Header.Get("Location")
			closeBody(resp)
			if hops++; hops > maxRedirects {
				return nil, nil, &Error{URL: redact(u), StatusCode: resp.StatusCode,
					Err: fmt.Errorf("%w: more than %d redirects", ErrBadResponse, maxRedirects)}
			}
			next, err := u.Parse(loc)
			if err != nil || (next.Scheme != "http" && next.Scheme != "https") || next.Host == "" {
				// The location is not quoted: it may carry a signature.
				return nil, nil, &Error{URL: redact(u), StatusCode: resp.StatusCode,
					Err: fmt.Errorf("%w: redirect to a malformed location", ErrBadResponse)}
			}
			if err := b.checkHop(ctx, ep, u.Scheme == "https", next); err != nil {
				// The location is not quoted: it may carry a signature.
				return nil, nil, &Error{URL: redact(u), StatusCode: resp.StatusCode, Err: err}
			}
			u, redirected, cached = next, true, false
			continue
		case http.StatusForbidden, http.StatusNotFound:
			if cached {
				// The signed URL expired or the storage lost the object: ask the registry
				// again, once.
				closeBody(resp)
				ep.dropLocation(u)
				b.o.log.Debug("cached blob location refused; asking the registry again",
					"status", resp.StatusCode, "location", redact(u))
				u, cached, redirected = ep.url, false, false
				continue
			}
		}
		if redirected && resp.StatusCode/100 == 2 {
			ep.setLocation(u)
		}
		return resp, u, nil
	}
}

// send sends one GET. Hops to another origin than the registry's go through the storage
// transport, so the registry's credentials stay with the registry.
func (b *Blob) send(ctx context.Context, ep *endpoint, u *url.URL, rng string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(b.hopContext(ctx, ep, u), http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, &Error{URL: redact(u), Err: fmt.Errorf("%w: %w", ErrBadResponse, scrub(err, u))}
	}
	req.Header.Set("Range", rng)
	req.Header.Set("Accept-Encoding", "identity")
	rt := ep.rt
	if !sameOrigin(u, ep.url) {
		rt = b.o.storageRT
	}
	b.requests.Add(1)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		var ae *authError
		if errors.As(err, &ae) {
			// Authenticating to the endpoint failed; the error is typed already.
			return nil, &Error{URL: redact(u), StatusCode: ae.status, Err: ae.err}
		}
		if errors.Is(err, ErrBadResponse) { // an encoded answer, refused by boundedTransport
			return nil, &Error{URL: redact(u), Err: scrub(err, u)}
		}
		var ce *tls.CertificateVerificationError
		if errors.As(err, &ce) { // retrying will not help
			return nil, &Error{URL: redact(u), Err: fmt.Errorf("%w: %w", ErrBadResponse, scrub(err, u))}
		}
		return nil, &Error{URL: redact(u), Err: fmt.Errorf("%w: %w", ErrTransient, scrub(err, u))}
	}
	resp.Body = &countingBody{ReadCloser: resp.Body, n: &b.bytesIn}
	return resp, nil
}

func sameOrigin(a, b *url.URL) bool {
	return a.Scheme == b.Scheme && strings.EqualFold(a.Host, b.Host)
}

// readFull takes the spans from a 200 answer, reading the body only up to the last one.
func (b *Blob) readFull(resp *http.Response, u *url.URL, set *spanSet) error {
	if resp.ContentLength >= 0 && resp.ContentLength != b.size {
		return &Error{URL: redact(u), StatusCode: resp.StatusCode,
			Err: fmt.Errorf("%w: body of %d bytes for a blob of %d", ErrBadResponse, resp.ContentLength, b.size)}
	}
	_, err := set.copyPart(resp.Body, 0, b.size-1)
	return b.bodyErr(u, resp.StatusCode, err)
}

// readPartial takes the spans from a 206 answer, single part or multipart/byteranges.
func (b *Blob) readPartial(resp *http.Response, u *url.URL, set *spanSet) error {
	mediaType, params, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mediaType != "multipart/byteranges" {
		return b.readPart(resp.Body, resp.Header.Get("Content-Range"), u, set)
	}
	boundary := params["boundary"]
	if boundary == "" {
		return &Error{URL: redact(u), StatusCode: resp.StatusCode,
			Err: fmt.Errorf("%w: multipart/byteranges without a boundary", ErrBadResponse)}
	}
	mr := multipart.NewReader(resp.Body, boundary)
	for len(set.missing()) > 0 {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			return &Error{URL: redact(u), StatusCode: resp.StatusCode,
				Err: fmt.Errorf("%w: multipart answer lacks requested ranges", ErrBadResponse)}
		}
		if err != nil {
			return b.bodyErr(u, resp.StatusCode, truncated(err))
		}
		if err := b.readPart(part, part.Header.Get("Content-Range"), u, set); err != nil {
			return err
		}
	}
	return nil
}

// readPart stores the spans contained in one part whose header says contentRange. A part
// holding none of the requested spans is an error; one holding only some is not (the rest is
// asked for again).
func (b *Blob) readPart(r io.Reader, contentRange string, u *url.URL, set *spanSet) error {
	first, last, size, err := parseContentRange(contentRange)
	if err == nil && size >= 0 && size != b.size {
		err = fmt.Errorf("%w: Content-Range %q for a blob of %d bytes", ErrBadResponse, contentRange, b.size)
	}
	if err != nil {
		return &Error{URL: redact(u), StatusCode: http.StatusPartialContent, Err: err}
	}
	n, err := set.copyPart(r, first, last)
	if err == nil && n == 0 {
		err = fmt.Errorf("%w: Content-Range %q matches no requested range", ErrBadResponse, contentRange)
	}
	return b.bodyErr(u, http.StatusPartialContent, err)
}

// bodyErr types an error met while reading a body: truncation is transient, the rest is the
// server's fault.
func (b *Blob) bodyErr(u *url.URL, status int, err error) error {
	if err == nil {
		return nil
	}
	var t *errTruncated
	if errors.As(err, &t) {
		return &Error{URL: redact(u), StatusCode: status, Err: fmt.Errorf("%w: %w", ErrTransient, scrub(err, u))}
	}
	return &Error{URL: redact(u), StatusCode: status, Err: err}
}

// parseRetryAfter reads a Retry-After value: delay seconds or an HTTP-date.
func (b *Blob) parseRetryAfter(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		if secs > int64(b.o.maxBackoff/time.Second)+1 {
			return b.o.maxBackoff, true
		}
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(b.o.now()), 0), true
	}
	return 0, false
}

// closeBody drains a little of what is left, so that a short tail does not cost the
// connection, and closes the body.
func closeBody(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
	_ = resp.Body.Close()
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}
