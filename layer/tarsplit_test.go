package layer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
	"github.com/opencontainers/go-digest"
)

func syntheticLayer(t *testing.T, n int, editTOC func([]byte) []byte) testlayer.Fixture {
	t.Helper()
	f, err := testlayer.SyntheticZstdChunked(n, editTOC)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// firstFile returns the first regular file with content of l.
func firstFile(t *testing.T, l *Served) chunked.EntryID {
	t.Helper()
	for id := range chunked.EntryID(l.idx.Len()) {
		if e := l.idx.Entry(id); e.Type == chunked.TypeReg && e.Size > 0 {
			return id
		}
	}
	t.Fatal("no regular file")
	return 0
}

// hold takes every processor background verification may use until the function it returns
// (also called at the end of the test, before the manager closes) gives them back.
func hold(t *testing.T, m *Manager) func() {
	for range cap(m.sched.cpu) {
		m.sched.cpu <- struct{}{}
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			for range cap(m.sched.cpu) {
				<-m.sched.cpu
			}
		})
	}
	t.Cleanup(release)
	return release
}

// TestTarSplitBeforeAnswer: the comparison of a zstd:chunked TOC with its tar-split is off the
// path of a modern lookup, but a lookup by blob digest (whose info needs the tar's size) and
// any lookup under the DiffID policy wait for it.
func TestTarSplitBeforeAnswer(t *testing.T) {
	e := newEnv(t)
	f := syntheticLayer(t, 2000, nil)
	ref := e.push("synthetic:v1", fixtureLayer(f))
	tarSize := func(l *Served) int64 {
		var in struct {
			DiffSize int64 `json:"diff-size"`
		}
		if err := json.Unmarshal(l.Info(f.Desc.Digest), &in); err != nil {
			t.Fatal(err)
		}
		return in.DiffSize
	}
	for _, tc := range []struct {
		name string
		opts []option
		keys []string // the lookups, in order
	}{
		{"by blob digest", nil, []string{"blob"}},
		{"by blob digest after a modern lookup", nil, []string{"toc", "blob"}},
		{"require-diffid", []option{withRequireDiffID(true)}, []string{"toc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A cache of its own: a record of the layer, written with the tar's size once
			// compared, would answer the next case's lookups.
			c, err := cache.New(t.TempDir(), cache.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			m, err := newTestManager(ClientRegistry(testClient(t, e.reg)), c, append(tc.opts, withPrefetch(false))...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			release := hold(t, m) // the background comparison waits for a processor: none
			var l *Served
			for _, k := range tc.keys {
				key := f.Desc.Digest
				if k == "toc" {
					key = tocKey(f.Desc.Annotations)
				}
				var err error
				if l, err = m.Lookup(t.Context(), ref, key); err != nil {
					t.Fatalf("lookup by %s: %v", k, err)
				}
				if k == "toc" && len(tc.opts) == 0 && l.v.TarSize() != -1 {
					t.Fatal("a modern lookup waited for the tar-split comparison")
				}
			}
			if got := l.v.TarSize(); got <= 0 || tarSize(l) != got {
				t.Fatalf("the lookup answered before the comparison: TarSize %d, info diff-size %d", got, tarSize(l))
			}
			release()
		})
	}
}

// TestTarSplitDisagreementRefused: a zstd:chunked layer whose TOC is correctly anchored but
// contradicts its tar-split is served to a modern lookup until the background comparison
// finds out; from then on it is refused: lookups and reads fail with the verification error,
// status says so, and it counts as one verification failure. A lookup by blob digest, which
// waits for the comparison, is refused at once.
func TestTarSplitDisagreementRefused(t *testing.T) {
	e := newEnv(t)
	f := syntheticLayer(t, 500, func(js []byte) []byte {
		return bytes.Replace(js, []byte(`"mode":420`), []byte(`"mode":3565`), 1) // setuid, setgid
	})
	ref := e.push("lying:v1", fixtureLayer(f))
	toc := tocKey(f.Desc.Annotations)

	m := e.manager(withPrefetch(false))
	release := hold(t, m) // the background comparison waits until the layer has been read
	l, err := m.Lookup(t.Context(), ref, toc)
	if err != nil {
		t.Fatalf("modern lookup: %v (the comparison is deferred)", err)
	}
	file := firstFile(t, l)
	p := make([]byte, 16)
	if _, err := l.ReadFile(t.Context(), file, p, 0); err != nil {
		t.Fatalf("read before the comparison: %v", err)
	}
	release()
	deadline := time.Now().Add(30 * time.Second)
	for l.v.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the background comparison did not fail the layer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := m.Lookup(t.Context(), ref, toc); !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("lookup after the failure = %v, want the verification error", err)
	}
	if _, err := l.ReadFile(t.Context(), file, p, 0); !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("read (from the cache) after the failure = %v, want the verification error", err)
	}
	if _, err := l.ReadFile(t.Context(), file+1, p, 0); !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("read after the failure = %v, want the verification error", err)
	}
	if b := l.Backing(file); b != nil {
		b.Close()
		t.Error("a refused layer still hands out its cache file")
	}
	st := m.Status()
	if len(st.Layers) != 1 || st.Layers[0].Guarantee != "none" || !strings.Contains(st.Layers[0].Error, "tar-split disagree") {
		t.Errorf("status %+v, want the layer refused", st.Layers)
	}
	if st.Counters.VerifyFailures != 1 {
		t.Errorf("verify failures %d, want 1", st.Counters.VerifyFailures)
	}

	// By blob digest, through a manager that never saw it: refused before the lookup answers.
	m2 := e.manager(withPrefetch(false))
	if _, err := m2.Lookup(t.Context(), ref, f.Desc.Digest); !errors.Is(err, chunked.ErrInvalid) {
		t.Fatalf("lookup by blob digest = %v, want the verification error", err)
	}
	if n := m2.Status().Counters.VerifyFailures; n != 1 {
		t.Errorf("verify failures %d, want 1", n)
	}
}

// The tar-split lives in the layer's record and is used from there: the records' index
// keeps no copy of it with a layer's meta (on the heap, or into a mapping that a closed
// record releases), neither after the resolution nor after the record is written again.
func TestRecordsKeepNoTarSplit(t *testing.T) {
	e := newEnv(t)
	f := syntheticLayer(t, 2000, nil)
	ref := e.push("synthetic:v1", fixtureLayer(f))
	c, err := cache.New(t.TempDir(), cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	m, err := newTestManager(ClientRegistry(testClient(t, e.reg)), c, withPrefetch(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	check := func(when string) {
		t.Helper()
		// The record is stored, then indexed, in the background.
		waitFor(t, when+": a record indexed", func() bool {
			m.records.mu.Lock()
			defer m.records.mu.Unlock()
			return len(m.records.byKey) > 0
		})
		m.records.mu.Lock()
		defer m.records.mu.Unlock()
		for k, list := range m.records.byKey {
			for _, s := range list {
				if s.meta.Verified.TarSplit != nil {
					t.Errorf("%s: the meta of record %s (key %s) keeps the tar-split (%d bytes)", when, s.name, k, len(s.meta.Verified.TarSplit))
				}
			}
		}
	}
	l, err := m.Lookup(t.Context(), ref, tocKey(f.Desc.Annotations))
	if err != nil {
		t.Fatal(err)
	}
	check("after the resolution")
	if err := l.checkTarSplit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := l.writeRecord(); err != nil {
		t.Fatal(err)
	}
	check("after the record is written again")
}

// lookedUpByTOC pushes a synthetic zstd:chunked layer of 2,000 entries and looks it up by TOC
// digest, at start, through a manager without background fetch whose quiet period never
// ends: the comparison of its TOC with its tar-split is left to the background, which runs it
// tarSplitDelay after the lookup.
func lookedUpByTOC(t *testing.T) (m *Manager, l *Served, f testlayer.Fixture, ref string, start time.Time) {
	t.Helper()
	e := newEnv(t)
	f = syntheticLayer(t, 2000, nil)
	ref = e.push("synthetic:v1", fixtureLayer(f))
	m = e.manager(withPrefetch(false), withPrefetchQuiet(time.Hour))
	start = time.Now()
	l, err := m.Lookup(t.Context(), ref, tocKey(f.Desc.Annotations))
	if err != nil {
		t.Fatal(err)
	}
	return m, l, f, ref, start
}

// TestTarSplitComparedWhenQuiet: after a modern lookup, the TOC is compared with the
// tar-split as background work: not while the layers are busy (the quiet period after the
// lookup), yet no later than tarSplitDelay after it (the time a layer the tar-split
// contradicts is served), and on the background threads, below the runtimes' priority.
func TestTarSplitComparedWhenQuiet(t *testing.T) {
	idle := backgroundThreads()
	before := idle.ran.Load()
	_, l, _, _, start := lookedUpByTOC(t)
	time.Sleep(200 * time.Millisecond) // far more than the comparison of 2,000 entries takes
	if l.v.TarSize() != -1 {
		t.Fatal("compared within the quiet period after the lookup")
	}
	for deadline := time.Now().Add(time.Minute); l.v.TarSize() <= 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not compared a minute after the lookup")
		}
	}
	if d := time.Since(start); d < tarSplitDelay {
		t.Errorf("compared %v after the lookup, within the quiet period", d)
	}
	if n := idle.ran.Load() - before; n != 1 {
		t.Errorf("%d functions ran on the background threads, want the comparison", n)
	}
}

// TestBlobDigestLookupComparesAtItsPriority: a lookup by blob digest of a layer whose
// comparison a modern lookup left to the background compares at once, on its own goroutine,
// and the background comparison steps aside for good: it never runs on the background
// threads, where the lookup would have waited for a niced comparison.
func TestBlobDigestLookupComparesAtItsPriority(t *testing.T) {
	idle := backgroundThreads()
	before := idle.ran.Load()
	m, l, f, ref, start := lookedUpByTOC(t)
	if l.v.TarSize() != -1 {
		t.Fatal("compared before the modern lookup returned")
	}
	old, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if old != l {
		t.Fatal("the lookup by blob digest resolved another layer")
	}
	if l.v.TarSize() <= 0 {
		t.Fatal("the lookup by blob digest answered before the comparison")
	}
	// Past the longest the background comparison waits (tarSplitDelay), it would have run.
	for time.Since(start) < tarSplitDelay+time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	if n := idle.ran.Load() - before; n != 0 {
		t.Errorf("%d functions ran on the background threads, want none: the comparison was the lookup's", n)
	}
}

// TestComparedWhenTheLookupGivesUp: a lookup by blob digest that takes the comparison over
// from the background and then gives up (its context ends) leaves the comparison to the
// background again: the layer a modern lookup serves is still compared, as soon as the
// background comparison would have run.
func TestComparedWhenTheLookupGivesUp(t *testing.T) {
	m, l, _, ref, _ := lookedUpByTOC(t)
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	if err := m.ready(gone, l, false, ref); err == nil && l.v.TarSize() < 0 {
		t.Fatal("a lookup by blob digest answered without the comparison")
	}
	for deadline := time.Now().Add(time.Minute); l.v.TarSize() <= 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not compared a minute after the lookup that took the comparison over gave up")
		}
	}
}

// A zstd:chunked layer whose tar-split is not the one its TOC names (a registry serving other
// bytes there): a lookup by TOC digest does not read the tar-split, so it answers, and the
// background comparison, which reads it, refuses the layer; a lookup by blob digest reads it
// with the TOC and fails.
func TestTarSplitTamperedRefused(t *testing.T) {
	e := newEnv(t)
	f := syntheticLayer(t, 500, nil)
	lay, err := chunked.Classify(f.Desc)
	if err != nil {
		t.Fatal(err)
	}
	f.Blob = bytes.Clone(f.Blob)
	f.Blob[lay.TarSplit.Offset+lay.TarSplit.Length/2] ^= 0x40
	ref := e.push("tampered:v1", fixtureLayer(f))
	toc := tocKey(f.Desc.Annotations)

	m := e.manager(withPrefetch(false))
	l, err := m.Lookup(t.Context(), ref, toc)
	if err != nil {
		t.Fatalf("modern lookup: %v (the tar-split is read by the comparison)", err)
	}
	waitFor(t, "the background comparison to refuse the layer", func() bool { return l.v.Err() != nil })
	if !errors.Is(l.v.Err(), verify.ErrDigestMismatch) {
		t.Errorf("refused with %v, want a tar-split digest mismatch", l.v.Err())
	}
	if _, err := m.Lookup(t.Context(), ref, toc); !errors.Is(err, verify.ErrDigestMismatch) {
		t.Errorf("lookup after the refusal = %v, want the digest mismatch", err)
	}
	if st := m.Status(); len(st.Layers) != 1 || st.Layers[0].Guarantee != "none" || st.Counters.VerifyFailures != 1 {
		t.Errorf("status %+v, counters %+v: want the layer refused, one verification failure", st.Layers, st.Counters)
	}

	m2 := e.manager(withPrefetch(false))
	if _, err := m2.Lookup(t.Context(), ref, digest.FromBytes(f.Blob)); !errors.Is(err, verify.ErrDigestMismatch) {
		t.Fatalf("lookup by blob digest = %v, want the digest mismatch", err)
	}
}

// TestTarSplitReleasedAfterComparison: the tar-split the background comparison read leaves
// the heap once the record holds it (a layer whose content is fetched slowly, or never whole,
// would otherwise keep it for its life: up to the TOC limit per layer, sized by the image),
// and the record keeps it for a restart.
func TestTarSplitReleasedAfterComparison(t *testing.T) {
	m, l, f, ref, _ := lookedUpByTOC(t)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		rec, ok := m.records.find(tocKey(f.Desc.Annotations), repository(ref))
		if l.v.TarSize() > 0 && ok && rec.meta.TarSplitSize > 0 && l.v.Save().TarSplit == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the lookup: tar size %d, record %v, tar-split held %d bytes",
				l.v.TarSize(), ok, len(l.v.Save().TarSplit))
		}
	}
	if g := l.v.Guarantee(); g >= verify.DiffIDVerified {
		t.Fatalf("guarantee %v: the tar-split would be dropped anyway", g)
	}
}
