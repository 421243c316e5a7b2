package layer

import (
	"errors"
	iofs "io/fs"
	"net"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// TestResolveBounded: a registry that accepts connections and never answers makes the lookup
// fail after the resolve timeout, not hang (c/storage has no timeout of its own).
func TestResolveBounded(t *testing.T) {
	e := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // hold it open, say nothing
		}
	}()
	m := e.manager(withPrefetch(false), withResolveTimeout(300*time.Millisecond))
	start := time.Now()
	_, err = m.Lookup(t.Context(), ln.Addr().String()+"/silent:v1", e.fixtures[0].Desc.Digest)
	if err == nil || errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("lookup on a silent registry: %v, want an error other than ErrNotExist", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("lookup took %s with a 300ms resolve timeout", d)
	}
}

// TestPrefetchStopsWithoutUsers: when the last runtime reference goes away, the background
// fetch stops.
func TestPrefetchStopsWithoutUsers(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	ref := e.push("users:v1", fixtureLayer(f))
	m := e.manager(withPrefetchBandwidth(64<<10), withPrefetchBatch(64<<10)) // slow: it cannot finish first
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m.Use(ref, f.Desc.Digest)
	if st := l.Status(); st.State != protocol.StateFetching {
		t.Fatalf("state %s, want fetching", st.State)
	}
	m.Release(ref, f.Desc.Digest)
	done := make(chan struct{})
	go func() { l.wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("background fetch still running after the last user left")
	}
	if st := l.Status(); st.State != protocol.StateStopped {
		t.Errorf("state %s, want stopped", st.State)
	}
}
