package layer

import (
	"fmt"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// TestResolveAhead checks that a lookup resolved through the registry resolves the other
// lazily servable layers of its manifest in the background, by the same kind of key, so that
// the runtime's next lookups ask the registry nothing; that their background fetch waits for
// their own lookup; and that a layer not served lazily is left alone.
func TestResolveAhead(t *testing.T) {
	e := newEnv(t)
	var layers []testregistry.LayerBlob
	var keys, blobs []digest.Digest
	for _, f := range e.fixtures {
		if k := tocKey(f.Desc.Annotations); k != "" && len(keys) < 3 {
			layers = append(layers, fixtureLayer(f))
			keys, blobs = append(keys, k), append(blobs, f.Desc.Digest)
		}
	}
	requests := func() (n int) {
		for _, d := range blobs {
			st := e.reg.Stats(d)
			n += st.Full + st.Ranged
		}
		return n
	}
	if len(keys) < 3 {
		t.Fatalf("%d fixtures looked up by TOC digest, want 3", len(keys))
	}
	plain := gzipLayer(t)
	layers = append(layers, plain)
	ref := e.push("ahead/img:v1", layers...)
	m := e.manager(withPrefetchQuiet(time.Hour)) // background fetch on, its requests held back

	if _, err := m.Lookup(t.Context(), ref, keys[0]); err != nil {
		t.Fatal(err)
	}
	// The others are resolved ahead, without a lookup.
	deadline := time.Now().Add(10 * time.Second)
	for _, k := range keys[1:] {
		for {
			if l, err, ok := m.peek(layerKey{ref, k}); ok {
				if err != nil {
					t.Fatalf("%s resolved ahead: %v", k, err)
				}
				if st := l.Status().State; st != protocol.StateIdle {
					t.Errorf("%s resolved ahead: background fetch %s before its lookup", k, st)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not resolved ahead", k)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if _, _, ok := m.peek(layerKey{ref, digest.FromBytes(plain.Blob)}); ok {
		t.Errorf("the gzip layer was looked up ahead")
	}
	before := requests()
	for _, k := range keys[1:] {
		l, err := m.Lookup(t.Context(), ref, k)
		if err != nil {
			t.Fatal(err)
		}
		if st := l.Status().State; st != protocol.StateFetching {
			t.Errorf("%s after its lookup: background fetch %s, want %s", k, st, protocol.StateFetching)
		}
	}
	if after := requests(); after != before {
		t.Errorf("the lookups of layers resolved ahead asked the registry: %d requests", after-before)
	}
}

// peek returns the resolution of k, as remembered, without making it last longer.
func (m *Manager) peek(k layerKey) (*Served, error, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resolved[k]
	if r == nil {
		return nil, nil, false
	}
	return r.layer, r.err, true
}

// TestResolveAheadBounded plays a hostile manifest of many layers: a lookup resolves at most
// maxAhead of the others ahead, aheadConcurrency at a time; when the registry stalls on them,
// no more are started once a resolution's bound has passed (they do not pile up on the
// manager's resolution slots), and their failures are not remembered: the runtime's own
// lookup of one of them asks the registry again.
func TestResolveAheadBounded(t *testing.T) {
	const extra = maxAhead + 8
	var fxs []testlayer.Fixture
	var layers []testregistry.LayerBlob
	for i := range extra + 1 {
		f := profLayer(t, fmt.Sprintf("l%02d", i), uint64(i+1), "usr/bin/f")
		fxs, layers = append(fxs, f), append(layers, fixtureLayer(f))
	}
	requested := func(e *testEnv) (n int) {
		for _, f := range fxs[1:] {
			if st := e.reg.Stats(f.Desc.Digest); st.Full+st.Ranged > 0 {
				n++
			}
		}
		return n
	}

	t.Run("count", func(t *testing.T) {
		e := newEnv(t)
		ref := e.push("ahead/many:v1", layers...)
		m := e.manager(withPrefetch(false))
		lookupOK(t, m, ref, profKey(fxs[0]))
		resolved := func() (n int) {
			for _, f := range fxs[1:] {
				if _, _, ok := m.peek(layerKey{ref, profKey(f)}); ok {
					n++
				}
			}
			return n
		}
		deadline := time.Now().Add(20 * time.Second)
		for resolved() < maxAhead && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // time for one too many to show
		if n := resolved(); n != maxAhead {
			t.Errorf("%d layers resolved ahead, want %d", n, maxAhead)
		}
		if n := requested(e); n != maxAhead {
			t.Errorf("the registry was asked for %d layers' blobs, want %d", n, maxAhead)
		}
	})

	t.Run("stalled", func(t *testing.T) {
		e := newEnv(t)
		ref := e.push("ahead/stall:v1", layers...)
		for _, f := range fxs[1:] {
			e.reg.Hang(f.Desc.Digest, true)
		}
		const bound = 300 * time.Millisecond
		m := e.manager(withPrefetch(false), withResolveTimeout(bound), withNegativeTTL(time.Hour))
		start := time.Now()
		lookupOK(t, m, ref, profKey(fxs[0]))
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("the lookup took %v: it waited for the layers resolved ahead", d)
		}
		// In flight: aheadConcurrency at a time, each for at most bound; none started once
		// bound has passed. Without the stop, every layer is asked for once the first bound
		// passes.
		time.Sleep(4 * bound)
		if n, most := requested(e), 2*aheadConcurrency; n < aheadConcurrency || n > most {
			t.Errorf("%d stalled layers asked for, want %d to %d", n, aheadConcurrency, most)
		}
		for _, f := range fxs[1:] {
			e.reg.Hang(f.Desc.Digest, false)
		}
		// The runtime's own lookup of a layer whose resolution ahead failed asks again.
		if _, err := m.Lookup(t.Context(), ref, profKey(fxs[1])); err != nil {
			t.Errorf("lookup of a layer whose resolution ahead stalled: %v", err)
		}
	})
}
