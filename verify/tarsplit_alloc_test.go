package verify_test

import (
	"runtime"
	"testing"

	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// The comparison of the TOC with the tar-split runs over every entry of layers of millions
// (beside the walks and reads it shares the processors with): comparing a header that agrees
// allocates nothing beyond reading it (about 18 allocations per entry, the tar-split's record
// and the tar header; comparing allocated 12 more).
const maxCompareAllocs = 24

func TestCompareTarSplitAllocations(t *testing.T) {
	const n = 20_000
	f, err := testlayer.SyntheticZstdChunked(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := verify.Open(t.Context(), f.Desc, f.DiffID, source(f.Blob), verify.Config{TarSplit: true}) // the comparison only, below
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := l.CheckTarSplit(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	perEntry := float64(after.Mallocs-before.Mallocs) / n
	t.Logf("%.1f allocations per entry", perEntry)
	if perEntry > maxCompareAllocs {
		t.Errorf("%.1f allocations per entry compared, want at most %d", perEntry, maxCompareAllocs)
	}
}

// TestReadTarSplitOneCopy: a tar-split read on its own (the background comparison's read, tens
// of MB for a large layer) is kept in the buffer it was read into, not copied again.
func TestReadTarSplitOneCopy(t *testing.T) {
	f, err := testlayer.SyntheticZstdChunked(20_000, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := verify.Open(t.Context(), f.Desc, f.DiffID, source(f.Blob), verify.Config{})
	if err != nil {
		t.Fatal(err)
	}
	size := l.Layout().TarSplit.Length
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := l.ReadTarSplit(t.Context(), source(f.Blob), false); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(size)*5/4 {
		t.Errorf("reading a tar-split of %d bytes allocated %d", size, alloc)
	}
}
