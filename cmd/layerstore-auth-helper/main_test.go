package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/control"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

// secret is in every test input; no message may show it.
const secret = "S3cret-Pa55-never-printed"

// cimageInput is what containers/image writes to the helper's stdin on a pull (one entry), here
// with a second entry holding an identity token.
const cimageInput = `{"127.0.0.1:5000/private:tag":{"username":"user","password":"` + secret + `"},` +
	`"quay.io/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef":{"identityToken":"tok-` + secret + `"}}`

type fakeStatus struct{}

func (fakeStatus) Status() protocol.Status { return protocol.Status{} }

func (fakeStatus) Pin(context.Context, string, string) (protocol.Pin, error) {
	return protocol.Pin{}, errors.New("no pins here")
}

func (fakeStatus) Unpin(string, string) error { return nil }

// recordingSink is a control.CredentialSink that keeps what it is given.
type recordingSink struct {
	mu    sync.Mutex
	creds map[string]fetcher.Credentials
}

func (s *recordingSink) Set(key string, c fetcher.Credentials, _ time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.creds == nil {
		s.creds = map[string]fetcher.Credentials{}
	}
	s.creds[key] = c
}

func (s *recordingSink) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creds = nil
}

func (s *recordingSink) got() map[string]fetcher.Credentials {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.creds
}

// serveControl runs a daemon's control API on a new socket and returns its path.
func serveControl(t *testing.T, sink control.CredentialSink) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "control.sock")
	ln, err := control.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: control.Handler(fakeStatus{}, sink, time.Hour, slog.New(slog.DiscardHandler))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return path
}

// runHelper runs the helper with input on stdin and returns its exit status and stderr.
func runHelper(t *testing.T, ctx context.Context, input string, args ...string) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	code := run(ctx, args, strings.NewReader(input), &stderr)
	if strings.Contains(stderr.String(), secret) {
		t.Errorf("stderr shows a secret: %s", stderr.String())
	}
	return code, stderr.String()
}

// wantFailure checks a failed run: status 1 and one line on stderr starting with
// "layerstore-auth-helper: " and containing want.
func wantFailure(t *testing.T, code int, stderr, want string) {
	t.Helper()
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if !strings.HasPrefix(stderr, "layerstore-auth-helper: ") || !strings.HasSuffix(stderr, "\n") ||
		strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, want) {
		t.Errorf("stderr = %q, want one line with %q", stderr, want)
	}
}

func TestHandOver(t *testing.T) {
	sink := &recordingSink{}
	path := serveControl(t, sink)
	code, stderr := runHelper(t, t.Context(), cimageInput, "--control-socket", path)
	if code != 0 || stderr != "" {
		t.Fatalf("exit status %d, stderr %q; want 0 and nothing", code, stderr)
	}
	got := sink.got()
	if c := got["127.0.0.1:5000/private:tag"]; c != (fetcher.Credentials{Username: "user", Password: secret}) {
		t.Errorf("127.0.0.1:5000/private:tag: got %v", c)
	}
	const quay = "quay.io/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if c := got[quay]; c != (fetcher.Credentials{IdentityToken: "tok-" + secret}) {
		t.Errorf("%s: got %v", quay, c)
	}
	if len(got) != 2 {
		t.Errorf("the daemon got %d entries, want 2", len(got))
	}
}

// TestHandOverToKeychain goes through the daemon's real keychain: credentials for the
// reference c/image names are found for the repository the registry client asks about.
func TestHandOverToKeychain(t *testing.T) {
	keys := fetcher.NewMemoryKeychain()
	path := serveControl(t, keys)
	if code, stderr := runHelper(t, t.Context(), cimageInput, "--control-socket", path); code != 0 {
		t.Fatalf("exit status %d: %s", code, stderr)
	}
	for repo, want := range map[string]fetcher.Credentials{
		"127.0.0.1:5000/private": {Username: "user", Password: secret},
		"quay.io/team/app":       {IdentityToken: "tok-" + secret},
	} {
		if c, ok := keys.Lookup(repo); !ok || c != want {
			t.Errorf("Lookup(%q) = %v, %v; want %v", repo, c, ok, want)
		}
	}
	if c, ok := keys.Lookup("127.0.0.1:5000/other"); ok {
		t.Errorf("another repository got %v", c)
	}
}

func TestSocketSelection(t *testing.T) {
	flagSink, envSink := &recordingSink{}, &recordingSink{}
	flagSocket, envSocket := serveControl(t, flagSink), serveControl(t, envSink)
	for _, tc := range []struct {
		name        string
		env         string
		args        []string
		used, other *recordingSink
	}{
		{"flag", "", []string{"--control-socket", flagSocket}, flagSink, envSink},
		{"env", envSocket, nil, envSink, flagSink},
		{"flag over env", envSocket, []string{"--control-socket", flagSocket}, flagSink, envSink},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flagSink.reset()
			envSink.reset()
			t.Setenv(protocol.SocketEnv, tc.env)
			if code, stderr := runHelper(t, t.Context(), cimageInput, tc.args...); code != 0 {
				t.Fatalf("exit status %d: %s", code, stderr)
			}
			if len(tc.used.got()) != 2 || len(tc.other.got()) != 0 {
				t.Errorf("the chosen daemon got %d entries and the other %d, want 2 and 0", len(tc.used.got()), len(tc.other.got()))
			}
		})
	}
}

func TestDaemonAbsent(t *testing.T) {
	dir := t.TempDir()
	// A stale socket: its file is there, no daemon listens.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	for _, tc := range []struct{ name, socket, want string }{
		{"no socket", filepath.Join(dir, "none.sock"), "no such file or directory"},
		{"stale socket", stale, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, stderr := runHelper(t, t.Context(), cimageInput, "--control-socket", tc.socket)
			wantFailure(t, code, stderr, "cannot reach the layerstore daemon at "+tc.socket+": ")
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr = %q, want the cause %q", stderr, tc.want)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("failing took %v", d)
			}
		})
	}
}

// TestDaemonHangs bounds the run when the daemon accepts the connection but never answers.
func TestDaemonHangs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	code, stderr := runHelper(t, ctx, cimageInput, "--control-socket", path)
	wantFailure(t, code, stderr, "the layerstore daemon at "+path+" did not answer within")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("failing took %v", d)
	}
}

func TestDaemonRefuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control.sock")
	ln, err := control.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "credentials: no room", http.StatusInternalServerError)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	code, stderr := runHelper(t, t.Context(), cimageInput, "--control-socket", path)
	wantFailure(t, code, stderr, "the layerstore daemon at "+path+" did not take the credentials: ")
	if !strings.Contains(stderr, "500") || !strings.Contains(stderr, "credentials: no room") {
		t.Errorf("stderr = %q, want the daemon's answer", stderr)
	}
}

func TestInvalidInput(t *testing.T) {
	sink := &recordingSink{}
	path := serveControl(t, sink)
	for _, tc := range []struct{ name, input, want string }{
		{"empty", "", "stdin is empty"},
		{"truncated", `{"r/x:1": {"password": "` + secret + `"`, "stdin ends inside a JSON value"},
		{"bare word", `{"r/x:1": {"password": ` + secret + `}}`, "not valid JSON (at byte 24)"},
		{"not an object", `["` + secret + `"]`, "stdin is not a JSON object"},
		{"a string", `"` + secret + `"`, "stdin is not a JSON object"},
		{"wrong field type", `{"r/x:1": {"username": "` + secret + `", "password": 42}}`, "stdin is not a JSON object"},
		{"entry not an object", `{"` + secret + `": "` + secret + `"}`, "stdin is not a JSON object"},
		{"null", "null\n", "stdin is null"},
		{"two values", `{"r/x:1": {"password": "a"}} {"` + secret + `": 1}`, "more than one JSON value (after byte 28)"},
		{"trailing garbage", `{"r/x:1": {"password": "a"}}]` + secret, "more than one JSON value"},
		{"empty reference", `{"": {"password": "` + secret + `"}}`, "empty image reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runHelper(t, t.Context(), tc.input, "--control-socket", path)
			wantFailure(t, code, stderr, tc.want)
		})
	}
	if got := sink.got(); len(got) != 0 {
		t.Errorf("the daemon got %d entries from invalid input", len(got))
	}
}

func TestInputSize(t *testing.T) {
	sink := &recordingSink{}
	path := serveControl(t, sink)
	at := cimageInput + strings.Repeat(" ", maxInput-len(cimageInput))
	if code, stderr := runHelper(t, t.Context(), at, "--control-socket", path); code != 0 {
		t.Fatalf("input of exactly 1 MiB: exit status %d: %s", code, stderr)
	}
	sink.reset()
	code, stderr := runHelper(t, t.Context(), at+" ", "--control-socket", path)
	wantFailure(t, code, stderr, "stdin holds more than 1 MiB")
	if got := sink.got(); len(got) != 0 {
		t.Errorf("the daemon got %d entries from oversized input", len(got))
	}
}

// TestInputNeverEnds bounds the run when stdin stays open, as when run by hand.
func TestInputNeverEnds(t *testing.T) {
	r, w := io.Pipe()
	t.Cleanup(func() { w.Close() })
	go w.Write([]byte(`{"r/x:1": {"password": "` + secret + `"}}`))
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	var stderr bytes.Buffer
	start := time.Now()
	code := run(ctx, []string{"--control-socket", filepath.Join(t.TempDir(), "control.sock")}, r, &stderr)
	wantFailure(t, code, stderr.String(), "no end of input on stdin within 5s")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("failing took %v", d)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"-h"}, 0},
		{[]string{"--no-such-flag"}, 2},
		{[]string{"extra"}, 2},
	} {
		code, stderr := runHelper(t, t.Context(), cimageInput, tc.args...)
		if code != tc.code || !strings.Contains(stderr, "additional-layer-store-auth-helper") {
			t.Errorf("%v: exit status %d, want %d; stderr:\n%s", tc.args, code, tc.code, stderr)
		}
	}
}
