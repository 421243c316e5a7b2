package layer

import (
	"archive/tar"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"

	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// TestPrioritizedRequestsBounded: the prioritized files of an eStargz layer (its producer's
// profile) are fetched at once, but at most prioSlots requests at a time: each request in
// flight sits on the link ahead of the container's own reads (the big layer of the large
// image prioritizes a 117 MB library of which its start reads 64 KiB).
func TestPrioritizedRequestsBounded(t *testing.T) {
	data := make([]byte, 6<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	dir := func(name string) testlayer.Entry {
		return testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: testlayer.Epoch}}
	}
	fx, err := testlayer.BuildEStargz("prio", testlayer.Build([]testlayer.Entry{dir("usr/"), dir("usr/bin/"), dir("usr/lib/"),
		regEntry("usr/bin/rest", data[:1<<20]), regEntry("usr/lib/big.so", data)}),
		estargzChunkSize(256<<10), estargz.WithPrioritizedFiles([]string{"usr/lib/big.so"}))
	if err != nil {
		t.Fatal(err)
	}
	e := newProfEnv(t)
	ref := profRepo + ":v1"
	e.reg.push(ref, fx)
	e.reg.delay = 50 * time.Millisecond
	m, _ := e.start(WithPrefetchQuiet(time.Hour))
	l := lookupOK(t, m, ref, profKey(fx))
	id := fileOf(t, l, "usr/lib/big.so")
	last, _ := l.Index().Chunk(id, l.Index().NumChunks(id)-1)
	waitFor(t, "the prioritized file", func() bool {
		for _, ev := range e.reg.log(false) {
			if !ev.end.IsZero() && ev.ranges[len(ev.ranges)-1].End() >= last.End() {
				return true
			}
		}
		return false
	})
	log := e.reg.log(false)
	most := 0
	for _, a := range log {
		n := 0
		for _, b := range log {
			if !b.start.After(a.start) && (b.end.IsZero() || b.end.After(a.start)) {
				n++
			}
		}
		most = max(most, n)
	}
	if most > prioSlots || len(log) < 4 {
		t.Errorf("%d requests of prioritized files in flight at once (of %d), want at most %d", most, len(log), prioSlots)
	}
}
