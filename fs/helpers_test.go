package storefs

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testfuse"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// testStore is a Store over in-memory layers that counts every call.
type testStore struct {
	mu       sync.Mutex
	layers   map[string]map[digest.Digest]Layer // ref -> key -> layer
	errs     map[digest.Digest]error            // injected Lookup errors
	lookups  map[string]int                     // "ref key" -> calls
	uses     map[string]int
	releases map[string]int
}

func newTestStore() *testStore {
	return &testStore{
		layers:   map[string]map[digest.Digest]Layer{},
		errs:     map[digest.Digest]error{},
		lookups:  map[string]int{},
		uses:     map[string]int{},
		releases: map[string]int{},
	}
}

// add serves l under ref by both of its keys.
func (s *testStore) add(ref string, l *testLayer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.layers[ref] == nil {
		s.layers[ref] = map[digest.Digest]Layer{}
	}
	s.layers[ref][l.tocKey] = l
	s.layers[ref][l.blobKey] = l
}

func (s *testStore) setErr(key digest.Digest, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.errs, key)
	} else {
		s.errs[key] = err
	}
}

func (s *testStore) Lookup(ctx context.Context, ref string, key digest.Digest) (Layer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups[ref+" "+key.String()]++
	if err := s.errs[key]; err != nil {
		return nil, err
	}
	if l, ok := s.layers[ref][key]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("layer %s of %s: %w", key, ref, iofs.ErrNotExist)
}

func (s *testStore) Use(ref string, key digest.Digest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.uses[ref+" "+key.String()]++
}

func (s *testStore) Release(ref string, key digest.Digest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releases[ref+" "+key.String()]++
}

// count returns a counter of m for (ref, key) under the lock.
func (s *testStore) count(m map[string]int, ref string, key digest.Digest) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return m[ref+" "+key.String()]
}

func (s *testStore) totalLookups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.lookups {
		n += c
	}
	return n
}

// testLayer is a Layer over a fixture blob in memory, reading content chunk by chunk
// through verify.Verifier.ReadChunk like the real layer package does.
type testLayer struct {
	fixture testlayer.Fixture
	v       *verify.Verifier
	src     verify.Source
	tocKey  digest.Digest
	blobKey digest.Digest
	readErr error                      // returned by ReadFile and ReadBlob when set
	backing map[chunked.EntryID]string // files Backing opens

	mu        sync.Mutex
	infoExtra string                  // JSON members added to Info, to make it change
	reads     map[chunked.EntryID]int // ReadFile calls
	readers   map[uint32]int          // ReadFile calls by the uid of the FUSE request
	backings  map[chunked.EntryID]int // Backing calls
	executing []chunked.EntryID       // Executing calls
	opened    []*os.File              // files Backing returned
}

var _ Layer = (*testLayer)(nil)

func newTestLayer(t *testing.T, f testlayer.Fixture) *testLayer {
	t.Helper()
	l, err := openTestLayer(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// openTestLayer opens fixture f as a layer; the same fixture gives the same index in every
// process.
func openTestLayer(ctx context.Context, f testlayer.Fixture) (*testLayer, error) {
	src := testlayer.BlobSource(f.Blob)
	v, err := verify.Open(ctx, f.Desc, f.DiffID, src, verify.Config{})
	if err != nil {
		return nil, fmt.Errorf("verify.Open(%s): %w", f.Name, err)
	}
	layout, err := chunked.Classify(f.Desc)
	if err != nil {
		return nil, fmt.Errorf("Classify(%s): %w", f.Name, err)
	}
	return &testLayer{
		fixture:  f,
		v:        v,
		src:      src,
		tocKey:   layout.TOCDigest,
		blobKey:  f.Desc.Digest,
		backing:  map[chunked.EntryID]string{},
		reads:    map[chunked.EntryID]int{},
		readers:  map[uint32]int{},
		backings: map[chunked.EntryID]int{},
	}, nil
}

func (l *testLayer) Index() *chunked.Index { return l.v.Index() }

func (l *testLayer) Info(key digest.Digest) []byte {
	info := l.baseInfo(key)
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(info[:len(info)-1], l.infoExtra+"}"...)
}

func (l *testLayer) baseInfo(key digest.Digest) []byte {
	compression := 4
	if !l.fixture.Format.Zstd() {
		compression = 2
	}
	if key == l.tocKey {
		return fmt.Appendf(nil, `{"toc-digest":%q,"flags":{"expected-layer-diffid":%q},"compressed-size":%d,"diff-size":-1,"compression":%d}`,
			l.tocKey, l.fixture.DiffID, len(l.fixture.Blob), compression)
	}
	return fmt.Appendf(nil, `{"compressed-diff-digest":%q,"compressed-size":%d,"diff-digest":%q,"diff-size":-1,"compression":%d}`,
		l.blobKey, len(l.fixture.Blob), l.fixture.DiffID, compression)
}

func (l *testLayer) ReadFile(ctx context.Context, id chunked.EntryID, p []byte, off int64) (int, error) {
	l.mu.Lock()
	l.reads[id]++
	if c, ok := fuse.FromContext(ctx); ok {
		l.readers[c.Uid]++
	}
	l.mu.Unlock()
	if l.readErr != nil {
		return 0, l.readErr
	}
	x := l.v.Index()
	size := x.Entry(id).Size
	n := 0
	for n < len(p) && off < size {
		i := x.ChunkAt(id, off)
		if i < 0 {
			return n, fmt.Errorf("no chunk at %d of %s", off, x.Path(id))
		}
		c, err := l.v.ReadChunk(ctx, l.src, id, i)
		if err != nil {
			return n, err
		}
		b := c.Bytes()[off-c.Ref().FileOffset:]
		k := copy(p[n:], b)
		n += k
		off += int64(k)
	}
	return n, nil
}

func (l *testLayer) Backing(id chunked.EntryID) *os.File {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.backings[id]++
	name, ok := l.backing[id]
	if !ok {
		return nil
	}
	f, err := os.Open(name)
	if err != nil {
		return nil
	}
	l.opened = append(l.opened, f)
	return f
}

func (l *testLayer) Executing(id chunked.EntryID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.executing = append(l.executing, id)
}

func (l *testLayer) BlobSize() int64 { return int64(len(l.fixture.Blob)) }

func (l *testLayer) ReadBlob(_ context.Context, p []byte, off int64) (int, error) {
	if l.readErr != nil {
		return 0, l.readErr
	}
	if off >= int64(len(l.fixture.Blob)) {
		return 0, io.EOF
	}
	return copy(p, l.fixture.Blob[off:]), nil
}

func (l *testLayer) calls(m map[chunked.EntryID]int, id chunked.EntryID) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return m[id]
}

// fixtures are built once per test binary.
var fixtures = sync.OnceValues(testlayer.Fixtures)

func loadFixtures(t *testing.T) []testlayer.Fixture {
	t.Helper()
	all, err := fixtures()
	if err != nil {
		t.Fatalf("fixtures: %v", err)
	}
	return all
}

// fixture returns the fixture called name.
func fixture(t *testing.T, name string) testlayer.Fixture {
	t.Helper()
	for _, f := range loadFixtures(t) {
		if f.Name == name {
			return f
		}
	}
	t.Fatalf("no fixture %q", name)
	return testlayer.Fixture{}
}

// refDirName returns the directory name of ref in the store root.
func refDirName(ref string) string { return base64.StdEncoding.EncodeToString([]byte(ref)) }

// layerPath returns <mnt>/<b64 ref>/<key>/elem...
func layerPath(mnt, ref string, key digest.Digest, elem ...string) string {
	return filepath.Join(append([]string{mnt, refDirName(ref), key.String()}, elem...)...)
}

// mountTest mounts store on a fresh directory and unmounts it when the test ends. A
// watchdog aborts the FUSE connection if the test outlives its budget, so that a hung
// server fails the test instead of blocking it forever; the wait for the server's end after
// the unmount is bounded too (a copy of the mount in another mount namespace keeps the
// connection alive).
func mountTest(t *testing.T, store Store, opts Config) (string, *Server) {
	t.Helper()
	testfuse.Require(t)
	mnt := testfuse.OpenTempDir(t) // other users reach the mount
	srv, err := Mount(mnt, store, opts)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	conn := testfuse.Record(t, mnt)
	budget := 2 * time.Minute
	if d, ok := t.Deadline(); ok && time.Until(d)-10*time.Second < budget {
		budget = max(time.Until(d)-10*time.Second, time.Second)
	}
	watchdog := time.AfterFunc(budget, func() {
		t.Errorf("watchdog: aborting the FUSE connection at %s after %v", mnt, budget)
		_ = conn.Abort()
	})
	t.Cleanup(func() {
		watchdog.Stop()
		if err := srv.Unmount(); err != nil {
			t.Errorf("Unmount: %v", err)
			if err := conn.Abort(); err != nil {
				t.Error(err)
			}
		}
		conn.WaitEnd(t, srv.Wait)
	})
	return mnt, srv
}

// mountedLayer is a fresh mount whose store serves one layer under testRef by both of its keys.
type mountedLayer struct {
	store *testStore
	mnt   string
	srv   *Server
	l     *testLayer
}

// mountLayer mounts, with opts, a store serving l under testRef (mountTest).
func mountLayer(t *testing.T, l *testLayer, opts Config) mountedLayer {
	t.Helper()
	store := newTestStore()
	store.add(testRef, l)
	mnt, srv := mountTest(t, store, opts)
	return mountedLayer{store: store, mnt: mnt, srv: srv, l: l}
}

// path returns the path of elem... in the layer's directory of testRef by its TOC key.
func (m mountedLayer) path(elem ...string) string {
	return layerPath(m.mnt, testRef, m.l.tocKey, elem...)
}

// errnoOf extracts the errno of an error from the os package.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

// wantErrno fails the test unless err carries want.
func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if got := errnoOf(err); got != want {
		t.Errorf("%s: got error %v (%d), want %v", what, err, got, want)
	}
}

// defaultConfig is the configuration the daemon runs with as root: passthrough, one hour timeouts
// for the immutable tree, no logging.
func defaultConfig() Config {
	return Config{EntryTimeout: DefaultEntryTimeout, AttrTimeout: DefaultAttrTimeout, Passthrough: true}
}
