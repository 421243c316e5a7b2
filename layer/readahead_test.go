package layer

import (
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
)

// TestReadAhead checks that a cold read also fetches the files that follow in the blob, within
// the read-ahead window, so that reading them next asks the registry nothing; and that with no
// window it does not.
func TestReadAhead(t *testing.T) {
	for _, f := range newEnv(t).fixtures {
		toc := tocKey(f.Desc.Annotations)
		if toc == "" {
			continue // not served to modern runtimes
		}
		t.Run(f.Name, func(t *testing.T) {
			for _, window := range []int64{defaultReadAhead, 0} {
				e := newEnv(t) // an empty cache
				_, _, l := e.lookupFixture("readahead/"+f.Name, f, toc, withPrefetch(false), withReadAhead(window))
				a, b, ok := adjacentFiles(l.Index(), defaultReadAhead)
				if !ok {
					t.Skip("no two small files next to each other in the blob")
				}
				buf := make([]byte, 1<<20)
				if _, err := l.ReadFile(t.Context(), a, buf, 0); err != nil {
					t.Fatal(err)
				}
				before := e.reg.Stats(f.Desc.Digest)
				if _, err := l.ReadFile(t.Context(), b, buf, 0); err != nil {
					t.Fatal(err)
				}
				after := e.reg.Stats(f.Desc.Digest)
				fetched := after.Ranged+after.Full > before.Ranged+before.Full
				if window > 0 && fetched {
					t.Errorf("read-ahead %d: reading %s after %s asked the registry again", window, l.Index().Entry(b).Name, l.Index().Entry(a).Name)
				}
				if window == 0 && !fetched {
					t.Errorf("no read-ahead: %s was read without a request", l.Index().Entry(b).Name)
				}
			}
		})
	}
}

// adjacentFiles returns two regular files, b right after a in the blob, each of one chunk,
// b ending within window of a's end and starting at it or after: not in a's compressed
// bytes (eStargz's small chunks share a member), which a's own request fetches whatever the
// window, and a read of b may join while that request is still ending.
func adjacentFiles(x *chunked.Index, window int64) (a, b chunked.EntryID, ok bool) {
	var prev chunked.EntryID
	have := false
	for id := range regularFiles(x) {
		e := x.Entry(id)
		if cs := x.Chunks(id); len(cs) == 1 && cs[0].Length > 0 {
			if have {
				p := x.Chunks(prev)[0]
				if cs[0].Offset >= p.End() && cs[0].End() <= p.End()+window && x.Entry(prev).Digest != e.Digest {
					return prev, id, true
				}
			}
			prev, have = id, true
		} else {
			have = false
		}
	}
	return 0, 0, false
}

// TestReadBeforeReadAheadArrives: a cold read returns once its own chunk has arrived and
// verified, while the read-ahead that shares its request is still on its way: the body stalls
// right after the chunk's bytes, and the read does not wait for the rest. The file after it, in
// the same request, is served once its bytes come.
func TestReadBeforeReadAheadArrives(t *testing.T) {
	for _, f := range newEnv(t).fixtures {
		toc := tocKey(f.Desc.Annotations)
		if toc == "" {
			continue // not served to modern runtimes
		}
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t)
			_, _, l := e.lookupFixture("readahead-stall/"+f.Name, f, toc, withPrefetch(false))
			a, b, ok := adjacentFiles(l.Index(), defaultReadAhead)
			if !ok {
				t.Skip("no two small files next to each other in the blob")
			}
			ca, _ := l.Index().Chunk(a, 0)
			e.reg.Stall(f.Desc.Digest, ca.End())
			t.Cleanup(func() { e.reg.Unstall(f.Desc.Digest) })
			buf := make([]byte, 1<<20)
			done := make(chan error, 1)
			go func() {
				_, err := l.ReadFile(t.Context(), a, buf, 0)
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("the read of %s waited for the read-ahead behind it", l.Index().Entry(a).Name)
			}
			e.reg.Unstall(f.Desc.Digest)
			before := e.reg.Stats(f.Desc.Digest)
			n, err := l.ReadFile(t.Context(), b, buf, 0)
			if err != nil || int64(n) != l.Index().Entry(b).Size {
				t.Fatalf("reading %s: %d bytes, %v", l.Index().Entry(b).Name, n, err)
			}
			if after := e.reg.Stats(f.Desc.Digest); after.Ranged+after.Full > before.Ranged+before.Full {
				t.Errorf("reading %s after the stall asked the registry again", l.Index().Entry(b).Name)
			}
		})
	}
}
