package fetcher

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"
)

// maxBodySize bounds every response body read whole: manifests, configs, token and ping
// answers, error answers. containers/image caps manifests and configs at the same 4 MiB.
const maxBodySize = 4 << 20

// boundedTransport is under every request the package sends. It asks for the body as it is
// stored (Accept-Encoding: identity), so that net/http never inflates an answer on the fly; it
// refuses a successful answer that is encoded all the same; and it caps the body of a request
// without a Range header (manifests, configs, tokens: read whole by their readers) at
// maxBodySize. Range requests are bounded by the Blob, which reads no more than it asked for.
//
// It also applies the redirect rules (redirect.go) to the hops net/http follows by itself:
// those of manifest, config and token requests, which go-containerregistry sends through an
// http.Client. (Blob reads follow their redirects themselves, and check them there.)
//
// And it abandons a request that stalls: no answer within stall of the request, or no byte of
// the body within stall while its reader waits for one (see stallWatch). The request then
// fails with an error wrapping ErrTransient, which is retried on a fresh connection like any
// transient failure, instead of waiting for the whole request timeout.
type boundedTransport struct {
	inner  http.RoundTripper
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	stall  time.Duration // 0: no stall detection
}

// bounded returns rt under a boundedTransport abandoning requests stalled for stall, rt
// itself when it is one already with that bound.
func bounded(rt http.RoundTripper, stall time.Duration) http.RoundTripper {
	if b, ok := rt.(*boundedTransport); ok && b.stall == stall {
		return rt
	}
	return &boundedTransport{inner: rt, lookup: lookupAddrs, stall: stall}
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.checkFollowed(req); err != nil {
		return nil, err
	}
	if req.Header.Get("Accept-Encoding") != "identity" {
		req = req.Clone(req.Context())
		req.Header.Set("Accept-Encoding", "identity")
	}
	var w *stallWatch
	if t.stall > 0 {
		req, w = watchStall(req, t.stall)
	}
	resp, err := t.inner.RoundTrip(req)
	if w != nil {
		if err = w.pause(err, "no answer"); err != nil {
			w.cancel()
			return nil, err
		}
		resp.Body = &stallBody{ReadCloser: resp.Body, w: w}
	}
	if err != nil {
		return nil, err
	}
	if ce := resp.Header.Get("Content-Encoding"); resp.StatusCode/100 == 2 && ce != "" && !strings.EqualFold(ce, "identity") {
		closeBody(resp)
		return nil, fmt.Errorf("%w: answer with Content-Encoding %q to a request for identity", ErrBadResponse, ce)
	}
	if req.Header.Get("Range") == "" {
		if resp.ContentLength > maxBodySize {
			closeBody(resp)
			return nil, fmt.Errorf("%w: response body of %d bytes is larger than %d bytes", ErrBadResponse, resp.ContentLength, maxBodySize)
		}
		resp.Body = &cappedBody{ReadCloser: resp.Body, left: maxBodySize}
	}
	return resp, nil
}

// errBodyTooLarge: a body went on past maxBodySize.
var errBodyTooLarge = fmt.Errorf("%w: response body larger than %d bytes", ErrBadResponse, maxBodySize)

// cappedBody fails a read that would go past left bytes.
type cappedBody struct {
	io.ReadCloser
	left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	if int64(n) > b.left {
		b.left = -1
		return 0, errBodyTooLarge
	}
	b.left -= int64(n)
	return n, err
}

// checkFollowed checks a hop an http.Client follows: req.Response is the redirect that led to
// it. The hop must not leave https anywhere in the chain, and the addresses its host resolves
// to must be public or of the class of the first request's host. (The dial is not checked
// again here, as it is for blob reads: a name that resolves elsewhere by then escapes this
// check, and reaches what a normal pull's client would reach.)
func (t *boundedTransport) checkFollowed(req *http.Request) error {
	if req.Response == nil || req.Response.Request == nil {
		return nil
	}
	first, secure := req.Response.Request, false
	for r := first; r != nil; {
		first, secure = r, secure || r.URL.Scheme == "https"
		if r.Response == nil {
			break
		}
		r = r.Response.Request
	}
	if sameOrigin(req.URL, first.URL) {
		return nil
	}
	if err := checkHopScheme(secure, req.URL); err != nil {
		return err
	}
	addrs, err := t.lookup(req.Context(), req.URL.Hostname())
	if err != nil {
		return nil // the dial fails the same way
	}
	origin, _ := t.lookup(req.Context(), first.URL.Hostname()) // none: public targets only
	for _, a := range addrs {
		if err := checkHopAddr(origin, a); err != nil {
			return err
		}
	}
	return nil
}

// stallWatch cancels a request when its timer fires: the timer runs while the request waits
// for its answer and while a read of its body waits for bytes, not while the caller works
// between reads (a slow reader is not a stalled registry).
type stallWatch struct {
	d      time.Duration
	timer  *time.Timer
	cancel context.CancelFunc
	fired  atomic.Bool
}

// watchStall returns req under a context that w cancels when req stalls, w's timer running.
func watchStall(req *http.Request, d time.Duration) (*http.Request, *stallWatch) {
	ctx, cancel := context.WithCancel(req.Context())
	w := &stallWatch{d: d, cancel: cancel}
	w.timer = time.AfterFunc(d, func() {
		w.fired.Store(true)
		cancel()
	})
	return req.WithContext(ctx), w
}

// pause stops the timer after a wait that ended with err, and returns err, or the stall
// (wrapping ErrTransient) when the timer cut the wait short.
func (w *stallWatch) pause(err error, what string) error {
	w.timer.Stop()
	if err != nil && w.fired.Load() {
		return fmt.Errorf("%w: registry stalled: %s for %v", ErrTransient, what, w.d)
	}
	return err
}

// stallBody is a response body whose reads are watched by w; Close ends the request.
type stallBody struct {
	io.ReadCloser
	w *stallWatch
}

func (b *stallBody) Read(p []byte) (int, error) {
	if b.w.fired.Load() {
		return 0, b.w.pause(context.Canceled, "no byte of the body")
	}
	b.w.timer.Reset(b.w.d)
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.w.timer.Stop()
		return n, err
	}
	return n, b.w.pause(err, "no byte of the body")
}

func (b *stallBody) Close() error {
	b.w.timer.Stop()
	err := b.ReadCloser.Close()
	b.w.cancel()
	return err
}
