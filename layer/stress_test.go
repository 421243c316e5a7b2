package layer

import (
	"archive/tar"
	"bytes"
	"io"
	"math/rand/v2"
	"path"
	"strings"
	"sync"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// TestStress reads random ranges of the files of several layers from many goroutines while
// the layers are fetched in the background, and checks every byte against whole-file reads.
func TestStress(t *testing.T) {
	e := newEnv(t)
	m := e.manager(withPrefetchBatch(64<<10), withPrefetchConcurrency(3))
	var layers []*Served
	for _, f := range e.fixtures[:6] {
		if servedKey(f) == "" {
			continue
		}
		ref := e.push("stress/"+f.Name+":v1", fixtureLayer(f))
		l, err := m.Lookup(t.Context(), ref, servedKey(f))
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	// Expected contents from the reference tar (last entry of a name wins).
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(testlayer.Tar()))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			files[strings.Trim(path.Clean("/"+h.Name), "/")] = b
		}
	}
	full := map[*Served]map[chunked.EntryID][]byte{}
	for _, l := range layers {
		full[l] = map[chunked.EntryID][]byte{}
		idx := l.Index()
		for id := range chunked.EntryID(idx.Len()) {
			en := idx.Entry(id)
			if en.Type != chunked.TypeReg || en.Inode != id || en.Size == 0 || !en.Visible() {
				continue
			}
			b, ok := files[en.Name]
			if !ok || int64(len(b)) != en.Size {
				t.Fatalf("%s: not in the reference tar", en.Name)
			}
			full[l][id] = b
		}
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 7))
			for range 300 {
				l := layers[rnd.IntN(len(layers))]
				ids := make([]chunked.EntryID, 0, len(full[l]))
				for id := range full[l] {
					ids = append(ids, id)
				}
				id := ids[rnd.IntN(len(ids))]
				content := full[l][id]
				off := rnd.Int64N(int64(len(content)))
				n := 1 + rnd.IntN(256<<10)
				buf := make([]byte, n)
				k, err := l.ReadFile(t.Context(), id, buf, off)
				if err != nil {
					t.Error(err)
					return
				}
				end := min(off+int64(n), int64(len(content)))
				if int64(k) != end-off || string(buf[:k]) != string(content[off:end]) {
					t.Errorf("%s [%d,+%d): wrong bytes", l.Index().Entry(id).Name, off, n)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, l := range layers {
		l.wait()
		if st := l.Status(); st.State != protocol.StateComplete {
			t.Errorf("%s: state %s (%s)", l.Digest(), st.State, st.Error)
		}
	}
}
