package verify_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// Restore uses the saved tar-split in place (the layer manager maps it from its record): it
// allocates far less than the tar-split's size, and the restored Verifier compares it with
// the TOC and proves the DiffID from it.
func TestRestoreUsesTarSplitInPlace(t *testing.T) {
	f, err := testlayer.SyntheticZstdChunked(20_000, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, src := open(t, f)
	if s := l.Save(); s.TarSplit != nil {
		t.Fatal("Open read the tar-split without Config.TarSplit")
	}
	l, err = verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{TarSplit: true})
	if err != nil {
		t.Fatal(err)
	}
	s := l.Save()
	if len(s.TarSplit) < 64<<10 {
		t.Fatalf("a tar-split of %d bytes: too small to tell", len(s.TarSplit))
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r, err := verify.Restore(s, l.Index(), verify.Config{})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n >= uint64(len(s.TarSplit))/2 {
		t.Errorf("Restore allocated %d bytes for a tar-split of %d: it copied it", n, len(s.TarSplit))
	}
	if err := r.CheckTarSplit(t.Context(), nil); err != nil { // restored: nothing to read
		t.Fatal(err)
	}
	if err := r.CheckDiffID(t.Context(), nil, payloads(r, src)); err != nil {
		t.Fatal(err)
	}
	if r.Guarantee() != verify.DiffIDVerified || r.TarSize() <= 0 {
		t.Errorf("restored: guarantee %v, tar size %d", r.Guarantee(), r.TarSize())
	}
}

// The comparison of a restored layer's TOC with its tar-split calls the Config.Unresident
// function as it reads them, every so many entries; a Verifier from Open has none to call.
func TestRestoreUnresident(t *testing.T) {
	f, err := testlayer.SyntheticZstdChunked(5_000, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := source(f.Blob)
	l, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{TarSplit: true}) // saved with the layer
	if err != nil {
		t.Fatal(err)
	}
	verify.SetUnresidentEvery(t, 1000)
	calls := 0
	r, err := verify.Restore(l.Save(), l.Index(), verify.Config{Unresident: func() { calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CheckTarSplit(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if want := int(verify.HeadersCompared(r)) / 1000; calls != want || calls < 4 {
		t.Errorf("%d calls for %d entries, want %d", calls, verify.HeadersCompared(r), want)
	}
	if err := l.CheckTarSplit(t.Context(), src); err != nil {
		t.Fatal(err)
	}
}

// ReleaseTarSplit drops the tar-split the Verifier read itself once the comparison has its
// verdict (not before: the comparison needs it), CheckDiffID reads it again from its source,
// and a tar-split given to Restore is kept (the caller maps it; nothing to read again).
func TestReleaseTarSplit(t *testing.T) {
	f, err := testlayer.SyntheticZstdChunked(2_000, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, src := open(t, f)
	if err := l.ReadTarSplit(t.Context(), src, true); err != nil {
		t.Fatal(err)
	}
	l.ReleaseTarSplit()
	if l.Save().TarSplit == nil {
		t.Fatal("released before the comparison")
	}
	if err := l.CheckTarSplit(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	saved := l.Save()
	l.ReleaseTarSplit()
	if l.Save().TarSplit != nil {
		t.Fatal("the tar-split the comparison read is kept after its verdict")
	}
	failing := func(context.Context, chunked.EntryID) (io.ReadCloser, error) {
		return nil, errors.New("payload failed")
	}
	if err := l.CheckDiffID(t.Context(), src, failing); err == nil || l.Save().TarSplit != nil {
		t.Fatalf("CheckDiffID with failing payloads = %v, and kept %d bytes of tar-split read again", err, len(l.Save().TarSplit))
	}
	counted := &countingSource{Source: src}
	if err := l.CheckDiffID(t.Context(), counted, payloads(l, src)); err != nil {
		t.Fatal(err)
	}
	ts := l.Layout().TarSplit
	if !slices.Contains(counted.read, byterange.Range{Offset: ts.Offset, Length: ts.Length}) {
		t.Errorf("CheckDiffID read %v, want the tar-split %v read again", counted.read, ts)
	}

	r, err := verify.Restore(saved, l.Index(), verify.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r.ReleaseTarSplit()
	if r.Save().TarSplit == nil {
		t.Fatal("a restored tar-split was released")
	}
	if err := r.CheckDiffID(t.Context(), failingSource{}, payloads(r, src)); err != nil {
		t.Fatalf("CheckDiffID of the restored layer read again: %v", err)
	}
}
