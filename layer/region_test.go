package layer

import (
	"archive/tar"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"

	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// TestRegion checks that a cold read of a file cut into small chunks (as zstd:chunked cuts
// them) also fetches the rest of the region around it, without the reader waiting, so that
// later reads in the region ask the registry nothing: the first window is regionBase bytes,
// and it doubles with each cold read of the same file. That is from the first cold read for a
// file executed or predicted (mapped: its pages are faulted in here and there), from the
// second for a file only read. With read-ahead off, reads fetch only what they ask for.
func TestRegion(t *testing.T) {
	const size = 6 << 20
	data := testlayer.RandomBytes(size, 3) // incompressible: the chunks' compressed sizes are their sizes
	hdr := tar.Header{Typeflag: tar.TypeReg, Name: "big.bin", Mode: 0o644, Size: size}
	f, err := testlayer.BuildEStargz("region", testlayer.Build([]testlayer.Entry{{Header: hdr, Data: data}}),
		estargz.WithChunkSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		off  int64
		cold bool // a request when regions are on
	}
	// cold reads, each in a part of the file no earlier read's region covered, and a read
	// within the region each fetched
	mappedSteps := []step{
		{100 << 10, true},  // region [0, 1 MiB)
		{900 << 10, false}, // in it
		{1536 << 10, true}, // second cold read: [0, 2 MiB)
		{1900 << 10, false},
		{3 << 20, true}, // third: [0, 4 MiB)
		{2 << 20, false},
		{3900 << 10, false},
		{5 << 20, true}, // fourth: at most 4 MiB, [4, 8 MiB)
		{4 << 20, false},
	}
	readSteps := []step{
		{100 << 10, true}, // no region: the first cold read of a file read
		{900 << 10, true}, // the second: [0, 1 MiB)
		{1000 << 10, false},
		{1536 << 10, true}, // [0, 2 MiB)
		{1900 << 10, false},
	}
	for _, c := range []struct {
		window int64
		mapped bool
	}{{defaultReadAhead, true}, {defaultReadAhead, false}, {0, true}} {
		window := c.window
		e := newEnv(t)
		ref := e.push("region/big:v1", fixtureLayer(f))
		m := e.manager(withPrefetch(false), withReadAhead(window))
		l, err := m.Lookup(t.Context(), ref, tocKey(f.Desc.Annotations))
		if err != nil {
			t.Fatal(err)
		}
		id, ok := l.Index().LookupPath("big.bin")
		if !ok || l.Index().NumChunks(id) < 90 {
			t.Fatalf("big.bin: %v, %d chunks", ok, l.Index().NumChunks(id))
		}
		requests := func() int {
			s := e.reg.Stats(f.Desc.Digest)
			return s.Ranged + s.Full
		}
		// settle waits until no region fetch is in flight.
		settle := func() {
			deadline := time.Now().Add(10 * time.Second)
			for len(m.env.regions) > 0 {
				if time.Now().After(deadline) {
					t.Fatal("region fetches still in flight after 10 s")
				}
				time.Sleep(time.Millisecond)
			}
		}
		read := func(off int64) (fetched bool) {
			t.Helper()
			before := requests()
			buf := make([]byte, 4096)
			n, err := l.ReadFile(t.Context(), id, buf, off)
			if err != nil || n != len(buf) || string(buf) != string(data[off:off+4096]) {
				t.Fatalf("read at %d: %d bytes, %v", off, n, err)
			}
			after := requests()
			settle()
			return after > before
		}
		steps := readSteps
		if c.mapped {
			steps = mappedSteps
			l.markPredicted(id) // as Executing does, without its reads
		}
		for _, s := range steps {
			got := read(s.off)
			want := s.cold || window == 0
			if got != want {
				t.Errorf("read-ahead %d, mapped %v: read at %d KiB asked the registry: %v, want %v", window, c.mapped, s.off>>10, got, want)
			}
		}

	}
}

// TestRegionBoundedByContent: a region of a file of zeros (64 KiB chunks of a few dozen
// compressed bytes each) holds at most its window of decompressed content, however little
// it takes over the link, at every step of its growth: regions are bounded by what they
// decompress, not by what a hostile image makes them download.
func TestRegionBoundedByContent(t *testing.T) {
	e := newEnv(t)
	f := zerosLayer(t, 64<<20, 64<<10)
	ref := e.push("zeros/region:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false))
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := l.Index().LookupPath("zeros")
	if n := l.Index().NumChunks(id); n < 1000 {
		t.Fatalf("%d chunks", n)
	}
	l.markPredicted(id) // mapped: regions from the first cold read
	for step := range 12 {
		i := step * 97 % l.Index().NumChunks(id)
		var content, compressed int64
		for _, k := range l.region(id, i) {
			r := l.ref(k)
			content += r.Size
			compressed += r.Length
		}
		window := min(int64(regionBase)<<min(step, 8), regionMax)
		if content > window {
			t.Errorf("cold read %d: a region of %d bytes of content, above its window of %d", step, content, window)
		}
		if content < window/2 {
			t.Errorf("cold read %d: a region of %d bytes of content, for a window of %d", step, content, window)
		}
		if step == 11 && compressed*100 > content {
			t.Errorf("%d compressed bytes for %d of content: the zeros do not compress", compressed, content)
		}
	}
}

// TestProfileReplaysWhatWasRead: a profile records how much of each file was read, and its
// replay fetches the chunks of a file that start before that end, not the whole file: a
// program that reads the first pages of a large library does not have it fetched whole on its
// next cold start (it did, and a learned start was slower than one without a profile). A file
// read to its end, or recorded by an older daemon without ends, is replayed whole.
func TestProfileReplaysWhatWasRead(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	noise := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	big, small := noise(1<<20), noise(48<<10)
	f, err := testlayer.BuildEStargz("partial", testlayer.Build([]testlayer.Entry{
		{Header: tarFile("usr/lib/big.so", int64(len(big))), Data: big},
		{Header: tarFile("usr/bin/f00", int64(len(small))), Data: small},
	}), estargz.WithChunkSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	e := newProfEnv(t)
	ref := profRepo + ":v1"
	e.reg.push(ref, f)
	m, stop := e.start(withPrefetch(false), withReadAhead(0), withProfileWindow(200*time.Millisecond))
	l := lookupOK(t, m, ref, profKey(f))
	id := fileOf(t, l, "usr/lib/big.so")
	buf := make([]byte, 4096)
	if _, err := l.ReadFile(t.Context(), id, buf, 0); err != nil {
		t.Fatal(err)
	}
	readPaths(t, l, "usr/bin/f00")
	waitProfile(t, m, profRepo, f.Desc.Digest)
	p := m.profiles.Get(profRepo)
	if pl := p.Layers[0]; !slices.Equal(pl.Files, []string{"usr/lib/big.so", "usr/bin/f00"}) || !slices.Equal(pl.Ends, []int64{4096, 0}) {
		t.Fatalf("profile %q ends %v, want big.so to 4096 and f00 whole", pl.Files, pl.Ends)
	}
	stop()

	e.evict()
	m, _ = e.start(withPrefetchConcurrency(1), withPrefetchBatch(64<<10), withPrefetchQuiet(0), withReadAhead(0))
	l = lookupOK(t, m, ref, profKey(f))
	waitComplete(t, l)
	st := l.Status()
	first := l.Index().Chunks(fileOf(t, l, "usr/lib/big.so"))[0]
	want := first.Length + l.Index().Chunks(fileOf(t, l, "usr/bin/f00"))[0].Length
	if st.Profile == nil || st.Profile.Files != 2 || st.Profile.Bytes != want {
		t.Errorf("status profile %+v, want 2 files and %d bytes: big.so's first chunk and f00", st.Profile, want)
	}
}
