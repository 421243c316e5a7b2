package layer

import (
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
)

// TestFetchTakesStoredChunk covers the window between a reader finding a chunk missing in
// the cache and claiming it: the fetch that was in flight may store the chunk and forget its
// call meanwhile. The claim must then take the chunk from the cache, not fetch it again.
func TestFetchTakesStoredChunk(t *testing.T) {
	e := newEnv(t)
	for _, f := range e.fixtures {
		key := servedKey(f)
		if key == "" {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			ref := e.push("stored/"+f.Name+":v1", fixtureLayer(f))
			m := e.manager(WithPrefetch(false))
			l, err := m.lookup(t.Context(), ref, key)
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
			waitStored(t, l)
			h, err := m.files.acquire(e0.Digest, e0.Size)
			if err != nil {
				t.Fatal(err)
			}
			defer m.files.release(h)

			// As a reader that looked in the cache just before the chunk was stored.
			before := e.reg.Stats(f.Desc.Digest)
			got, err := l.fetch(t.Context(), id, []int{0}, h, true)
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
				t.Errorf("%d calls left in flight", n)
			}
		})
	}
}

// largestFile returns the regular file with the most content.
func largestFile(x *chunked.Index) (chunked.EntryID, bool) {
	var best chunked.EntryID
	found := false
	for id := range chunked.EntryID(x.Len()) {
		e := x.Entry(id)
		if e.Type != chunked.TypeReg || e.Inode != id || e.Digest.IsZero() || e.Size == 0 {
			continue
		}
		if !found || e.Size > x.Entry(best).Size {
			best, found = id, true
		}
	}
	return best, found
}

// waitStored waits until the chunks fetched for reads are written to the cache.
func waitStored(t *testing.T, l *Layer) {
	t.Helper()
	for range 1000 {
		l.mu.Lock()
		n := len(l.inflight)
		l.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("chunks still in flight after a second")
}
