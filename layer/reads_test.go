package layer

import (
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
)

// TestReadSetStatus checks that a layer's status counts exactly the chunks the reads asked for
// and their compressed bytes: not those the read-ahead fetched beside them, not twice when
// read again from the cache; and every chunk of a file opened with passthrough. It also counts
// the reads that waited for the registry: a cold read, not one the cache answers.
func TestReadSetStatus(t *testing.T) {
	for _, f := range newEnv(t).fixtures {
		toc := tocKey(f.Desc.Annotations)
		if toc == "" {
			continue // not served to modern runtimes
		}
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t)
			ref, m, l := e.lookupFixture("reads/"+f.Name, f, toc, withPrefetch(false))
			x := l.Index()
			single, multi := chunked.EntryID(0), chunked.EntryID(0)
			haveSingle, haveMulti := false, false
			for id := range regularFiles(x) {
				cs := x.Chunks(id)
				switch {
				case len(cs) == 1 && cs[0].Length > 0 && !haveSingle:
					single, haveSingle = id, true
				case len(cs) > 2 && (!haveMulti || len(cs) > x.NumChunks(multi)):
					multi, haveMulti = id, true
				}
			}
			if !haveSingle {
				t.Skip("no file of one chunk")
			}
			if st := l.Status(); st.ReadChunks != 0 || st.ReadCompressed != 0 {
				t.Fatalf("before any read: %d chunks, %d bytes", st.ReadChunks, st.ReadCompressed)
			}
			read := func(id chunked.EntryID, off, n int64) {
				t.Helper()
				if _, err := l.ReadFile(t.Context(), id, make([]byte, n), off); err != nil {
					t.Fatal(err)
				}
			}
			var wantChunks, wantBytes int64
			read(single, 0, 1)
			wantChunks, wantBytes = 1, x.Chunks(single)[0].Length
			if st := l.Status(); st.ReadWaits != 1 || st.ReadRequests != 1 || st.ReadWaitSeconds <= 0 {
				t.Errorf("after a cold read: %d reads waited (%d with a request of their own), %vs; want 1 (1), more than 0",
					st.ReadWaits, st.ReadRequests, st.ReadWaitSeconds)
			}
			if haveMulti {
				// The last byte of chunk 1 and the first of chunk 2.
				cs := x.Chunks(multi)
				read(multi, cs[2].FileOffset-1, 2)
				wantChunks += 2
				wantBytes += cs[1].Length + cs[2].Length
				read(multi, cs[1].FileOffset, 1) // again: counted once
			}
			waits := l.Status().ReadWaits // the multi-chunk file's read may have found its chunks on their way
			read(single, 0, 1)            // again, from the cache
			st := l.Status()
			if st.ReadWaits != waits || st.ReadRequests > st.ReadWaits {
				t.Errorf("a read from the cache counted as a wait: %d, then %d (%d requests)", waits, st.ReadWaits, st.ReadRequests)
			}
			if st.ReadChunks != wantChunks || st.ReadCompressed != wantBytes || st.PassthroughFiles != 0 {
				t.Errorf("status: %d chunks, %d compressed bytes, %d passthrough files; want %d, %d, 0",
					st.ReadChunks, st.ReadCompressed, st.PassthroughFiles, wantChunks, wantBytes)
			}

			// A layer opened again on the same cache, the single file complete there: an open
			// with passthrough counts its chunks.
			digest := x.Meta(single).Digest
			for deadline := time.Now().Add(10 * time.Second); !e.cache.Has(digest); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the file read is not stored in the cache")
				}
			}
			m.Close()
			l2, err := e.manager(withPrefetch(false)).Lookup(t.Context(), ref, toc)
			if err != nil {
				t.Fatal(err)
			}
			bf := l2.Backing(single)
			if bf == nil {
				t.Fatal("no backing file for a file complete in the cache")
			}
			bf.Close()
			st = l2.Status()
			if st.ReadChunks != 1 || st.ReadCompressed != x.Chunks(single)[0].Length || st.PassthroughFiles != 1 || st.ReadWaits != 0 {
				t.Errorf("after a passthrough open: %d chunks, %d compressed bytes, %d passthrough files, %d waits; want 1, %d, 1, 0",
					st.ReadChunks, st.ReadCompressed, st.PassthroughFiles, st.ReadWaits, x.Chunks(single)[0].Length)
			}
		})
	}
}
