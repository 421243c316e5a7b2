// Package control is the daemon's side of the control socket: HTTP over a unix socket that
// only root can reach (mode 0600). It serves the status as JSON (/status), Prometheus metrics
// (/metrics), takes registry credentials from the auth helper (POST /credentials), and pins
// and unpins images (POST /pin, POST /unpin), and exports and imports startup profiles (GET
// and POST /profiles). [MetricsHandler] is the metrics alone, for the optional TCP metrics
// address: it serves GET /metrics and nothing else. [Render] writes a status for a person.
// What goes over the socket, and the client, are package protocol's.
//
// The handlers keep no state of their own: each request reads a fresh status from the layer
// manager (safe for concurrent use), so they serve any number of requests concurrently.
package control

import (
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
	"github.com/layerstore/layerstore/internal/control/protocol"
)

// DefaultCredentialTTL is how long credentials handed over by the auth helper are used.
const DefaultCredentialTTL = 12 * time.Hour

// maxCredentialBody bounds what POST /credentials reads.
const maxCredentialBody = 1 << 20

// StatusSource is what the status and metrics endpoints report on, and what pins images: the
// layer manager.
type StatusSource interface {
	Status() protocol.Status
	Pin(ctx context.Context, ref, platform string) (protocol.Pin, error)
	Unpin(ref, platform string) error
}

// maxPinBody bounds what POST /pin and /unpin read.
const maxPinBody = 64 << 10

// CredentialSink receives credentials from the auth helper: the registry client's in-memory
// keychain.
type CredentialSink interface {
	Set(key string, c fetcher.Credentials, ttl time.Duration)
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
		var creds map[string]protocol.Credential
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
			if c != (protocol.Credential{}) {
				sink.Set(key, fetcher.Credentials{Username: c.Username, Password: c.Password, IdentityToken: c.IdentityToken}, ttl)
				n++
			}
		}
		log.Info("credentials received from the auth helper", "entries", n)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func readPinRequest(w http.ResponseWriter, r *http.Request) (protocol.PinRequest, bool) {
	var req protocol.PinRequest
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
