package fetcher

import (
	"fmt"
	"io"
	"net/http"
	"strings"
)

// maxBodySize bounds every response body read whole: manifests, configs, token and ping
// answers, error answers. containers/image caps manifests and configs at the same 4 MiB.
const maxBodySize = 4 << 20

// boundedTransport is under every request the package sends. It asks for the body as it is
// stored (Accept-Encoding: identity), so that net/http never inflates an answer on the fly; it
// refuses a successful answer that is encoded all the same; and it caps the body of a request
// without a Range header (manifests, configs, tokens: read whole by their readers) at
// maxBodySize. Range requests are bounded by the Blob, which reads no more than it asked for.
type boundedTransport struct{ inner http.RoundTripper }

// bounded returns rt under a boundedTransport, rt itself when it is one already.
func bounded(rt http.RoundTripper) http.RoundTripper {
	if _, ok := rt.(*boundedTransport); ok {
		return rt
	}
	return &boundedTransport{inner: rt}
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Accept-Encoding") != "identity" {
		req = req.Clone(req.Context())
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := t.inner.RoundTrip(req)
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
