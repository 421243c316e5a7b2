package layer

import (
	"bytes"
	"errors"
	iofs "io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testproc"
	"github.com/layerstore/layerstore/verify"
)

// restartEnv is a cache directory shared by successive managers, as the daemon's cache
// directory is by its successive processes.
type restartEnv struct {
	*testEnv
	root string
}

func newRestartEnv(t *testing.T) *restartEnv {
	e := newEnv(t)
	return &restartEnv{testEnv: e, root: t.TempDir()}
}

// start opens the cache and a manager on it (startManager).
func (e *restartEnv) start(opts ...option) (m *Manager, stop func()) {
	e.t.Helper()
	return startManager(e.t, e.root, ClientRegistry(testClient(e.t, e.reg)), opts...)
}

// startManager opens the cache at root and a manager on it resolving through reg, as a daemon
// start does. stop closes both, at the latest when the test ends.
func startManager(t *testing.T, root string, reg Registry, opts ...option) (m *Manager, stop func()) {
	t.Helper()
	c, err := cache.New(root, cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m, err = newTestManager(reg, c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	done := false
	stop = func() {
		if !done {
			done = true
			m.Close()
			c.Close()
		}
	}
	t.Cleanup(stop)
	return m, stop
}

// TestRestartWithoutRegistry is the reboot during a registry outage: a layer fully fetched
// before a restart is served completely after it, with the registry gone, from its record and
// the cache; the registry is not asked at all.
func TestRestartWithoutRegistry(t *testing.T) {
	for _, f := range mustFixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			if servedKey(f) == "" {
				t.Skip("served to no runtime")
			}
			e := newRestartEnv(t)
			ref := e.push("app/records:v1", fixtureLayer(f))
			m, stop := e.start(withPrefetch(true))
			l, err := m.Lookup(t.Context(), ref, servedKey(f))
			if err != nil {
				t.Fatal(err)
			}
			want := readAll(t, l, 1<<20)
			waitComplete(t, l)
			stop()

			e.reg.Close() // the registry is down from here on
			m, _ = e.start(withPrefetch(true))
			l, err = m.Lookup(t.Context(), ref, servedKey(f))
			if err != nil {
				t.Fatalf("lookup after the restart, registry down: %v", err)
			}
			compareContent(t, readAll(t, l, 1<<20), want)
			if n := m.counters.fromRecords.Load(); n != 1 {
				t.Errorf("%d resolutions from records, want 1", n)
			}
			if got := l.Info(servedKey(f)); len(got) == 0 {
				t.Error("no info")
			}
		})
	}
}

// TestRestartPartialWithoutRegistry: after a restart with the registry down, the files the
// cache holds are served and the others fail, quickly, with the registry's error.
func TestRestartPartialWithoutRegistry(t *testing.T) {
	f := mustFixtures(t)[3]
	e := newRestartEnv(t)
	ref := e.push("app/partial:v1", fixtureLayer(f))
	m, stop := e.start(withReadAhead(0))
	l, err := m.Lookup(t.Context(), ref, servedKey(f))
	if err != nil {
		t.Fatal(err)
	}
	idx := l.Index()
	var read, unread []chunked.EntryID
	for id := range chunked.EntryID(idx.Len()) {
		en := idx.Entry(id)
		if en.Visible() && en.Type == chunked.TypeReg && en.Inode == id && en.Size > 0 {
			if len(read) <= len(unread) {
				read = append(read, id)
			} else {
				unread = append(unread, id)
			}
		}
	}
	if len(read) == 0 || len(unread) == 0 {
		t.Fatalf("fixture has %d regular files", len(read)+len(unread))
	}
	want := map[chunked.EntryID][]byte{}
	for _, id := range read {
		b := make([]byte, idx.Entry(id).Size)
		if _, err := l.ReadFile(t.Context(), id, b, 0); err != nil {
			t.Fatal(err)
		}
		want[id] = b
	}
	stop()

	e.reg.Close()
	m, _ = e.start(withReadTimeout(5 * time.Second))
	l, err = m.Lookup(t.Context(), ref, servedKey(f))
	if err != nil {
		t.Fatalf("lookup after the restart, registry down: %v", err)
	}
	for _, id := range read {
		b := make([]byte, len(want[id]))
		if _, err := l.ReadFile(t.Context(), id, b, 0); err != nil || string(b) != string(want[id]) {
			t.Errorf("cached file %s: %v", idx.Path(id), err)
		}
	}
	// Files read ahead with those read are in the cache: the test reads one that is not.
	unread = slices.DeleteFunc(unread, func(id chunked.EntryID) bool { return m.cache.Has(idx.Entry(id).Digest) })
	if len(unread) == 0 {
		t.Fatal("every file of the fixture is in the cache: the test shows nothing")
	}
	start := time.Now()
	b := make([]byte, idx.Entry(unread[0]).Size)
	if _, err := l.ReadFile(t.Context(), unread[0], b, 0); err == nil {
		t.Errorf("file %s never fetched was served with the registry down", idx.Path(unread[0]))
	}
	if d := time.Since(start); d > 5*time.Second+time.Second {
		t.Errorf("a read that needs the registry failed after %v, more than the read timeout", d)
	}
}

// TestRecordNotForOtherRepository: a record answers only lookups through the repositories
// the layer was resolved through. The same layer looked up through another repository goes
// to the registry, which refuses it there (it does not serve the blob in that repository).
func TestRecordNotForOtherRepository(t *testing.T) {
	f := mustFixtures(t)[3]
	e := newRestartEnv(t)
	ref := e.push("team/private:v1", fixtureLayer(f))
	m, stop := e.start()
	if _, err := m.Lookup(t.Context(), ref, servedKey(f)); err != nil {
		t.Fatal(err)
	}
	stop()

	m, _ = e.start()
	other := e.reg.Host + "/someone/else:v1"
	if _, err := m.Lookup(t.Context(), other, servedKey(f)); err == nil {
		t.Fatal("the record served a lookup through a repository it was never resolved for")
	}
	if n := m.counters.fromRecords.Load(); n != 0 {
		t.Errorf("%d resolutions from records, want 0", n)
	}
	if _, err := m.Lookup(t.Context(), ref, servedKey(f)); err != nil {
		t.Fatalf("lookup through the recorded repository: %v", err)
	}
	if n := m.counters.fromRecords.Load(); n != 1 {
		t.Errorf("%d resolutions from records, want 1", n)
	}
}

// TestDamagedRecordRebuilt: a record damaged on disk (a flipped byte) is dropped, the layer is
// resolved through the registry again and its record written anew.
func TestDamagedRecordRebuilt(t *testing.T) {
	f := mustFixtures(t)[3]
	e := newRestartEnv(t)
	ref := e.push("app/damaged:v1", fixtureLayer(f))
	m, stop := e.start()
	l, err := m.Lookup(t.Context(), ref, servedKey(f))
	if err != nil {
		t.Fatal(err)
	}
	name := recordName(l.id)
	want := readAll(t, l, 1<<20)
	stop()

	path := filepath.Join(e.root, "records", name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the record is not where cache/doc.go says: %v", err)
	}
	b[len(b)-1] ^= 0x40
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m, _ = e.start()
	l, err = m.Lookup(t.Context(), ref, servedKey(f))
	if err != nil {
		t.Fatalf("lookup with a damaged record: %v", err)
	}
	compareContent(t, readAll(t, l, 1<<20), want)
	if n := m.counters.fromRecords.Load(); n != 0 {
		t.Errorf("%d resolutions from a damaged record", n)
	}
	// The record is stored in the background, after the lookup's answer.
	waitFor(t, "the record to be written again", func() bool {
		_, err := m.cache.RecordMeta(name)
		return err == nil
	})
}

// TestRecordKeyOfOtherLayerRefused: a lookup by a key the record does not hold (another
// layer of the same repository) is never answered by it.
func TestRecordKeyOfOtherLayerRefused(t *testing.T) {
	fs := mustFixtures(t)
	e := newRestartEnv(t)
	ref := e.push("app/one:v1", fixtureLayer(fs[3]))
	m, stop := e.start()
	if _, err := m.Lookup(t.Context(), ref, servedKey(fs[3])); err != nil {
		t.Fatal(err)
	}
	stop()
	e.reg.Close()
	m, _ = e.start()
	if _, err := m.Lookup(t.Context(), ref, servedKey(fs[4])); err == nil || errors.Is(err, iofs.ErrNotExist) && m.counters.fromRecords.Load() != 0 {
		t.Fatalf("lookup of another key: %v (from records: %d)", err, m.counters.fromRecords.Load())
	}
}

func mustFixtures(t *testing.T) []testlayer.Fixture {
	t.Helper()
	fs, err := testlayer.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// waitComplete waits for the layer's background fetch to end, and fails unless it completed.
func waitComplete(t *testing.T, l *Served) {
	t.Helper()
	l.wait()
	if s := l.Status(); s.State != protocol.StateComplete {
		t.Fatalf("background fetch %s: %s", s.State, s.Error)
	}
}

// TestRecordWrittenInPlace: a verified layer's record is written from its index's own bytes,
// and the layer served from the record's mapping is the same index, compared with the one it
// was written from rather than checked again as a record found on disk is: the write costs
// far less heap than the index's size (before: a copy of the index to write it, then the
// check's transient memory).
func TestRecordWrittenInPlace(t *testing.T) {
	f := syntheticLayer(t, 20000, nil)
	v, err := verify.Open(t.Context(), f.Desc, f.DiffID, testlayer.BlobSource(f.Blob), verify.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(t.TempDir(), cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rs := loadRecords(c, chunked.Limits{}.WithDefaults(), slog.New(slog.DiscardHandler))
	desc := fetcher.ImageLayer{Descriptor: f.Desc, DiffID: f.DiffID}
	size := len(v.Index().Binary())
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rv, _, store, err := rs.write(desc, v, []string{"example.com/synthetic"}, []string{"example.com/synthetic:v1"})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if err := store(); err != nil {
		t.Fatal(err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(size)/4 {
		t.Errorf("writing the record of a %d-byte index allocated %d bytes", size, got)
	}
	// The forms of rv's and ov's indexes are mappings: read while rv and ov are alive.
	a := v.Index().Binary()
	if !bytes.Equal(a, rv.Index().Binary()) {
		t.Error("the index served from the record differs from the one written")
	}
	// A record found on disk is checked as untrusted.
	_, ov, _, err := rs.open(recordNameOf(t, rs))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, ov.Index().Binary()) {
		t.Error("the index opened from the record differs from the one written")
	}
	runtime.KeepAlive(rv)
	runtime.KeepAlive(ov)
}

// recordNameOf returns the name of the only record rs has indexed.
func recordNameOf(t *testing.T, rs *records) string {
	t.Helper()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, list := range rs.byKey {
		for _, s := range list {
			return s.name
		}
	}
	t.Fatal("no record indexed")
	return ""
}

// TestRecordIndexNotResident: the check of a record's index, written or found on disk, reads
// all of it through the mapping; the pages are then given back, so that a resolved layer's
// resident memory is what its lookups and reads use, not its whole index.
func TestRecordIndexNotResident(t *testing.T) {
	f := syntheticLayer(t, 200000, nil)
	v, err := verify.Open(t.Context(), f.Desc, f.DiffID, testlayer.BlobSource(f.Blob), verify.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(t.TempDir(), cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rs := loadRecords(c, chunked.Limits{}.WithDefaults(), slog.New(slog.DiscardHandler))
	size := int64(len(v.Index().Binary()))
	before := testproc.RSSFile(t)
	rv, _, store, err := rs.write(fetcher.ImageLayer{Descriptor: f.Desc, DiffID: f.DiffID}, v, []string{"example.com/synthetic"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store(); err != nil {
		t.Fatal(err)
	}
	if got := testproc.RSSFile(t) - before; got > size/2 {
		t.Errorf("writing the record of a %d-byte index: %d more bytes of files resident", size, got)
	}
	before = testproc.RSSFile(t)
	_, ov, _, err := rs.open(recordNameOf(t, rs))
	if err != nil {
		t.Fatal(err)
	}
	if got := testproc.RSSFile(t) - before; got > size/2 {
		t.Errorf("opening the record of a %d-byte index: %d more bytes of files resident", size, got)
	}
	if rv.Index().Len() != v.Index().Len() || ov.Index().Len() != v.Index().Len() {
		t.Error("the indexes served differ from the one written")
	}
	runtime.KeepAlive(rv)
	runtime.KeepAlive(ov)
}
