package layer

import (
	"archive/tar"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testtmpfs"
)

// layerFiles returns the digests of a layer's regular files with content.
func layerFiles(l *Served) []chunked.Sum {
	var out []chunked.Sum
	idx := l.Index()
	for id := range chunked.EntryID(idx.Len()) {
		e := idx.Entry(id)
		if e.Type == chunked.TypeReg && e.Inode == id && e.Size > 0 && !e.Digest.IsZero() {
			out = append(out, e.Digest)
		}
	}
	return out
}

// TestPinSurvivesEviction: the files and record of a pinned image stay in a cache filled far
// past its bound by other images, and go once unpinned; the pin and the record survive a
// restart, and the pinned image is then served with the registry down.
func TestPinSurvivesEviction(t *testing.T) {
	fs := mustFixtures(t)
	e := newRestartEnv(t)
	pinned := e.push("app/pinned:v1", fixtureLayer(fs[3]))
	c, err := cache.New(e.root, cache.Config{MaxSize: 1}) // every file not held is evicted at once
	if err != nil {
		t.Fatal(err)
	}
	m, err := newTestManager(ClientRegistry(testClient(t, e.reg)), c, withOpenFiles(1))
	if err != nil {
		t.Fatal(err)
	}
	p, err := m.Pin(t.Context(), pinned, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Layers) != 1 || p.Present != p.Bytes || p.Bytes == 0 {
		t.Fatalf("pin: %+v, want one layer, all present", p)
	}
	l, err := m.Lookup(t.Context(), pinned, servedKey(fs[3]))
	if err != nil {
		t.Fatal(err)
	}
	files := layerFiles(l)
	var evicted []chunked.Sum
	for i := range 3 {
		data := make([]byte, 256<<10)
		for k := range data {
			data[k] = byte(k*(i+3) + k>>8)
		}
		f, err := testlayer.BuildEStargz("other", testlayer.Build([]testlayer.Entry{bigFile("other.bin", data)}))
		if err != nil {
			t.Fatal(err)
		}
		ol, err := m.Lookup(t.Context(), e.push(fmt.Sprintf("app/other%d:v1", i), fixtureLayer(f)), tocKey(f.Desc.Annotations))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, ol, 1<<20)
		id, ok := ol.Index().LookupPath("other.bin")
		if !ok {
			t.Fatal("no other.bin")
		}
		evicted = append(evicted, ol.Index().Entry(id).Digest)
	}
	kept := 0
	for range 50 {
		kept = 0
		for _, d := range evicted {
			if c.Has(d) {
				kept++ // the last, still open
			}
		}
		if kept <= 1 {
			break
		}
		time.Sleep(100 * time.Millisecond) // chunks are stored in the background
	}
	if kept > 1 {
		t.Logf("stats: %+v", c.Stats())
		t.Fatalf("%d files of unpinned images kept in a cache bounded to 1 byte: the test shows nothing", kept)
	}
	for _, d := range files {
		if !c.Has(d) {
			t.Fatalf("pinned file %s evicted by other images", d)
		}
	}
	m.Close()
	c.Close()

	e.reg.Close()
	m, _ = e.start()
	if ps := m.Pins(); len(ps) != 1 || ps[0].Ref != pinned || ps[0].Present != ps[0].Bytes {
		infos, err := m.cache.Pins()
		t.Logf("cache pins %+v %v", infos, err)
		for _, in := range infos {
			_, err := m.cache.RecordMeta(in.Name)
			t.Logf("meta of %s: %v", in.Name, err)
		}
		t.Fatalf("pins after a restart: %+v", ps)
	}
	l, err = m.Lookup(t.Context(), pinned, servedKey(fs[3]))
	if err != nil {
		t.Fatalf("pinned image after a restart, registry down: %v", err)
	}
	compareContent(t, readAll(t, l, 1<<20), referenceContent(t))
	if err := m.Unpin(pinned, ""); err != nil {
		t.Fatal(err)
	}
	if ps := m.Pins(); len(ps) != 0 {
		t.Fatalf("pins after unpin: %+v", ps)
	}
}

// TestPinRefusedWithoutRoom: a pin whose content would not fit on the cache's filesystem is
// refused before anything is fetched, with an error that says so.
func TestPinRefusedWithoutRoom(t *testing.T) {
	testtmpfs.Run(t, "1m", func(t *testing.T, dir string) {
		e := newEnv(t)
		big := make([]byte, 4<<20)
		for i := range big {
			big[i] = byte(i*7 + i>>9) // compresses, but the files are 4 MiB uncompressed
		}
		f, err := testlayer.BuildEStargz("big", testlayer.Build([]testlayer.Entry{bigFile("big.bin", big)}))
		if err != nil {
			t.Fatal(err)
		}
		ref := e.push("app/big:v1", fixtureLayer(f))
		c, err := cache.New(dir, cache.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		m, err := newTestManager(ClientRegistry(testClient(t, e.reg)), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		_, err = m.Pin(t.Context(), ref, "")
		if !errors.Is(err, cache.ErrNoSpace) {
			t.Fatalf("pin of 4 MiB on a 1 MiB filesystem: %v, want cache.ErrNoSpace", err)
		}
		t.Log(err)
		if ps := m.Pins(); len(ps) != 0 {
			t.Errorf("a refused pin was kept: %+v", ps)
		}
	})
}

func bigFile(name string, data []byte) testlayer.Entry {
	return testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}, Data: data}
}

// TestPinResumedAfterRestart: a pin whose fetch did not finish before the daemon stopped is
// listed by status at once after the next start and completed in the background, with no
// lookup and the background fetch of lookups off; with the registry failing at the start, the
// failure is in status and the pin completed once the registry answers again; a pin whose layer
// record is gone says so.
func TestPinResumedAfterRestart(t *testing.T) {
	f := mustFixtures(t)[3]
	defer func(min, max time.Duration) { pinRetryMin, pinRetryMax = min, max }(pinRetryMin, pinRetryMax)
	pinRetryMin, pinRetryMax = 10*time.Millisecond, 100*time.Millisecond
	for _, c := range []string{"resumed", "registryDown", "recordGone"} {
		recordGone, registryDown := c == "recordGone", c == "registryDown"
		t.Run(c, func(t *testing.T) {
			e := newRestartEnv(t)
			ref := e.push("app/pinned:v1", fixtureLayer(f))
			m, stop := e.start(withPrefetch(false))
			if _, err := m.Lookup(t.Context(), ref, servedKey(f)); err != nil {
				t.Fatal(err)
			}
			e.reg.Fail(f.Desc.Digest, 500) // the fetch of the pinned content fails
			p, err := m.Pin(t.Context(), ref, "")
			if err == nil || p.Bytes == 0 || p.Present >= p.Bytes {
				t.Fatalf("pin with the blob failing: %+v, %v; want an incomplete pin and an error", p, err)
			}
			if recordGone {
				if err := m.cache.RemoveRecord(recordName(identityOf(t, m))); err != nil {
					t.Fatal(err)
				}
			}
			stop()
			if !registryDown {
				e.reg.Fail(f.Desc.Digest, 0)
			}

			m, _ = e.start(withPrefetch(false))
			if ps := m.Status().Pins; len(ps) != 1 || ps[0].Ref != ref {
				t.Fatalf("pins in status right after the start: %+v", ps)
			}
			if registryDown {
				for deadline := time.Now().Add(30 * time.Second); m.Pins()[0].Error == ""; time.Sleep(20 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("no error in the status of a pin whose fetch fails: %+v", m.Pins()[0])
					}
				}
				t.Logf("status with the registry failing: %s", m.Pins()[0].Error)
				e.reg.Fail(f.Desc.Digest, 0)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				ps := m.Pins()
				if recordGone {
					if ps[0].Error != "" {
						t.Logf("status: %s", ps[0].Error)
						if !strings.Contains(ps[0].Error, "record") {
							t.Errorf("status of a pin without its record: %q", ps[0].Error)
						}
						return
					}
				} else if ps[0].Present == ps[0].Bytes {
					if ps[0].Error != "" {
						t.Errorf("complete pin with an error: %q", ps[0].Error)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("pin not resumed 30 s after the start: %+v", ps[0])
				}
				time.Sleep(20 * time.Millisecond)
			}
			e.reg.Close() // everything pinned is local now
			l, err := m.Lookup(t.Context(), ref, servedKey(f))
			if err != nil {
				t.Fatal(err)
			}
			compareContent(t, readAll(t, l, 1<<20), referenceContent(t))
		})
	}
}

// identityOf returns the identity of m's only live layer.
func identityOf(t *testing.T, m *Manager) identity {
	t.Helper()
	live := m.live.all()
	if len(live) != 1 {
		t.Fatalf("%d live layers, want 1", len(live))
	}
	return live[0].id
}
