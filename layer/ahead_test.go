package layer

import (
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// TestResolveAhead checks that a lookup resolved through the registry resolves the other
// lazily servable layers of its manifest in the background, by the same kind of key, so that
// the runtime's next lookups ask the registry nothing; that their background fetch waits for
// their own lookup; and that a layer not served lazily is left alone.
func TestResolveAhead(t *testing.T) {
	e := newEnv(t)
	var layers []testregistry.Blob
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
	m := e.manager(WithPrefetchQuiet(time.Hour)) // background fetch on, its requests held back

	if _, err := m.lookup(t.Context(), ref, keys[0]); err != nil {
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
				if st := l.Status().State; st != StateIdle {
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
		l, err := m.lookup(t.Context(), ref, k)
		if err != nil {
			t.Fatal(err)
		}
		if st := l.Status().State; st != StateFetching {
			t.Errorf("%s after its lookup: background fetch %s, want %s", k, st, StateFetching)
		}
	}
	if after := requests(); after != before {
		t.Errorf("the lookups of layers resolved ahead asked the registry: %d requests", after-before)
	}
}

// peek returns the resolution of k, as remembered, without making it last longer.
func (m *Manager) peek(k layerKey) (*Layer, error, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resolved[k]
	if r == nil {
		return nil, nil, false
	}
	return r.layer, r.err, true
}
