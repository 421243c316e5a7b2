package storefs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

const backedFile = "usr/share/big.bin"

// backedLayer returns a layer whose Backing serves backedFile from a local copy, with the
// file's id and content.
func backedLayer(t *testing.T) (*testLayer, chunked.EntryID, []byte) {
	t.Helper()
	l := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	id, ok := l.Index().LookupPath(backedFile)
	if !ok {
		t.Fatalf("no %s in the layer", backedFile)
	}
	name, content := localCopy(t, backedFile)
	l.backing[id] = name
	return l, id, content
}

// localCopy writes the content of the fixtures' file name to a new local file, a backing file
// for passthrough, and returns its path and the content.
func localCopy(t *testing.T, name string) (string, []byte) {
	t.Helper()
	var content []byte
	for _, e := range testlayer.Entries() {
		if e.Header.Name == name {
			content = e.Data
		}
	}
	// t.TempDir is on the root filesystem here, not a stacked one, as passthrough needs.
	local := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(local, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return local, content
}

func readBacked(t *testing.T, m mountedLayer, want []byte) {
	t.Helper()
	got, err := os.ReadFile(m.path("diff", backedFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes through the mount, want the %d bytes of %s", len(got), len(want), backedFile)
	}
}

// TestPassthrough checks that a file the layer holds locally is read by the kernel from
// the backing file, never through Layer.ReadFile.
func TestPassthrough(t *testing.T) {
	l, id, content := backedLayer(t)
	m := mountLayer(t, l, defaultConfig())
	if !m.srv.passthroughOn() {
		t.Skip("skipping: the kernel did not grant FUSE passthrough (needs Linux >= 6.9 with CONFIG_FUSE_PASSTHROUGH)")
	}
	readBacked(t, m, content)
	if n := l.calls(l.backings, id); n == 0 {
		t.Errorf("Backing was never asked for %s", backedFile)
	}
	if n := l.calls(l.reads, id); n != 0 {
		t.Errorf("ReadFile was called %d times for a passthrough file", n)
	}
	// Files without a backing file still read through the daemon.
	if _, err := os.ReadFile(m.path("diff", "usr", "share", "sparse.img")); err != nil {
		t.Fatal(err)
	}
	other, _ := l.Index().LookupPath("usr/share/sparse.img")
	if l.calls(l.reads, other) == 0 {
		t.Error("a file without a backing file was not read through ReadFile")
	}
}

// TestPassthroughDisabled checks that with Config.Passthrough off, the layer is not even
// asked for backing files and reads go through ReadFile.
func TestPassthroughDisabled(t *testing.T) {
	l, id, content := backedLayer(t)
	opts := defaultConfig()
	opts.Passthrough = false
	m := mountLayer(t, l, opts)
	if m.srv.passthroughOn() {
		t.Fatal("passthrough on although Config disabled it")
	}
	readBacked(t, m, content)
	if n := l.calls(l.backings, id); n != 0 {
		t.Errorf("Backing was asked %d times with passthrough disabled", n)
	}
	if n := l.calls(l.reads, id); n == 0 {
		t.Error("ReadFile was never called")
	}
}

// TestPassthroughRefusedByKernel offers backing files to a kernel connection without
// passthrough (the capability withheld at mount), as on kernels that lack it: go-fuse's
// registration fails, and the handle must serve reads itself and close the backing file.
func TestPassthroughRefusedByKernel(t *testing.T) {
	l, id, content := backedLayer(t)
	opts := defaultConfig()
	opts.Passthrough = false
	opts.forceBackingFiles = true
	m := mountLayer(t, l, opts)
	readBacked(t, m, content)
	if n := l.calls(l.backings, id); n == 0 {
		t.Fatal("Backing was never asked: the test does not exercise the fallback")
	}
	if n := l.calls(l.reads, id); n == 0 {
		t.Error("ReadFile was never called")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.opened {
		if _, err := f.Stat(); err == nil {
			t.Errorf("backing file %s still open after the kernel refused it and the file was read", f.Name())
		}
	}
}

// TestPassthroughWhileOpenThroughDaemon opens a file before the layer holds it locally and
// keeps it open (as a process keeps a shared library mapped), then opens it again once it
// is local. The kernel refuses a passthrough open of an inode that has files open through
// the daemon (EIO), so the daemon must serve the second open itself, and use passthrough
// again only once the earlier opens are released.
func TestPassthroughWhileOpenThroughDaemon(t *testing.T) {
	l, id, content := backedLayer(t)
	l.mu.Lock()
	local := l.backing[id]
	delete(l.backing, id) // not local yet
	l.mu.Unlock()
	m := mountLayer(t, l, defaultConfig())
	if !m.srv.passthroughOn() {
		t.Skip("skipping: the kernel did not grant FUSE passthrough (needs Linux >= 6.9 with CONFIG_FUSE_PASSTHROUGH)")
	}
	path := m.path("diff", backedFile)
	early, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	if _, err := early.Read(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}

	l.mu.Lock()
	l.backing[id] = local // the background fetch completed the file
	l.mu.Unlock()
	readBacked(t, m, content) // EIO if offered for passthrough
	if n := l.calls(l.reads, id); n == 0 {
		t.Fatal("no read went through the daemon")
	}

	if err := early.Close(); err != nil {
		t.Fatal(err)
	}
	// The kernel releases a closed file asynchronously: wait for the daemon to see it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		reads := l.calls(l.reads, id)
		readBacked(t, m, content)
		if l.calls(l.reads, id) == reads {
			break // served by passthrough
		}
		if time.Now().After(deadline) {
			t.Fatal("passthrough never resumed after the file opened through the daemon was closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
