package layer

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testlog"
	"github.com/layerstore/layerstore/internal/testutil/testtmpfs"
)

// TestPrefetchNotStored: a layer whose files the cache does not keep (a cache smaller than
// the layer: each file is evicted once stored) is not reported fully local after its
// background fetch, whatever the format.
func TestPrefetchNotStored(t *testing.T) {
	e := newEnv(t)
	for _, f := range e.fixtures {
		t.Run(f.Name, func(t *testing.T) {
			if servedKey(f) == "" {
				t.Skip("served to no runtime")
			}
			c, err := cache.New(t.TempDir(), cache.Config{MaxSize: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			logs := &testlog.Handler{}
			m, err := newTestManager(ClientRegistry(testClient(t, e.reg)), c, withLogger(slog.New(logs)), withPrefetchQuiet(0))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			ref := e.push("notstored/"+f.Name+":v1", fixtureLayer(f))
			l, err := m.Lookup(t.Context(), ref, servedKey(f))
			if err != nil {
				t.Fatal(err)
			}
			l.wait()
			if st := l.Status(); st.State != protocol.StateFailed || !strings.Contains(st.Error, "not stored") {
				t.Errorf("state %s (%s), want failed: files not stored", st.State, st.Error)
			}
			if _, lines := logs.Count(); slicesContain(lines, "layer fully local") {
				t.Errorf("logged the layer fully local: %q", lines)
			}
		})
	}
}

// TestPrefetchNoSpace: on a full cache disk the background fetch of a layer logs a bounded
// number of lines (not one per file) and the layer is not reported fully local.
func TestPrefetchNoSpace(t *testing.T) {
	testtmpfs.Run(t, "1m", func(t *testing.T, dir string) {
		e := newEnv(t)
		f := e.fixtures[0]
		for _, fx := range e.fixtures {
			if strings.HasPrefix(fx.Name, "estargz") { // no DiffID to prove: completion rests on the cache alone
				f = fx
				break
			}
		}
		cacheLogs, logs := &testlog.Handler{}, &testlog.Handler{}
		c, err := cache.New(filepath.Join(dir, "cache"), cache.Config{Logger: slog.New(cacheLogs)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		testtmpfs.Fill(t, dir)
		m, err := newTestManager(ClientRegistry(testClient(t, e.reg)), c, withLogger(slog.New(logs)), withPrefetchQuiet(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		ref := e.push("nospace/"+f.Name+":v1", fixtureLayer(f))
		l, err := m.Lookup(t.Context(), ref, servedKey(f))
		if err != nil {
			t.Fatal(err)
		}
		l.wait()
		if st := l.Status(); st.State != protocol.StateFailed || !strings.Contains(st.Error, cache.ErrNoSpace.Error()) {
			t.Errorf("state %s (%s), want failed: no space", st.State, st.Error)
		}
		warns, lines := logs.Count()
		cacheWarns, cacheLines := cacheLogs.Count()
		t.Logf("layer: %q\ncache: %q", lines, cacheLines)
		if warns > 1 || cacheWarns > 1 {
			t.Errorf("%d warnings from the layer and %d from the cache for one layer on a full disk, want at most one each", warns, cacheWarns)
		}
	})
}

func slicesContain(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}
