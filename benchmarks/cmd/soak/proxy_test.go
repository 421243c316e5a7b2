package main

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

const (
	testBlob   = "sha256:" + "ab0000000000000000000000000000000000000000000000000000000000cdef"
	testConfig = "sha256:" + "c0000000000000000000000000000000000000000000000000000000000000f1"
)

// upstream is a registry stand-in: a ping, a manifest and two blobs (ranges served).
func upstream(t *testing.T, blob []byte) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v2/":
			w.WriteHeader(http.StatusOK)
		case "/v2/soak/a/manifests/v1":
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			io.WriteString(w, `{"schemaVersion":2}`)
		case "/v2/soak/a/blobs/" + testBlob, "/v2/soak/a/blobs/" + testConfig:
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(blob))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func newTestProxy(t *testing.T, stall time.Duration) (*proxy, []byte) {
	t.Helper()
	blob := make([]byte, 1<<20)
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	up := upstream(t, blob)
	u, _ := url.Parse(up.URL)
	p, err := startProxy(u.Host, faultRates{}, stall, []string{testConfig}, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, blob
}

func get(c *http.Client, u, rng string) (*http.Response, []byte, error) {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// TestProxyFaults: each fault, forced, is what a client sees, on every kind of request.
func TestProxyFaults(t *testing.T) {
	p, blob := newTestProxy(t, 300*time.Millisecond)
	base := "http://" + p.Host
	urls := []struct{ kind, path, rng string }{
		{kindPing, "/v2/", ""},
		{kindManifest, "/v2/soak/a/manifests/v1", ""},
		{kindConfig, "/v2/soak/a/blobs/" + testConfig, ""},
		{kindRange, "/v2/soak/a/blobs/" + testBlob, "bytes=1000-99999"},
		{kindBlob, "/v2/soak/a/blobs/" + testBlob, ""},
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	want := map[fault]int{}
	for _, f := range faultKinds {
		p.mu.Lock()
		p.force = f
		p.mu.Unlock()
		for _, u := range urls {
			start := time.Now()
			resp, b, err := get(client, base+u.path, u.rng)
			want[f]++
			switch f {
			case faultPass:
				if err != nil {
					t.Fatalf("%s %s: %v", f, u.kind, err)
				}
				switch u.kind {
				case kindRange:
					if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(b, blob[1000:100000]) {
						t.Errorf("pass range: status %d, %d bytes, not the blob's", resp.StatusCode, len(b))
					}
				case kindBlob, kindConfig:
					if !bytes.Equal(b, blob) {
						t.Errorf("pass %s: %d bytes, not the blob's", u.kind, len(b))
					}
				}
			case faultUnavail:
				if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
					t.Errorf("503 %s: %v, %v", u.kind, resp, err)
				}
			case faultReset, faultTruncate:
				if u.kind == kindPing { // no body: closed before the response
					if err == nil {
						t.Errorf("%s %s: no error, status %d", f, u.kind, resp.StatusCode)
					}
					continue
				}
				if err == nil {
					t.Errorf("%s %s: %d bytes read without an error", f, u.kind, len(b))
				} else if f == faultTruncate && resp != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("truncate %s: %v, want an unexpected EOF", u.kind, err)
				} else if f == faultReset && resp != nil && !strings.Contains(err.Error(), "reset") {
					t.Errorf("reset %s: %v, want a connection reset", u.kind, err)
				}
			case faultStall:
				if err == nil {
					t.Errorf("stall %s: no error", u.kind)
				}
				if took := time.Since(start); took < 100*time.Millisecond {
					t.Errorf("stall %s: failed after %v, before the shortest stall", u.kind, took)
				}
			}
		}
	}
	// A client that gives up first sees its own timeout.
	p.mu.Lock()
	p.force = faultStall
	p.mu.Unlock()
	short := &http.Client{Timeout: 50 * time.Millisecond}
	if _, _, err := get(short, base+urls[1].path, ""); err == nil || !strings.Contains(err.Error(), "Timeout") {
		t.Errorf("stall against a 50 ms client: %v, want its timeout", err)
	}
	want[faultStall]++
	time.Sleep(400 * time.Millisecond) // the stall ends, the proxy records it

	c := countRecords(p.Records())
	for _, f := range faultKinds {
		if c.ByFault[f] != want[f] {
			t.Errorf("%s: %d recorded, want %d", f, c.ByFault[f], want[f])
		}
	}
	for _, u := range urls {
		if c.ByKind[u.kind][faultPass] != 1 {
			t.Errorf("kind %s: %v, want one of each fault", u.kind, c.ByKind[u.kind])
		}
	}
	for _, r := range p.Records() {
		if r.Kind != kindPing && r.Repo != "soak/a" {
			t.Errorf("record %v: repository %q", r, r.Repo)
		}
	}
}

func TestProxyRates(t *testing.T) {
	p := &proxy{rates: faultRates{Reset: 0.1, Unavailable: 0.2, Truncate: 0.05, Stall: 0.01}, rnd: rand.New(rand.NewPCG(1, 2))}
	n := map[fault]int{}
	const draws = 100000
	for range draws {
		n[p.choose()]++
	}
	for f, want := range map[fault]float64{faultReset: 0.1, faultUnavail: 0.2, faultTruncate: 0.05, faultStall: 0.01, faultPass: 0.64} {
		if got := float64(n[f]) / draws; got < want*0.9 || got > want*1.1 {
			t.Errorf("%s: %.4f of the requests, want %.4f", f, got, want)
		}
	}
	if err := (faultRates{Reset: 0.6, Stall: 0.6}).validate(); err == nil {
		t.Error("rates adding up to 1.2 accepted")
	}
}
