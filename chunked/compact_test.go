package chunked_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// loadLimits accept every index the tests parse (fuzzLimits allow chunks of 1 GiB).
var loadLimits = chunked.Limits{MaxChunkSize: 1 << 30}

// roundTrip checks that LoadIndex accepts the binary form of x and gives an index that
// answers every question as x does.
func roundTrip(t testing.TB, x *chunked.Index) *chunked.Index {
	t.Helper()
	bin := append([]byte("prefix"), x.Binary()...)
	y, err := chunked.LoadIndex(bin[len("prefix"):], loadLimits)
	if err != nil {
		t.Fatalf("LoadIndex(Binary): %v", err)
	}
	if !bytes.Equal(y.Binary(), bin[len("prefix"):]) {
		t.Fatalf("Binary of the loaded index differs")
	}
	if a, b := answers(x), answers(y); a != b {
		t.Fatalf("the loaded index answers differently:\n%.2000s\nwant\n%.2000s", b, a)
	}
	return y
}

// answers renders what every method of x returns, for every entry.
func answers(x *chunked.Index) string {
	var b bytes.Buffer
	fmt.Fprintln(&b, x.Format(), x.Root(), x.Len(), x.TOCLen(), x.TarSplitDigest(), x.PrefetchEnd(), x.PayloadEnd())
	for i := range x.Len() + 1 { // one past the end: zero values
		id := chunked.EntryID(i)
		e, m := x.Entry(id), x.Meta(id)
		m.Name = e.Name
		if m != e {
			fmt.Fprintf(&b, "Meta %+v != Entry %+v\n", m, e)
		}
		at, ct := x.TOCTimes(id)
		fmt.Fprintf(&b, "%d %+v attr=%d base=%q path=%q times=%d,%d\n", id, e, x.AttrEntry(id), x.BaseName(id), x.Path(id), at, ct)
		cs := x.Chunks(id)
		fmt.Fprintf(&b, " chunks %d %+v\n", x.NumChunks(id), cs)
		for j, c := range cs {
			if got, ok := x.Chunk(id, j); !ok || got != c {
				fmt.Fprintf(&b, " Chunk(%d) = %+v, %v\n", j, got, ok)
			}
			fmt.Fprintf(&b, " at %d %d %d\n", x.ChunkAt(id, c.FileOffset), x.ChunkAt(id, c.FileOffset+c.Size-1), x.ChunkAt(id, c.FileOffset+c.Size))
		}
		if _, ok := x.Chunk(id, len(cs)); ok {
			fmt.Fprintf(&b, " Chunk(%d) past the end\n", len(cs))
		}
		fmt.Fprintf(&b, " xattrs %q %q children %v\n", x.Xattrs(id), x.TOCXattrs(id), x.Children(id))
		for _, c := range x.Children(id) {
			got, ok := x.Lookup(id, x.BaseName(c))
			fmt.Fprintf(&b, " lookup %d %v", got, ok)
		}
		got, ok := x.LookupPath(x.Path(id))
		fmt.Fprintf(&b, " lookupPath %d %v\n", got, ok)
	}
	return b.String()
}

func TestIndexRoundTripFixtures(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			layout, _, js := fixtureTOC(t, f)
			x, err := chunked.Parse(context.Background(), layout, js, chunked.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, x)
			if err := chunked.CompareWide(layout, js, chunked.Limits{}); err != nil {
				t.Errorf("compact index: %v", err)
			}
		})
	}
	js, end := testlayer.SyntheticTOC(2000)
	x, err := chunked.Parse(context.Background(), syntheticLayout(end), js, chunked.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, x)
	if err := chunked.CompareWide(syntheticLayout(end), js, chunked.Limits{}); err != nil {
		t.Errorf("compact index: %v", err)
	}
}

func syntheticLayout(end int64) *chunked.Layout {
	return &chunked.Layout{Format: chunked.ZstdChunked, TOC: byterange.Range{Offset: end + 8, Length: 1}}
}

// TestIndexCompact checks what an index costs per entry of a small-file tree: its binary form,
// and the heap it keeps (the same, plus a constant).
func TestIndexCompact(t *testing.T) {
	const n = 200_000
	js, end := testlayer.SyntheticTOC(n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x, err := chunked.Parse(context.Background(), syntheticLayout(end), js, chunked.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perEntry := float64(len(x.Binary())) / float64(x.Len())
	heap := (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(x.Len())
	runtime.KeepAlive(x)
	runtime.KeepAlive(js)
	t.Logf("%d entries: binary form %.1f bytes per entry, heap %.1f bytes per entry", x.Len(), perEntry, heap)
	if perEntry > 90 {
		t.Errorf("binary form of %.1f bytes per entry, want at most 90", perEntry)
	}
	if heap > perEntry+8 {
		t.Errorf("index keeps %.1f bytes of heap per entry, its binary form %.1f", heap, perEntry)
	}
}

// TestLoadIndexRefuses checks that damaged forms are refused with a typed error.
func TestLoadIndexRefuses(t *testing.T) {
	js, end := testlayer.SyntheticTOC(100)
	x, err := chunked.Parse(context.Background(), syntheticLayout(end), js, chunked.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	good := bytes.Clone(x.Binary())
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for name, data := range map[string][]byte{
		"empty":     nil,
		"magic":     mutate(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":   mutate(func(b []byte) []byte { b[4] = 2; return b }),
		"truncated": good[:len(good)-1],
		"trailing":  append(bytes.Clone(good), 0),
		"root":      mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[12:], 1<<20); return b }),
		"entries":   mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[16:], 1<<31); return b }),
		"payload":   mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[48:], 10); return b }),
	} {
		if _, err := chunked.LoadIndex(data, chunked.Limits{}); !errors.Is(err, chunked.ErrInvalid) && !errors.Is(err, chunked.ErrLimit) {
			t.Errorf("%s: LoadIndex error %v, want ErrInvalid or ErrLimit", name, err)
		}
	}
	if _, err := chunked.LoadIndex(good, chunked.Limits{MaxEntries: 50}); !errors.Is(err, chunked.ErrLimit) {
		t.Errorf("101 entries with MaxEntries 50: %v, want ErrLimit", err)
	}
	if _, err := chunked.LoadIndex(good, chunked.Limits{MaxChunkSize: 1000}); !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("chunks of 64 KiB with MaxChunkSize 1000: %v, want ErrInvalid", err)
	}
}

// FuzzLoadIndex checks that whatever the bytes, LoadIndex refuses them with a typed error or
// returns an index none of whose methods panics or loops.
func FuzzLoadIndex(f *testing.F) {
	for _, fx := range fuzzFixtures(f) {
		layout, _, js := fixtureTOC(f, fx)
		x, err := chunked.Parse(context.Background(), layout, js, fuzzLimits)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(x.Binary())
	}
	js, end := testlayer.SyntheticTOC(60)
	x, err := chunked.Parse(context.Background(), syntheticLayout(end), js, fuzzLimits)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(x.Binary())
	f.Fuzz(func(t *testing.T, data []byte) {
		x, err := chunked.LoadIndex(data, fuzzLimits)
		if err != nil {
			if !errors.Is(err, chunked.ErrInvalid) && !errors.Is(err, chunked.ErrLimit) {
				t.Fatalf("LoadIndex error %v wraps neither ErrInvalid nor ErrLimit", err)
			}
			return
		}
		if !bytes.Equal(x.Binary(), data) {
			t.Fatal("Binary differs from the loaded bytes")
		}
		answers(x)
		if !reflect.DeepEqual(x.Entry(x.Root()).Type, chunked.TypeDir) {
			t.Fatal("root is not a directory")
		}
	})
}

// TestIndexMoved: an index moved to a copy of its bytes is the same index, using the copy;
// bytes that differ in any way are refused.
func TestIndexMoved(t *testing.T) {
	js, end := testlayer.SyntheticTOC(100_000) // an index of two windows
	x, err := chunked.Parse(context.Background(), syntheticLayout(end), js, chunked.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cp := bytes.Clone(x.Binary())
	var read []int
	y, err := x.Moved(cp, func(done []byte) { read = append(read, len(done)) })
	if err != nil {
		t.Fatal(err)
	}
	if len(read) < 2 || read[len(read)-1] != len(cp) || !slices.IsSorted(read) {
		t.Errorf("read reported %v of %d bytes", read, len(cp))
	}
	if &y.Binary()[0] != &cp[0] {
		t.Error("the moved index does not use the bytes given")
	}
	if a, b := x.Binary(), y.Binary(); !bytes.Equal(a, b) || y.Len() != x.Len() || y.Path(chunked.EntryID(x.Len()-1)) != x.Path(chunked.EntryID(x.Len()-1)) {
		t.Error("the moved index differs")
	}
	for _, bad := range [][]byte{cp[:len(cp)-1], append(bytes.Clone(cp), 0), nil} {
		if _, err := x.Moved(bad, nil); !errors.Is(err, chunked.ErrInvalid) {
			t.Errorf("Moved to %d other bytes = %v, want ErrInvalid", len(bad), err)
		}
	}
	flipped := bytes.Clone(cp)
	flipped[len(flipped)/2] ^= 1
	if _, err := x.Moved(flipped, nil); !errors.Is(err, chunked.ErrInvalid) {
		t.Errorf("Moved to bytes with one flipped = %v, want ErrInvalid", err)
	}
}
