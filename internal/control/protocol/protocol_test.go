package protocol

import "testing"

func TestSocketPath(t *testing.T) {
	t.Setenv(SocketEnv, "")
	if got := SocketPath(); got != DefaultSocket {
		t.Errorf("without $%s: %q, want %q", SocketEnv, got, DefaultSocket)
	}
	t.Setenv(SocketEnv, "/run/other/control.sock")
	if got := SocketPath(); got != "/run/other/control.sock" {
		t.Errorf("with $%s: %q, want /run/other/control.sock", SocketEnv, got)
	}
}
