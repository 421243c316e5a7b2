// Package control is the daemon's control socket: HTTP over a unix socket that only root can
// reach (mode 0600). It serves the status as JSON (/status), Prometheus metrics (/metrics),
// takes registry credentials from the auth helper (POST /credentials), and pins and unpins
// images (POST /pin, POST /unpin), and exports and imports startup profiles (GET and POST
// /profiles). The client side, used by `layerstore status`, `pin`, `unpin`, `profiles` and the
// auth helper, is here too. [MetricsHandler] is the metrics alone, for the
// optional TCP metrics address: it serves GET /metrics and nothing else.
//
// The handlers keep no state of their own: each request reads a fresh status from the layer
// manager (safe for concurrent use), so they serve any number of requests concurrently.
package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/layer"
)

// DefaultSocket is where the daemon listens unless configured otherwise.
const DefaultSocket = "/run/layerstore/control.sock"

// SocketEnv names the environment variable that, when set, replaces [DefaultSocket] for the
// daemon, `layerstore status` and the auth helper.
const SocketEnv = "LAYERSTORE_CONTROL_SOCKET"

// SocketPath is the control socket to use when no flag or configuration names one: the
// value of $LAYERSTORE_CONTROL_SOCKET if set, else [DefaultSocket] for root and, for another
// user (a rootless daemon and its clients), layerstore/control.sock in the user's runtime
// directory ($XDG_RUNTIME_DIR, else /run/user/UID).
func SocketPath() string {
	if p := os.Getenv(SocketEnv); p != "" {
		return p
	}
	if os.Geteuid() != 0 {
		return filepath.Join(UserRuntimeDir(), "layerstore", "control.sock")
	}
	return DefaultSocket
}

// UserRuntimeDir is the current user's runtime directory: $XDG_RUNTIME_DIR, else
// /run/user/UID, where systemd's user manager makes it.
func UserRuntimeDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return d
	}
	return fmt.Sprintf("/run/user/%d", os.Geteuid())
}

// DefaultCredentialTTL is how long credentials handed over by the auth helper are used.
const DefaultCredentialTTL = 12 * time.Hour

// maxCredentialBody bounds what POST /credentials reads.
const maxCredentialBody = 1 << 20

// StatusSource is what the status and metrics endpoints report on, and what pins images: the
// layer manager.
type StatusSource interface {
	Status() layer.Status
	Pin(ctx context.Context, ref, platform string) (layer.Pin, error)
	Unpin(ref, platform string) error
}

// PinRequest names an image to pin or unpin.
type PinRequest struct {
	Ref      string `json:"ref"`
	Platform string `json:"platform,omitempty"`
}

// maxPinBody bounds what POST /pin and /unpin read.
const maxPinBody = 64 << 10

// CredentialSink receives credentials from the auth helper: the registry client's in-memory
// keychain.
type CredentialSink interface {
	Set(key string, c fetcher.Credentials, ttl time.Duration)
}

// Credential is one entry of what c/image writes to the auth helper's stdin, keyed by
// "registry/repository" reference.
type Credential struct {
	Username      string `json:"username,omitempty"`
	Password      string `json:"password,omitempty"`
	IdentityToken string `json:"identityToken,omitempty"`
}

// Handler returns the control API.
func Handler(src StatusSource, sink CredentialSink, ttl time.Duration, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(src.Status())
	})
	mux.HandleFunc("GET /metrics", metricsEndpoint(src))
	mux.HandleFunc("POST /pin", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readPinRequest(w, r)
		if !ok {
			return
		}
		// The pin goes on while the client waits; a client that goes away stops the fetch,
		// not the pin (pin again to finish it).
		p, err := src.Pin(r.Context(), req.Ref, req.Platform)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("POST /unpin", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readPinRequest(w, r)
		if !ok {
			return
		}
		if err := src.Unpin(req.Ref, req.Platform); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	if ps, ok := src.(ProfileSource); ok {
		handleProfiles(mux, ps, log)
	}
	mux.HandleFunc("POST /credentials", func(w http.ResponseWriter, r *http.Request) {
		var creds map[string]Credential
		dec := json.NewDecoder(io.LimitReader(r.Body, maxCredentialBody))
		if err := dec.Decode(&creds); err != nil {
			// The decoder's message never quotes the input, so no secret is echoed.
			http.Error(w, "credentials: invalid JSON", http.StatusBadRequest)
			return
		}
		for key := range creds {
			if key == "" {
				http.Error(w, "credentials: empty key", http.StatusBadRequest)
				return
			}
		}
		// An anonymous pull hands over empty credentials. They are skipped rather than
		// clearing what another pull of the same repository handed over: the daemon is shared.
		n := 0
		for key, c := range creds {
			if c != (Credential{}) {
				sink.Set(key, fetcher.Credentials{Username: c.Username, Password: c.Password, IdentityToken: c.IdentityToken}, ttl)
				n++
			}
		}
		log.Info("credentials received from the auth helper", "entries", n)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func readPinRequest(w http.ResponseWriter, r *http.Request) (PinRequest, bool) {
	var req PinRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxPinBody)).Decode(&req); err != nil || req.Ref == "" {
		http.Error(w, "pin: a JSON object with a ref is expected", http.StatusBadRequest)
		return req, false
	}
	return req, true
}

// Listen creates the socket at path, mode 0600, replacing a stale one left by a crash. A
// socket some live daemon answers on is an error.
func Listen(path string) (net.Listener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("control socket %s: a path of %d bytes, longer than a unix socket's %d: choose a shorter control-socket", path, len(path), maxSocketPath)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("control socket %s: another daemon is listening", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// maxSocketPath is the longest path a unix socket is bound at on Linux (sun_path holds 108
// bytes, the terminating NUL included); a longer one fails with EINVAL, which names nothing.
const maxSocketPath = 107

// Client talks to a daemon's control socket.
type Client struct {
	hc *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}
	return &Client{hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// Status fetches the daemon's status.
func (c *Client) Status(ctx context.Context) (layer.Status, error) {
	var st layer.Status
	resp, err := c.do(ctx, http.MethodGet, "/status", nil)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Metrics fetches the daemon's metrics text.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	resp, err := c.do(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Pin asks the daemon to pin an image and waits until its layers are local (or the pin
// failed); ctx bounds the wait, and cancelling it stops the fetch (the pin stays).
func (c *Client) Pin(ctx context.Context, req PinRequest) (layer.Pin, error) {
	var p layer.Pin
	body, err := json.Marshal(req)
	if err != nil {
		return p, err
	}
	resp, err := c.doLong(ctx, "/pin", bytes.NewReader(body))
	if err != nil {
		return p, err
	}
	defer resp.Body.Close()
	return p, json.NewDecoder(resp.Body).Decode(&p)
}

// Unpin asks the daemon to unpin an image.
func (c *Client) Unpin(ctx context.Context, req PinRequest) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, http.MethodPost, "/unpin", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// PushCredentials hands the JSON c/image writes to the auth helper over to the daemon, as is.
// Its errors never quote body, which holds secrets.
func (c *Client) PushCredentials(ctx context.Context, body io.Reader) error {
	resp, err := c.do(ctx, http.MethodPost, "/credentials", body)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (c *Client) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	return c.send(ctx, c.hc, method, path, body)
}

// doLong posts without the client's timeout: ctx alone bounds the request (a pin fetches
// whole layers).
func (c *Client) doLong(ctx context.Context, path string, body io.Reader) (*http.Response, error) {
	return c.doLongMethod(ctx, http.MethodPost, path, body)
}

func (c *Client) doLongMethod(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	hc := *c.hc
	hc.Timeout = 0
	return c.send(ctx, &hc, method, path, body)
}

func (c *Client) send(ctx context.Context, hc *http.Client, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://layerstore"+path, body)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("control socket %s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	return resp, nil
}
