package control

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

type fakeStatus struct{ st protocol.Status }

func (f fakeStatus) Status() protocol.Status { return f.st }

func (fakeStatus) Pin(context.Context, string, string) (protocol.Pin, error) {
	return protocol.Pin{}, errors.New("no pins here")
}

func (fakeStatus) Unpin(string, string) error { return nil }

type fakeSink map[string]fetcher.Credentials

func (f fakeSink) Set(key string, c fetcher.Credentials, _ time.Duration) { f[key] = c }

func serveTest(t *testing.T, st protocol.Status, sink fakeSink, logs io.Writer) *protocol.Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "control.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, %v", fi.Mode(), err)
	}
	srv := &http.Server{Handler: Handler(fakeStatus{st}, sink, time.Hour, slog.New(slog.NewTextHandler(logs, nil)))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	if _, err := Listen(path); err == nil {
		t.Error("a second daemon could listen on a live socket")
	}
	return protocol.NewClient(path)
}

func TestCredentials(t *testing.T) {
	sink := fakeSink{}
	var logs bytes.Buffer
	c := serveTest(t, protocol.Status{}, sink, &logs)
	body := `{"127.0.0.1:5000/app": {"username": "u", "password": "s3cret-pw"}, "quay.io/org": {"identityToken": "tok-123"}}`
	if err := c.PushCredentials(t.Context(), strings.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	if sink["127.0.0.1:5000/app"].Password != "s3cret-pw" || sink["quay.io/org"].IdentityToken != "tok-123" {
		t.Errorf("sink got %v", sink)
	}
	// An anonymous pull's empty entry leaves what an earlier pull handed over.
	if err := c.PushCredentials(t.Context(), strings.NewReader(`{"127.0.0.1:5000/app:v2": {}}`)); err != nil {
		t.Fatal(err)
	}
	if sink["127.0.0.1:5000/app"].Password != "s3cret-pw" || len(sink) != 2 {
		t.Errorf("an empty entry changed the sink: %v", sink)
	}
	err := c.PushCredentials(t.Context(), strings.NewReader(`{"x": {"password": "s3cret-pw"`))
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.HasSuffix(err.Error(), "invalid JSON") {
		t.Errorf("invalid JSON: %q, want the daemon's answer on one line, without the secret", err)
	}
	if strings.Contains(logs.String(), "s3cret") || strings.Contains(logs.String(), "tok-123") {
		t.Errorf("secret in the logs: %s", logs.String())
	}
}

func TestStatusAndMetrics(t *testing.T) {
	st := protocol.Status{Layers: []protocol.LayerStatus{{Refs: []string{"r/app:v1"}, Digest: "sha256:abcd", State: protocol.StateFetching, Users: 2, ToFetch: 100, Prefetched: 40,
		ReadChunks: 3, ReadCompressed: 5 << 20, PassthroughFiles: 1, ReadWaits: 2, ReadRequests: 1, ReadWaitSeconds: 0.25}}}
	st.Counters.Lookups = 7
	c := serveTest(t, st, fakeSink{}, io.Discard)
	got, err := c.Status(t.Context())
	if err != nil || len(got.Layers) != 1 || got.Counters.Lookups != 7 {
		t.Fatalf("status %+v, %v", got, err)
	}
	if l := got.Layers[0]; l.ReadChunks != 3 || l.ReadCompressed != 5<<20 || l.PassthroughFiles != 1 || l.ReadWaits != 2 || l.ReadRequests != 1 || l.ReadWaitSeconds != 0.25 {
		t.Errorf("read set through the socket: %d chunks, %d bytes, %d passthrough files, %d waits of %vs", l.ReadChunks, l.ReadCompressed, l.PassthroughFiles, l.ReadWaits, l.ReadWaitSeconds)
	}
	m, err := c.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"layerstore_lookups_total 7", `layerstore_layers{state="fetching"} 1`, "layerstore_layer_users 2"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}
	if strings.Contains(m, "sha256") || strings.Contains(m, "r/app") {
		t.Errorf("metrics carry digests or references:\n%s", m)
	}
	var out bytes.Buffer
	Render(&out, got)
	if !strings.Contains(out.String(), "40%") || !strings.Contains(out.String(), "r/app:v1") || !strings.Contains(out.String(), "read 3 chunks") || !strings.Contains(out.String(), "2 reads waited for the registry (1 sent a request), 0.25s") {
		t.Errorf("render:\n%s", out.String())
	}
}

// TestListenPathTooLong: a control socket path longer than a unix socket allows is refused
// with an error that says so, not bind's bare "invalid argument".
func TestListenPathTooLong(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	_, err := Listen(filepath.Join(dir, "control.sock"))
	if err == nil || !strings.Contains(err.Error(), "longer than a unix socket's 107") {
		t.Fatalf("Listen of a %d-byte path: %v", len(dir)+13, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused socket's directory was made: %v", err)
	}
}
