package svcmanager

import (
	"os"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/fdstore"
)

// TestStoreHandOverRemove: what a process stores through fdstore is handed over under its
// name, one per name, and goes when removed or when it hangs up.
func TestStoreHandOverRemove(t *testing.T) {
	m := New(t, t.TempDir())
	t.Setenv("NOTIFY_SOCKET", m.Path)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for range 2 {
		if err := fdstore.Store("pipe", w); err != nil {
			t.Fatal(err)
		}
	}
	if err := fdstore.Store("other", r); err != nil {
		t.Fatal(err)
	}
	waitNames := func(want ...string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			got := m.Names()
			if len(got) == len(want) {
				ok := true
				for i := range got {
					ok = ok && got[i] == want[i]
				}
				if ok {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("stored %q, want %q", got, want)
			}
		}
	}
	waitNames("pipe", "other")
	env, files := ListenEnv(m.HandOver())
	if len(files) != 2 || env[0] != "LISTEN_FDS=2" || env[1] != "LISTEN_FDNAMES=pipe:other" {
		t.Fatalf("hand-over: %q, %d files", env, len(files))
	}
	if err := fdstore.Remove("other"); err != nil {
		t.Fatal(err)
	}
	waitNames("pipe")
	// The write end hangs up once the read end is closed everywhere: no longer handed over.
	w.Close()
	r.Close()
	if got := m.HandOver(); len(got) != 0 {
		t.Errorf("a pipe that hung up was handed over: %v", got)
	}
}
