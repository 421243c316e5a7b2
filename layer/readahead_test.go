package layer

import (
	"testing"

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
				ref := e.push("readahead/"+f.Name+":v1", fixtureLayer(f))
				m := e.manager(withPrefetch(false), withReadAhead(window))
				l, err := m.Lookup(t.Context(), ref, toc)
				if err != nil {
					t.Fatal(err)
				}
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
// b ending within window of a's end.
func adjacentFiles(x *chunked.Index, window int64) (a, b chunked.EntryID, ok bool) {
	var prev chunked.EntryID
	have := false
	for id := range regularFiles(x) {
		e := x.Entry(id)
		if cs := x.Chunks(id); len(cs) == 1 && cs[0].Length > 0 {
			if have {
				p := x.Chunks(prev)[0]
				if cs[0].Offset >= p.Offset && cs[0].End() <= p.End()+window && x.Entry(prev).Digest != e.Digest {
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
