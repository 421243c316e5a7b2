package sdnotify

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

func TestNotify(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := Notify("READY=1"); err != nil {
		t.Fatalf("without a socket: %v", err)
	}
	path := filepath.Join(t.TempDir(), "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	if err := Notify("READY=1\nSTATUS=serving"); err != nil {
		t.Fatal(err)
	}
	ln.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 128)
	n, err := ln.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1\nSTATUS=serving" {
		t.Fatalf("got %q, %v", buf[:n], err)
	}
}
