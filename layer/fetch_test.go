package layer

import (
	"iter"
	"sync/atomic"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
)

// TestFetchTakesStoredChunk covers the window between a reader finding a chunk missing in
// the cache and claiming it: the fetch that was in flight may store the chunk and forget its
// fetch meanwhile. The claim must then take the chunk from the cache, not fetch it again.
func TestFetchTakesStoredChunk(t *testing.T) {
	e := newEnv(t)
	for _, f := range e.fixtures {
		key := servedKey(f)
		if key == "" {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			ref := e.push("stored/"+f.Name+":v1", fixtureLayer(f))
			m := e.manager(withPrefetch(false))
			l, err := m.Lookup(t.Context(), ref, key)
			if err != nil {
				t.Fatal(err)
			}
			id, ok := largestFile(l.Index())
			if !ok {
				t.Skip("no regular file with content")
			}
			e0 := l.Index().Entry(id)
			want := make([]byte, e0.Size)
			if _, err := l.ReadFile(t.Context(), id, want, 0); err != nil {
				t.Fatal(err)
			}
			m.life.wait() // the read's chunks are stored
			h, err := m.files.acquire(e0.Digest, e0.Size)
			if err != nil {
				t.Fatal(err)
			}
			defer m.files.release(h)

			// As a reader that looked in the cache just before the chunk was stored.
			before := e.reg.Stats(f.Desc.Digest)
			got, err := l.fetchMissing(t.Context(), id, []int{0}, h, -1, onDemand)
			if err != nil {
				t.Fatal(err)
			}
			if after := e.reg.Stats(f.Desc.Digest); after != before {
				t.Errorf("a stored chunk was fetched again: %+v -> %+v", before, after)
			}
			c := l.Index().Chunks(id)[0]
			if string(got[0]) != string(want[c.FileOffset:c.FileOffset+c.Size]) {
				t.Error("the chunk taken from the cache differs from the file's content")
			}
			l.mu.Lock()
			n := len(l.inflight)
			l.mu.Unlock()
			if n != 0 {
				t.Errorf("%d fetches left in flight", n)
			}
		})
	}
}

// largestFile returns the regular file with the most content.
func largestFile(x *chunked.Index) (chunked.EntryID, bool) {
	var best chunked.EntryID
	found := false
	for id := range regularFiles(x) {
		if !found || x.Entry(id).Size > x.Entry(best).Size {
			best, found = id, true
		}
	}
	return best, found
}

// TestFetchAhead: a file read in sequence (the chunk before the one read is in the cache) has
// its next chunk fetched meanwhile, so that reading it asks the registry nothing; a read out of
// sequence fetches nothing ahead.
func TestFetchAhead(t *testing.T) {
	for _, f := range newEnv(t).fixtures {
		key := servedKey(f)
		if key == "" {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t) // an empty cache
			ref := e.push("ahead/"+f.Name+":v1", fixtureLayer(f))
			m := e.manager(withPrefetch(false), withReadAhead(0))
			l, err := m.Lookup(t.Context(), ref, key)
			if err != nil {
				t.Fatal(err)
			}
			id, ok := fileOfChunks(l.Index(), 4)
			if !ok {
				t.Skip("no file of four chunks with content")
			}
			cs := l.Index().Chunks(id)
			read := func(i int) {
				t.Helper()
				if _, err := l.ReadFile(t.Context(), id, make([]byte, cs[i].Size), cs[i].FileOffset); err != nil {
					t.Fatal(err)
				}
				m.life.wait() // the fetch ahead, if any, and every store
			}
			requests := func() int { st := e.reg.Stats(f.Desc.Digest); return st.Ranged + st.Full }

			// Out of sequence: chunk 3 first (2 is not here): only its own request.
			before := requests()
			read(3)
			if n := requests() - before; n != 1 {
				t.Errorf("a read out of sequence made %d requests, want 1", n)
			}
			// In sequence: 0, then 1 (0 is here) fetches 2 ahead.
			read(0)
			read(1)
			before = requests()
			read(2)
			if n := requests() - before; n != 0 {
				t.Errorf("chunk 2, after 0 and 1 were read: %d requests, want none", n)
			}

			// With a read-ahead window: a read in sequence that misses its own chunk takes the
			// next one in its read-ahead, in its one request, not in a second one ahead. Chunk
			// 0 is in the cache (read by a manager without read-ahead), 1 and 2 are not.
			e2 := newEnv(t)
			ref2 := e2.push("ahead2/"+f.Name+":v1", fixtureLayer(f))
			first, err := e2.manager(withPrefetch(false), withReadAhead(0)).Lookup(t.Context(), ref2, key)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := first.ReadFile(t.Context(), id, make([]byte, cs[0].Size), 0); err != nil {
				t.Fatal(err)
			}
			m2 := e2.manager(withPrefetch(false), withReadAhead(1<<20))
			first.env.life.wait()
			l2, err := m2.Lookup(t.Context(), ref2, key)
			if err != nil {
				t.Fatal(err)
			}
			before = e2.reg.Stats(f.Desc.Digest).Ranged
			if _, err := l2.ReadFile(t.Context(), id, make([]byte, cs[1].Size), cs[1].FileOffset); err != nil {
				t.Fatal(err)
			}
			m2.life.wait()
			if n := e2.reg.Stats(f.Desc.Digest).Ranged - before; n != 1 {
				t.Errorf("a read in sequence missing its chunk made %d requests, want 1 (its read-ahead holds the next chunk)", n)
			}
		})
	}
}

// fileOfChunks returns a regular file with at least n chunks, each with bytes in the blob.
func fileOfChunks(x *chunked.Index, n int) (chunked.EntryID, bool) {
	for id := range regularFiles(x) {
		cs := x.Chunks(id)
		if len(cs) < n {
			continue
		}
		ok := true
		for _, c := range cs[:n] {
			ok = ok && c.Length > 0
		}
		if ok {
			return id, true
		}
	}
	return 0, false
}

// regularFiles yields the regular files of x that have content in the cache's sense: their
// own inode, a size and a digest.
func regularFiles(x *chunked.Index) iter.Seq[chunked.EntryID] {
	return func(yield func(chunked.EntryID) bool) {
		for id := range chunked.EntryID(x.Len()) {
			e := x.Entry(id)
			if e.Type == chunked.TypeReg && e.Inode == id && e.Size > 0 && !e.Digest.IsZero() && !yield(id) {
				return
			}
		}
	}
}

// TestParallelBounded: parallel calls fn once for each index, on at most workers goroutines
// at once.
func TestParallelBounded(t *testing.T) {
	for _, c := range []struct{ workers, n int }{{2, 9}, {1, 5}, {8, 3}, {4, 0}} {
		var running, most atomic.Int32
		seen := make([]atomic.Int32, c.n)
		parallel(c.workers, c.n, func(i int) {
			now := running.Add(1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			time.Sleep(2 * time.Millisecond)
			seen[i].Add(1)
			running.Add(-1)
		})
		if m := int(most.Load()); m > c.workers {
			t.Errorf("workers %d: %d at once", c.workers, m)
		}
		for i := range seen {
			if n := seen[i].Load(); n != 1 {
				t.Errorf("workers %d: index %d called %d times", c.workers, i, n)
			}
		}
	}
}
