package layer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// Unit tests of the manager's machinery without an HTTP registry: a fake Registry serves one
// image whose layer's blob is in memory, and counts and holds its fetches.

// memBlob is a Blob in memory. Fetch counts its calls and, while gate is set, waits for it
// to be closed (or the context to end) before answering.
type memBlob struct {
	data []byte

	mu      sync.Mutex
	fetches int
	started chan struct{} // receives a value as each Fetch starts (buffered, never blocks)
	gate    chan struct{}
}

func newMemBlob(data []byte) *memBlob {
	return &memBlob{data: data, started: make(chan struct{}, 1024)}
}

func (b *memBlob) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	if off >= int64(len(b.data)) {
		return 0, io.EOF
	}
	n := copy(p, b.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (b *memBlob) Fetch(ctx context.Context, ranges []byterange.Range) ([][]byte, error) {
	b.mu.Lock()
	b.fetches++
	gate := b.gate
	b.mu.Unlock()
	select {
	case b.started <- struct{}{}:
	default:
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([][]byte, len(ranges))
	for i, r := range ranges {
		out[i] = bytes.Clone(b.data[r.Offset : r.Offset+r.Length])
	}
	return out, nil
}

func (b *memBlob) hold() chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gate = make(chan struct{})
	return b.gate
}

func (b *memBlob) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fetches
}

// memRegistry serves every reference as one image of the fixture's layer, from blob.
type memRegistry struct {
	f    testlayer.Fixture
	blob *memBlob
}

func (r *memRegistry) Resolve(_ context.Context, ref string) (*fetcher.Image, error) {
	return &fetcher.Image{Ref: ref, Manifest: fetcher.Manifest{Layers: []fetcher.ImageLayer{{
		Descriptor: r.f.Desc, DiffID: r.f.DiffID,
	}}}}, nil
}

func (r *memRegistry) Platforms(context.Context, *fetcher.Image) ([]*fetcher.Manifest, error) {
	return nil, nil
}

func (r *memRegistry) Blob(context.Context, *fetcher.Image, *fetcher.ImageLayer) (RemoteBlob, error) {
	return r.blob, nil
}

// memManager returns a manager whose registry serves the eStargz fixture from memory, and the
// fixture's blob.
func memManager(t *testing.T, opts ...option) (*Manager, *memBlob, testlayer.Fixture) {
	t.Helper()
	fs, err := testlayer.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	f := fs[3]
	if f.Format != chunked.EStargz {
		t.Fatalf("fixture 3 is %v", f.Format)
	}
	c, err := cache.New(t.TempDir(), cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	blob := newMemBlob(f.Blob)
	m, err := newTestManager(&memRegistry{f: f, blob: blob}, c, append([]option{withPrefetch(false)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, blob, f
}

const memRef = "registry.example/app:v1"

// fileOf returns the owner of path in l.
func fileOf(t *testing.T, l *Served, path string) chunked.EntryID {
	t.Helper()
	id, ok := l.Index().LookupPath(path)
	if !ok {
		t.Fatalf("no %s", path)
	}
	return l.Index().Entry(id).Inode
}

// TestConcurrentReadsShareOneFetch: readers of one chunk at once cause one fetch, and all
// get its verified bytes.
func TestConcurrentReadsShareOneFetch(t *testing.T) {
	m, blob, _ := memManager(t, withReadAhead(0))
	l, err := m.Lookup(t.Context(), memRef, servedKeyOf(m))
	if err != nil {
		t.Fatal(err)
	}
	const path = "usr/bin/tool"
	want := referenceContent(t)[path]
	id := fileOf(t, l, path)
	gate := blob.hold()
	before := blob.count()
	const readers = 8
	got := make([]string, readers)
	errs := make([]error, readers)
	var wg sync.WaitGroup
	for i := range readers {
		wg.Go(func() {
			p := make([]byte, l.Index().Entry(id).Size)
			_, errs[i] = l.ReadFile(t.Context(), id, p, 0)
			sum := sha256.Sum256(p)
			got[i] = hex.EncodeToString(sum[:])
		})
	}
	<-blob.started                    // the first fetch is on its way
	time.Sleep(50 * time.Millisecond) // room for the other readers to join it, or wrongly fetch again
	close(gate)
	wg.Wait()
	for i := range readers {
		if errs[i] != nil || got[i] != want {
			t.Errorf("reader %d: %v, sha256 %s, want %s", i, errs[i], got[i], want)
		}
	}
	if n := blob.count() - before; n != 1 {
		t.Errorf("%d fetches for one chunk read by %d readers at once, want 1", n, readers)
	}
}

func servedKeyOf(m *Manager) digest.Digest { return m.reg.(*memRegistry).f.Desc.Digest }

func readOne(t *testing.T, l *Served, id chunked.EntryID) []byte {
	t.Helper()
	p := make([]byte, l.Index().Entry(id).Size)
	n, err := l.ReadFile(t.Context(), id, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p[:n]
}

// TestOpenFilesBounded: the manager keeps at most WithOpenFiles cache files open between
// reads, least recently used closed first, and a file being read stays open.
func TestOpenFilesBounded(t *testing.T) {
	m, _, _ := memManager(t, withOpenFiles(2))
	l, err := m.Lookup(t.Context(), memRef, servedKeyOf(m))
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{"etc/hostname", "usr/bin/tool", "usr/bin/group-tool", "usr/share/doc/deep/er/README"}
	for _, p := range paths {
		readOne(t, l, fileOf(t, l, p))
		m.life.wait() // the chunks' stores, which open files of their own
		if n := m.files.len(); n > 2 {
			t.Fatalf("%d cache files open after reading %s, want at most 2", n, p)
		}
	}
	last := l.Index().Entry(fileOf(t, l, paths[len(paths)-1])).Digest
	first := l.Index().Entry(fileOf(t, l, paths[0])).Digest
	if !m.files.isOpen(last) || m.files.isOpen(first) {
		t.Errorf("least recently used not closed first: last open %v, first open %v", m.files.isOpen(last), m.files.isOpen(first))
	}
	// A handle in use is never closed, even beyond the bound.
	var held []*handle
	for _, p := range paths {
		e := l.Index().Entry(fileOf(t, l, p))
		h, err := m.files.acquire(e.Digest, e.Size)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	if n := m.files.len(); n != len(paths) {
		t.Errorf("%d files open with %d in use", n, len(paths))
	}
	for _, h := range held {
		m.files.release(h)
	}
	if n := m.files.len(); n > 2 {
		t.Errorf("%d files open once released, want at most 2", n)
	}
}

// TestJanitorForgets: a layer no runtime uses is forgotten keepTTL after its last lookup; a
// used one is kept however long; released, it goes after keepTTL.
func TestJanitorForgets(t *testing.T) {
	clock := newTestClock()
	m, _, _ := memManager(t, withClock(clock.now), withKeepTTL(time.Minute))
	key := servedKeyOf(m)
	if _, err := m.Lookup(t.Context(), memRef, key); err != nil {
		t.Fatal(err)
	}
	const other = "registry.example/other:v1"
	if _, err := m.Lookup(t.Context(), other, key); err != nil {
		t.Fatal(err)
	}
	m.Use(other, key)
	clock.advance(2 * time.Minute)
	m.expire()
	st := m.Status()
	if len(st.Layers) != 1 || len(st.Layers[0].Refs) == 0 {
		t.Fatalf("layers after keepTTL with one used: %+v", st.Layers)
	}
	if _, _, ok := m.remembered(layerKey{memRef, key}); ok {
		t.Error("the unused resolution is still remembered")
	}
	m.Release(other, key)
	clock.advance(30 * time.Second)
	m.expire()
	if n := len(m.Status().Layers); n != 1 {
		t.Errorf("%d layers within keepTTL of the release, want 1", n)
	}
	clock.advance(time.Minute)
	m.expire()
	if n := len(m.Status().Layers); n != 0 {
		t.Errorf("%d layers keepTTL after the release, want 0", n)
	}
}

// TestJanitorKeepsResolving: a layer made live is kept while the resolution that made it live
// is not remembered yet (the rest of its lookup still running), for as long as a resolution
// may take; then, named by no resolution, it is forgotten.
func TestJanitorKeepsResolving(t *testing.T) {
	clock := newTestClock()
	m, _, _ := memManager(t, withClock(clock.now), withKeepTTL(time.Minute))
	key := servedKeyOf(m)
	if _, err := m.Lookup(t.Context(), memRef, key); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	delete(m.resolved, layerKey{memRef, key}) // as between addLive and remember
	m.mu.Unlock()
	clock.advance(time.Second)
	m.expire()
	if n := len(m.Status().Layers); n != 1 {
		t.Fatalf("%d layers while the resolution is not remembered yet, want 1", n)
	}
	clock.advance(m.opts.resolveTimeout)
	m.expire()
	if n := len(m.Status().Layers); n != 0 {
		t.Errorf("%d layers named by no resolution after the resolution's time, want 0", n)
	}
}

// TestCloseWhileReading: Close while reads wait on fetches that do not answer ends the
// fetches, fails the reads, and returns; reads after Close still fail cleanly or succeed,
// never hang.
func TestCloseWhileReading(t *testing.T) {
	m, blob, _ := memManager(t, withReadTimeout(time.Hour))
	l, err := m.Lookup(t.Context(), memRef, servedKeyOf(m))
	if err != nil {
		t.Fatal(err)
	}
	blob.hold() // never released
	id := fileOf(t, l, "usr/share/big.bin")
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			_, err := l.ReadFile(context.Background(), id, make([]byte, 4096), int64(i)*64<<10)
			errs <- err
		}()
	}
	<-blob.started
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	for range 4 {
		select {
		case err := <-errs:
			if err == nil {
				t.Error("a read of a fetch that never answered succeeded")
			} else if !errors.Is(err, context.Canceled) {
				t.Logf("read failed with %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a read still waiting 30 s after Close")
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waiting")
	}
	read := make(chan error, 1)
	go func() { _, err := l.ReadFile(context.Background(), id, make([]byte, 10), 0); read <- err }()
	select {
	case <-read:
	case <-time.After(30 * time.Second):
		t.Fatal("a read after Close hangs")
	}
}

// len returns how many cache files are open.
func (hs *handles) len() int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return len(hs.open)
}

// isOpen reports whether the cache file sum is open.
func (hs *handles) isOpen(sum chunked.Sum) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.open[sum] != nil
}

// TestFetchKinds: a read a runtime waits for counts as demand while it fetches (background
// work yields to it); a fetch ahead, which nobody waits for yet, does not.
func TestFetchKinds(t *testing.T) {
	m, blob, _ := memManager(t)
	l, err := m.Lookup(t.Context(), memRef, servedKeyOf(m))
	if err != nil {
		t.Fatal(err)
	}
	id := fileOf(t, l, "usr/share/big.bin")
	if n := len(l.Index().Chunks(id)); n < 3 {
		t.Fatalf("big.bin has %d chunks", n)
	}

	gate := blob.hold()
	l.fetchAhead(chunkKey{id, 2})
	<-blob.started
	if n := m.sched.demand.Load(); n != 0 {
		t.Errorf("a fetch ahead counts as %d demand fetches", n)
	}
	close(gate)
	m.life.wait()

	gate = blob.hold()
	read := make(chan error, 1)
	go func() { _, err := l.ReadFile(t.Context(), id, make([]byte, 10), 0); read <- err }()
	<-blob.started
	if n := m.sched.demand.Load(); n != 1 {
		t.Errorf("a read waiting for the registry counts as %d demand fetches, want 1", n)
	}
	close(gate)
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if n := m.sched.demand.Load(); n != 0 {
		t.Errorf("%d demand fetches after the read returned", n)
	}
}
