package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/layerstore/layerstore/benchmarks/internal/shaper"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

func TestFloorSeconds(t *testing.T) {
	link := func(s string) shaper.Link {
		t.Helper()
		l, err := shaper.ParseLink(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, tc := range []struct {
		name   string
		f      floor
		link   string
		trips  int
		bytes  int64
		second float64
	}{
		// manifest, config, 2 TOCs, the chunks: 5 x 10 ms; 12.5 MB at 12.5 MB/s.
		{"two lazy layers", floor{LazyLayers: 2, TOCBytes: 500_000, ReadBytes: 12_000_000, ReadChunks: 300}, "100mbit/10ms", 5, 12_500_000, 1.05},
		{"nothing read", floor{LazyLayers: 3, TOCBytes: 125_000}, "100mbit/10ms", 5, 125_000, 0.06},
		{"1 Gbit/s", floor{LazyLayers: 1, TOCBytes: 25_000_000, ReadBytes: 100_000_000}, "1gbit/1ms", 4, 125_000_000, 1.004},
		{"a layer in full", floor{LazyLayers: 1, ReadBytes: 1_250_000, FullBytes: 1_250_000}, "100mbit/10ms", 4, 2_500_000, 0.24},
		{"unlimited", floor{LazyLayers: 2, ReadBytes: 1 << 20}, "unlimited", 5, 1 << 20, 0},
	} {
		f := tc.f
		if got := f.roundTrips(); got != tc.trips {
			t.Errorf("%s: %d round trips, want %d", tc.name, got, tc.trips)
		}
		if got := f.bytes(); got != tc.bytes {
			t.Errorf("%s: %d bytes, want %d", tc.name, got, tc.bytes)
		}
		if got := f.seconds(link(tc.link)); math.Abs(got-tc.second) > 1e-9 {
			t.Errorf("%s: %.6f s over %s, want %.6f", tc.name, got, tc.link, tc.second)
		}
	}
	f := floor{LazyLayers: 2, TOCBytes: 400_000, ReadBytes: 4_500_000, ReadChunks: 17, PassthroughFiles: 3}
	if got, want := f.String(), "5 RTT + 4.9 MB (TOCs 0.4 MB, 17 chunks 4.5 MB, 3 files of them whole, opened with passthrough)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestTOCBytes checks the TOC size read from a blob's footer: the zstd:chunked annotation's
// length where it has one, a range inside the blob before its footer otherwise.
func TestTOCBytes(t *testing.T) {
	fixtures, err := testlayer.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tested := 0
	for _, f := range fixtures {
		if f.Format != chunked.EStargz && f.Format != chunked.ZstdChunked {
			continue
		}
		p := filepath.Join(dir, f.Name)
		if err := os.WriteFile(p, f.Blob, 0o644); err != nil {
			t.Fatal(err)
		}
		n, err := tocBytes(p, f.Desc.MediaType, int64(len(f.Blob)))
		if err != nil {
			t.Errorf("%s: %v", f.Name, err)
			continue
		}
		tested++
		if n <= 0 || n >= int64(len(f.Blob)) {
			t.Errorf("%s: TOC of %d bytes in a blob of %d", f.Name, n, len(f.Blob))
		}
		if l, err := chunked.Classify(f.Desc); err == nil && l.TOC.Length > 0 && l.TOC.Length != n {
			t.Errorf("%s: TOC of %d bytes, the annotation says %d", f.Name, n, l.TOC.Length)
		}
	}
	if tested == 0 {
		t.Fatal("no eStargz or zstd:chunked fixture")
	}
}
