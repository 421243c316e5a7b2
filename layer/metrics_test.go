package layer

import (
	"testing"

	"github.com/opencontainers/go-digest"
)

// lookupCount returns how many lookups the histogram of outcome and source counted.
func lookupCount(t *testing.T, m *Manager, outcome, source string) uint64 {
	t.Helper()
	for _, h := range m.Status().Latency.Lookups {
		if h.Outcome == outcome && h.Source == source {
			return h.Count
		}
	}
	t.Fatalf("no lookup histogram for %s/%s", outcome, source)
	return 0
}

// TestLatencyHistograms: each lookup is counted by its outcome and what answered it (the
// registry, memory, a record after a restart), the histograms adding up to the lookups; a
// read that fetches counts its wait, a read from the cache does not.
func TestLatencyHistograms(t *testing.T) {
	f := mustFixtures(t)[3]
	e := newRestartEnv(t)
	ref := e.push("latency/app:v1", fixtureLayer(f))
	m, stop := e.start(withPrefetch(false))
	if n := len(m.Status().Latency.Lookups); n != int(numOutcomes)*int(numSources) {
		t.Fatalf("%d lookup histograms, want every outcome and source", n)
	}
	l, err := m.Lookup(t.Context(), ref, servedKey(f))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lookup(t.Context(), ref, servedKey(f)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lookup(t.Context(), ref, digest.FromString("no such layer")); err == nil {
		t.Fatal("a key naming no layer resolved")
	}
	for _, c := range []struct {
		outcome, source string
		want            uint64
	}{{"served", "registry", 1}, {"served", "memory", 1}, {"not_lazy", "registry", 1}, {"served", "record", 0}, {"failed", "registry", 0}} {
		if n := lookupCount(t, m, c.outcome, c.source); n != c.want {
			t.Errorf("lookups %s from %s: %d, want %d", c.outcome, c.source, n, c.want)
		}
	}
	var sum uint64
	st := m.Status()
	for _, h := range st.Latency.Lookups {
		sum += h.Count
		if h.Count > 0 && (h.Sum <= 0 || h.Cumulative[len(h.Cumulative)-1] > h.Count) {
			t.Errorf("%s/%s: %+v", h.Outcome, h.Source, h.Snapshot)
		}
	}
	if sum != uint64(st.Counters.Lookups) {
		t.Errorf("lookup histograms count %d, lookups %d", sum, st.Counters.Lookups)
	}

	id, ok := l.Index().LookupPath("usr/bin/tool")
	if !ok {
		t.Fatal("no usr/bin/tool")
	}
	id = l.Index().Entry(id).Inode
	if n := m.Status().Latency.ReadWait.Count; n != 0 {
		t.Errorf("read waits %d before any read", n)
	}
	readOne(t, l, id)
	if n := m.Status().Latency.ReadWait.Count; n != 1 {
		t.Errorf("read waits %d after a cold read, want 1", n)
	}
	m.life.wait() // the chunks are stored
	readOne(t, l, id)
	if n := m.Status().Latency.ReadWait.Count; n != 1 {
		t.Errorf("read waits %d after a read from the cache, want 1", n)
	}

	stop()
	m, _ = e.start(withPrefetch(false))
	if _, err := m.Lookup(t.Context(), ref, servedKey(f)); err != nil {
		t.Fatal(err)
	}
	if n := lookupCount(t, m, "served", "record"); n != 1 {
		t.Errorf("lookups served from a record after the restart: %d, want 1", n)
	}
}
