package layer

import (
	"archive/tar"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

type testEnv struct {
	t        *testing.T
	reg      *testregistry.Registry
	cache    *cache.Cache
	fixtures []testlayer.Fixture
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	reg, err := testregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	c, err := cache.New(t.TempDir(), cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fs, err := testlayer.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{t: t, reg: reg, cache: c, fixtures: fs}
}

func (e *testEnv) manager(opts ...option) *Manager {
	e.t.Helper()
	m, err := newTestManager(ClientRegistry(testClient(e.t, e.reg)), e.cache, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { m.Close() })
	return m
}

func fixtureLayer(f testlayer.Fixture) testregistry.LayerBlob {
	return testregistry.LayerBlob{Blob: f.Blob, MediaType: f.Desc.MediaType, Annotations: f.Desc.Annotations, DiffID: f.DiffID}
}

// gzipLayer is a plain gzip layer of the reference tar.
func gzipLayer(t *testing.T) testregistry.LayerBlob {
	l, err := testregistry.GzipLayer(testlayer.Tar())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (e *testEnv) push(repoTag string, layers ...testregistry.LayerBlob) string {
	e.t.Helper()
	if _, err := e.reg.Push(e.t.Context(), repoTag, layers); err != nil {
		e.t.Fatal(err)
	}
	return e.reg.Host + "/" + repoTag
}

// testClock is a clock tests move by hand.
// lookupFixture pushes fixture f to e as repo:v1 and looks it up by toc, its TOC digest, in a
// manager with opts: the reference, the manager and the layer.
func (e *testEnv) lookupFixture(repo string, f testlayer.Fixture, toc digest.Digest, opts ...option) (string, *Manager, *Served) {
	e.t.Helper()
	ref := e.push(repo+":v1", fixtureLayer(f))
	m := e.manager(opts...)
	l, err := m.Lookup(e.t.Context(), ref, toc)
	if err != nil {
		e.t.Fatal(err)
	}
	return ref, m, l
}

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Unix(1e9, 0)} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func hostArch() string { return runtime.GOARCH }

// testClient returns a registry client for reg, the only registry it may reach (over plain
// http, as registries.conf allows it).
func testClient(t *testing.T, reg *testregistry.Registry) *fetcher.Client {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "registries.conf")
	if err := os.WriteFile(conf, []byte(testregistry.RegistriesConf(reg.Host)), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := fetcher.NewClient(fetcher.Config{RegistriesConf: conf, RegistriesConfDir: conf + ".d"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dirEntry is a directory of a test layer.
func dirEntry(name string) testlayer.Entry {
	return testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: testlayer.Epoch}}
}
