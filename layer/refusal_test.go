package layer

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/verify"
)

// lyingLayer pushes a zstd:chunked layer whose TOC (correctly anchored in the manifest) gives
// a file setuid and setgid bits its tar-split does not: the tree a scanner of the registry's
// blob, or podman push, sees is not the one the TOC describes. It returns the reference, the
// TOC digest and the blob digest.
func lyingLayer(t *testing.T, e *testEnv, repoTag string) (string, digest.Digest, digest.Digest) {
	t.Helper()
	f := syntheticLayer(t, 500, func(js []byte) []byte {
		return bytes.Replace(js, []byte(`"mode":420`), []byte(`"mode":3565`), 1)
	})
	return e.push(repoTag, fixtureLayer(f)), tocKey(f.Desc.Annotations), f.Desc.Digest
}

// TestTarSplitComparedDespiteHeldRead: the comparison after a lookup by TOC digest starts at
// the latest tarSplitDelay after the lookup, even while a read a runtime waits for is held
// open (the attacker's registry never answers a range request, and their container keeps one
// cold read pending): background verification steps aside for demand fetches, and waiting for
// them without bound would serve the contradicted tree for as long as the attacker likes.
func TestTarSplitComparedDespiteHeldRead(t *testing.T) {
	e := newEnv(t)
	ref, toc, blob := lyingLayer(t, e, "held:v1")
	m := e.manager(withPrefetch(false), withReadTimeout(time.Minute))
	start := time.Now()
	l, err := m.Lookup(t.Context(), ref, toc)
	if err != nil {
		t.Fatalf("modern lookup: %v", err)
	}
	// The registry answered the tar-split's read (the comparison's own bound on it is
	// TestTarSplitWithheldRefused's), then holds every read.
	if err := l.v.ReadTarSplit(t.Context(), l.timedBlob(), false); err != nil {
		t.Fatal(err)
	}
	e.reg.Hang(blob, true)
	defer e.reg.Hang(blob, false)
	go func() {
		p := make([]byte, 16)
		_, _ = l.ReadFile(t.Context(), firstFile(t, l), p, 0)
	}()
	waitFor(t, "the read fetching", func() bool { return m.sched.demand.Load() > 0 })
	for time.Since(start) < tarSplitDelay+3*time.Second && l.v.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	if l.v.Err() == nil {
		t.Errorf("a layer whose tar-split contradicts its TOC still served %v after the lookup (bound: %v): a held read postponed the comparison",
			time.Since(start).Round(time.Second), tarSplitDelay)
	}
	if _, err := m.Lookup(t.Context(), ref, toc); err == nil {
		t.Error("lookup still answered")
	}
}

// TestRefusalOutlivesKeepTTL: a refused layer stays refused after the keep TTL forgot it with
// its resolution (and its record was removed): the next lookup of the same TOC digest fails at
// once instead of resolving it through the registry again and serving it until a new
// comparison, which would reopen the window at every start of the image after a pause.
func TestRefusalOutlivesKeepTTL(t *testing.T) {
	e := newEnv(t)
	ref, toc, _ := lyingLayer(t, e, "again:v1")
	clock := newTestClock()
	m := e.manager(withPrefetch(false), withClock(clock.now), withKeepTTL(time.Minute))
	l, err := m.Lookup(t.Context(), ref, toc)
	if err != nil {
		t.Fatalf("modern lookup: %v", err)
	}
	if err := l.checkTarSplit(t.Context()); !errors.Is(err, chunked.ErrInvalid) {
		t.Fatalf("comparison = %v, want the disagreement", err)
	}
	clock.advance(2 * time.Minute)
	m.expire()
	l2, err := m.Lookup(t.Context(), ref, toc)
	if err == nil {
		t.Errorf("a refused layer was served again after the keep TTL (same layer: %v)", l2 == l)
	} else if !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("lookup after the keep TTL = %v, want the verification error", err)
	}
}

// TestBlobLookupRacingModernLookupCompares: a lookup by blob digest answers a compared layer
// (its info holds the tar's size, which older runtimes record) even when a concurrent
// resolution of the same layer, here a modern lookup answered from the layer's record, made
// its layer live first and that layer is the one handed out.
func TestBlobLookupRacingModernLookupCompares(t *testing.T) {
	e := newEnv(t)
	f := syntheticLayer(t, 2000, nil)
	ref1 := e.push("race/one:v1", fixtureLayer(f))
	ref2 := e.push("race/two:v1", fixtureLayer(f))
	toc := tocKey(f.Desc.Annotations)
	m1 := e.manager(withPrefetch(false))
	if _, err := m1.Lookup(t.Context(), ref1, toc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the record stored", func() bool { _, ok := m1.records.find(toc, repository(ref1)); return ok })
	m1.Close()

	m := e.manager(withPrefetch(false), withPrefetchQuiet(time.Hour)) // a restart: the record answers ref1
	hold(t, m)                                                        // the background comparison does not run
	e.reg.Hang(f.Desc.Digest, true)
	type answer struct {
		l   *Served
		err error
	}
	old := make(chan answer, 1)
	go func() {
		l, err := m.Lookup(t.Context(), ref2, f.Desc.Digest) // through the registry: its TOC read hangs
		old <- answer{l, err}
	}()
	time.Sleep(500 * time.Millisecond) // past liveLayer, reading the TOC
	modern, err := m.Lookup(t.Context(), ref1, toc)
	if err != nil {
		t.Fatal(err)
	}
	e.reg.Hang(f.Desc.Digest, false)
	a := <-old
	if a.err != nil {
		t.Fatalf("the blob-digest lookup failed: %v", a.err)
	}
	var in struct {
		DiffSize int64 `json:"diff-size"`
	}
	if err := json.Unmarshal(a.l.Info(f.Desc.Digest), &in); err != nil {
		t.Fatal(err)
	}
	if a.l.v.TarSize() < 0 || in.DiffSize < 0 {
		t.Errorf("a lookup by blob digest answered a layer never compared (the modern lookup's: %v): TarSize %d, info diff-size %d",
			a.l == modern, a.l.v.TarSize(), in.DiffSize)
	}
}

// TestTarSplitWithheldRefused: a lookup by TOC digest does not wait for the tar-split, which
// the comparison reads; a registry that then withholds it (every read of the blob held) does
// not keep the TOC's tree served unproven: the read, bounded by the read timeout, is final,
// and the layer is refused (for the daemon's life, as any refusal).
func TestTarSplitWithheldRefused(t *testing.T) {
	e := newEnv(t)
	f := syntheticLayer(t, 500, nil) // a layer that does not lie: it must be proven
	ref := e.push("withheld:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false), withReadTimeout(time.Second))
	start := time.Now()
	l, err := m.Lookup(t.Context(), ref, tocKey(f.Desc.Annotations))
	if err != nil {
		t.Fatalf("modern lookup: %v", err)
	}
	e.reg.Hang(f.Desc.Digest, true)
	defer e.reg.Hang(f.Desc.Digest, false)
	waitFor(t, "the layer refused", func() bool { return l.v.Err() != nil })
	if !errors.Is(l.v.Err(), verify.ErrUnproven) {
		t.Errorf("refused with %v, want the tar-split unread", l.v.Err())
	}
	if d := time.Since(start); d > tarSplitDelay+5*time.Second {
		t.Errorf("refused %v after the lookup, want within the %v before the comparison and the 1 s read timeout", d.Round(time.Second), tarSplitDelay)
	}
	e.reg.Hang(f.Desc.Digest, false)
	if _, err := m.Lookup(t.Context(), ref, tocKey(f.Desc.Annotations)); !errors.Is(err, verify.ErrUnproven) {
		t.Errorf("lookup after the refusal = %v, want the refusal", err)
	}
	if n := m.Status().Counters.VerifyFailures; n != 0 {
		t.Errorf("verify failures %d, want 0: no digest failed", n)
	}
}
