package layer

import (
	"testing"
	"time"
)

// TestBackgroundWaitsForReadsStore: a chunk an on-demand read fetched is stored after the read
// returns (its fetch is done, not yet settled); a background batch that shares that fetch
// returns only once the chunk is stored, since the layer counts as fully local only when the
// cache holds every file (unstored), and a batch that returned earlier could find the file
// missing and fail the background fetch.
func TestBackgroundWaitsForReadsStore(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	ref := e.push("settle/"+f.Name+":v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false), withPrefetchQuiet(0))
	l, err := m.Lookup(t.Context(), ref, servedKey(f))
	if err != nil {
		t.Fatal(err)
	}
	k := chunkKey{firstFile(t, l), 0}
	// The read's fetch: done, its bytes handed out, its store still running.
	read := &fetch{key: k, chunk: l.ref(k), done: make(chan struct{}), settled: make(chan struct{})}
	close(read.done)
	l.mu.Lock()
	l.inflight[k] = read
	l.mu.Unlock()

	returned := make(chan error, 1)
	go func() { returned <- l.prefetchBatch(t.Context(), prefetchBatch{keys: []chunkKey{k}}) }()
	select {
	case err := <-returned:
		t.Fatalf("the batch returned (%v) before the read's chunk was stored", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(read.settled)
	if err := <-returned; err != nil {
		t.Fatal(err)
	}
}
