package main

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// fault is what the proxy does to one request.
type fault string

const (
	faultPass     fault = "pass"     // forwarded untouched
	faultReset    fault = "reset"    // connection reset (RST) after part of the body
	faultUnavail  fault = "503"      // 503 Service Unavailable, sometimes with Retry-After
	faultTruncate fault = "truncate" // Content-Length of the whole body, part of it sent, then FIN
	faultStall    fault = "stall"    // nothing, or headers and part of the body, then silence, then FIN
)

// faultKinds are the faults in the order the report lists them.
var faultKinds = []fault{faultReset, faultUnavail, faultTruncate, faultStall, faultPass}

// Request kinds, as the proxy tells them from the path.
const (
	kindPing     = "ping"     // GET /v2/
	kindManifest = "manifest" // /v2/<repo>/manifests/<ref>
	kindConfig   = "config"   // a blob the proxy was told is an image config
	kindRange    = "range"    // a blob request with a Range header (TOC, footer, chunks)
	kindBlob     = "blob"     // a blob request without a Range header
	kindOther    = "other"
)

var requestKinds = []string{kindPing, kindManifest, kindConfig, kindRange, kindBlob, kindOther}

// faultRates are the fractions of requests given each fault; the rest pass.
type faultRates struct {
	Reset, Unavailable, Truncate, Stall float64
}

func (r faultRates) validate() error {
	for _, x := range []float64{r.Reset, r.Unavailable, r.Truncate, r.Stall} {
		if x < 0 || x > 1 {
			return fmt.Errorf("fault rate %v not in [0, 1]", x)
		}
	}
	if s := r.Reset + r.Unavailable + r.Truncate + r.Stall; s > 1 {
		return fmt.Errorf("fault rates add up to %v, more than 1", s)
	}
	return nil
}

// proxyRecord is one request the proxy answered.
type proxyRecord struct {
	At     time.Time
	Kind   string
	Repo   string // the repository of /v2/<repo>/..., "" for the ping
	Method string
	Path   string
	Range  string
	Status int // the registry's status ("0": not reached)
	Fault  fault
	Detail string // e.g. "cut at 1234 of 5678 bytes", "Retry-After: 2", "silent for 20s"
}

func (r proxyRecord) String() string {
	s := fmt.Sprintf("%s %s %s", r.Fault, r.Kind, r.Path)
	if r.Range != "" {
		s += " " + r.Range
	}
	if r.Detail != "" {
		s += " (" + r.Detail + ")"
	}
	return s
}

// maxFaultBody is the largest response body the proxy buffers to inject a fault into it;
// larger ones pass (the daemon asks for at most 16 MiB per range by default).
const maxFaultBody = 64 << 20

// proxy is a reverse proxy in front of one registry that injects faults into a random fraction
// of the requests, of every kind. It is safe for concurrent use.
type proxy struct {
	Host     string // "127.0.0.1:PORT"
	upstream string
	rates    faultRates
	stall    time.Duration // the longest stall; each lasts between a third of it and all of it
	configs  map[string]bool

	srv     *http.Server
	ln      net.Listener
	tr      *http.Transport
	closing chan struct{}
	conns   sync.WaitGroup // hijacked connections being answered

	mu      sync.Mutex
	rnd     *rand.Rand
	force   fault // tests: every request gets this fault
	records []proxyRecord
}

// startProxy listens on 127.0.0.1 and forwards to upstream ("127.0.0.1:PORT"); configs are the
// digests of image configs, to tell them from layer blobs.
func startProxy(upstream string, rates faultRates, stall time.Duration, configs []string, seed uint64) (*proxy, error) {
	if err := rates.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{
		Host: ln.Addr().String(), upstream: upstream, rates: rates, stall: stall,
		configs: map[string]bool{}, ln: ln, closing: make(chan struct{}),
		rnd: rand.New(rand.NewPCG(seed, seed^0x5eed)),
		tr:  &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 32, ResponseHeaderTimeout: 2 * time.Minute},
	}
	for _, c := range configs {
		p.configs[c] = true
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: time.Minute}
	go p.srv.Serve(ln)
	return p, nil
}

// Close stops the proxy: stalls end at once, every connection is closed.
func (p *proxy) Close() {
	select {
	case <-p.closing:
		return
	default:
	}
	close(p.closing)
	_ = p.srv.Close()
	p.conns.Wait()
	p.tr.CloseIdleConnections()
}

// Records returns the requests answered so far, in order.
func (p *proxy) Records() []proxyRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]proxyRecord(nil), p.records...)
}

// classify tells a request's kind and repository from its path.
func (p *proxy) classify(r *http.Request) (kind, repo string) {
	path := r.URL.Path
	if path == "/v2/" || path == "/v2" {
		return kindPing, ""
	}
	rest, ok := strings.CutPrefix(path, "/v2/")
	if !ok {
		return kindOther, ""
	}
	if i := strings.LastIndex(rest, "/manifests/"); i >= 0 {
		return kindManifest, rest[:i]
	}
	if i := strings.LastIndex(rest, "/blobs/"); i >= 0 {
		repo = rest[:i]
		switch {
		case p.configs[rest[i+len("/blobs/"):]]:
			return kindConfig, repo
		case r.Header.Get("Range") != "":
			return kindRange, repo
		}
		return kindBlob, repo
	}
	return kindOther, ""
}

// choose draws the fault for one request.
func (p *proxy) choose() fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.force != "" {
		return p.force
	}
	x := p.rnd.Float64()
	for _, c := range []struct {
		f    fault
		rate float64
	}{{faultReset, p.rates.Reset}, {faultUnavail, p.rates.Unavailable}, {faultTruncate, p.rates.Truncate}, {faultStall, p.rates.Stall}} {
		if x < c.rate {
			return c.f
		}
		x -= c.rate
	}
	return faultPass
}

func (p *proxy) intN(n int) int {
	if n <= 0 {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rnd.IntN(n)
}

func (p *proxy) stallFor() time.Duration {
	lo := p.stall / 3
	return lo + time.Duration(p.intN(int(p.stall-lo)+1))
}

func (p *proxy) record(r proxyRecord) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.records = append(p.records, r)
	return len(p.records) - 1
}

func (p *proxy) update(i int, r proxyRecord) {
	p.mu.Lock()
	p.records[i] = r
	p.mu.Unlock()
}

// hopByHop are the headers a proxy does not forward.
var hopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind, repo := p.classify(r)
	rec := proxyRecord{At: time.Now(), Kind: kind, Repo: repo, Method: r.Method, Path: r.URL.Path, Range: r.Header.Get("Range"), Fault: p.choose()}
	// Recorded on arrival (a run ending during a stall sees it), completed at the end.
	i := p.record(rec)
	defer func() { p.update(i, rec) }()

	out, err := p.upstreamRequest(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		rec.Detail = "registry: " + err.Error()
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode

	switch rec.Fault {
	case faultPass:
		p.pass(w, resp)
		return
	case faultUnavail:
		p.unavailable(w, resp, &rec)
		return
	}

	// Reset, truncate, stall: the whole body in hand, then written by hand on the raw
	// connection, so that it can be cut where the proxy chooses.
	var b []byte
	if r.Method != http.MethodHead {
		b, err = io.ReadAll(io.LimitReader(resp.Body, maxFaultBody+1))
		if err != nil || len(b) > maxFaultBody {
			rec.Fault, rec.Detail = faultPass, "not faulted: body unreadable or too large"
			p.passBuffered(w, resp, b, err)
			return
		}
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		rec.Fault, rec.Detail = faultPass, "not faulted: no hijacking"
		p.passBuffered(w, resp, b, nil)
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		rec.Detail = "hijack: " + err.Error()
		return
	}
	p.conns.Add(1)
	defer p.conns.Done()
	defer conn.Close()

	p.cut(conn, rw.Writer, resp, b, &rec)
}

// upstreamRequest is r as the proxy sends it to the registry: its body, and its headers but the
// hop-by-hop ones.
func (p *proxy) upstreamRequest(r *http.Request) (*http.Request, error) {
	var body io.Reader
	if r.ContentLength != 0 {
		body = r.Body
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+p.upstream+r.URL.RequestURI(), body)
	if err != nil {
		return nil, err
	}
	out.ContentLength = r.ContentLength
	for k, vs := range r.Header {
		if !hopByHop[k] {
			out.Header[k] = vs
		}
	}
	return out, nil
}

// unavailable answers 503 instead of resp, half the time with a Retry-After of 1-3 s.
func (p *proxy) unavailable(w http.ResponseWriter, resp *http.Response, rec *proxyRecord) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxFaultBody))
	if p.intN(2) == 0 {
		s := strconv.Itoa(1 + p.intN(3))
		w.Header().Set("Retry-After", s)
		rec.Detail = "Retry-After: " + s
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, `{"errors":[{"code":"UNAVAILABLE","message":"service unavailable (injected by the soak's proxy)"}]}`+"\n")
}

// cut writes resp with body b on the hijacked conn (through rw) as rec.Fault says: reset or
// closed part of the way, or stalled and then closed.
func (p *proxy) cut(conn net.Conn, rw *bufio.Writer, resp *http.Response, b []byte, rec *proxyRecord) {
	cut := p.intN(len(b)) // in [0, len(b)): at least one byte missing
	head := func() {
		writeHead(rw, resp, len(b))
	}
	switch rec.Fault {
	case faultReset:
		if len(b) == 0 {
			rec.Detail = "reset before the response (no body)"
		} else {
			head()
			_, _ = rw.Write(b[:cut])
			rec.Detail = fmt.Sprintf("reset at %d of %d bytes", cut, len(b))
		}
		_ = rw.Flush()
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close sends RST
		}
	case faultTruncate:
		if len(b) == 0 {
			rec.Detail = "closed before the response (no body)"
		} else {
			head()
			_, _ = rw.Write(b[:cut])
			rec.Detail = fmt.Sprintf("closed at %d of %d bytes", cut, len(b))
		}
		_ = rw.Flush()
	case faultStall:
		d := p.stallFor()
		if len(b) == 0 || p.intN(2) == 0 {
			rec.Detail = fmt.Sprintf("silent for %v, then closed", d.Round(time.Millisecond))
		} else {
			head()
			_, _ = rw.Write(b[:cut])
			rec.Detail = fmt.Sprintf("stopped at %d of %d bytes for %v, then closed", cut, len(b), d.Round(time.Millisecond))
		}
		_ = rw.Flush()
		select {
		case <-time.After(d):
		case <-p.closing:
		}
	}
}

// writeHead writes the status line and headers of resp, with Content-Length n.
func writeHead(w *bufio.Writer, resp *http.Response, n int) {
	fmt.Fprintf(w, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode))
	h := resp.Header.Clone()
	for k := range hopByHop {
		h.Del(k)
	}
	h.Set("Content-Length", strconv.Itoa(n))
	h.Set("Connection", "close")
	_ = h.Write(w)
	_, _ = w.WriteString("\r\n")
}

func copyHeader(w http.ResponseWriter, resp *http.Response) {
	for k, vs := range resp.Header {
		if !hopByHop[k] {
			w.Header()[k] = vs
		}
	}
}

func (p *proxy) pass(w http.ResponseWriter, resp *http.Response) {
	copyHeader(w, resp)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// passBuffered answers with the part of the body already read (b) and the rest of it.
func (p *proxy) passBuffered(w http.ResponseWriter, resp *http.Response, b []byte, readErr error) {
	copyHeader(w, resp)
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(b)
	if readErr == nil {
		_, _ = io.Copy(w, resp.Body)
	}
}

// proxyCounts counts records by fault and by kind and fault.
type proxyCounts struct {
	Total   int
	ByFault map[fault]int
	ByKind  map[string]map[fault]int
}

func countRecords(rs []proxyRecord) proxyCounts {
	c := proxyCounts{ByFault: map[fault]int{}, ByKind: map[string]map[fault]int{}}
	for _, r := range rs {
		c.Total++
		c.ByFault[r.Fault]++
		if c.ByKind[r.Kind] == nil {
			c.ByKind[r.Kind] = map[fault]int{}
		}
		c.ByKind[r.Kind][r.Fault]++
	}
	return c
}
