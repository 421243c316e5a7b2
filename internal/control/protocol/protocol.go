// Package protocol is the control socket's protocol: where the socket is, the JSON the
// daemon and its clients exchange over it (the status, pins, startup profile imports,
// credentials) and the [Client] that `layerstore status`, `pin`, `unpin`, `profiles` and the
// auth helper use. The daemon's side (the handlers) is package control.
//
// It depends on the standard library alone (and on the histogram snapshots of package
// metrics, which does too), so that the auth helper, which the container runtime runs on
// every pull, links little more. The layer manager and the cache fill the status types it
// declares.
//
// A [Client] is safe for concurrent use; the types are plain values.
package protocol

import (
	"fmt"
	"os"
	"path/filepath"
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

// Credential is one entry of what c/image writes to the auth helper's stdin, keyed by
// "registry/repository" reference.
type Credential struct {
	Username      string `json:"username,omitempty"`
	Password      string `json:"password,omitempty"`
	IdentityToken string `json:"identityToken,omitempty"`
}

// PinRequest names an image to pin or unpin.
type PinRequest struct {
	Ref      string `json:"ref"`
	Platform string `json:"platform,omitempty"`
}

// ProfileImport says what an import of profiles did.
type ProfileImport struct {
	Repositories int `json:"repositories"`
	Layers       int `json:"layers"`
}
