package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/layerstore/layerstore/benchmarks/internal/shaper"
	"github.com/layerstore/layerstore/chunked"
)

// floor is what a cold lazy start of an image cannot do without over its link: the round
// trips no pull avoids, one after the other, and the bytes the workload needs, at the link's
// rate. Counted round trips, in the order a pull must make them:
//
//   - the manifest (the runtime knows nothing of the image before it);
//   - the config (named by the manifest);
//   - one TOC request per layer served lazily (its footer and TOC in one range request at the
//     end of the blob), one layer after the other: the runtime looks a layer up only once
//     its parent is in its storage;
//   - one for the chunks the workload reads, when it reads any (all of them in one request
//     at best: the workload's reads are taken as known in advance).
//
// Connection set-up, the registry's ping and the runtime's own work are left out, and so are
// the bytes of the manifest and config (a few KB). Bytes counted: the compressed TOC of each
// layer served lazily, the compressed bytes of the chunks the workload read (the daemon's
// status: every chunk the kernel asked for, see protocol.LayerStatus.ReadChunks) and the layers
// the runtime pulled in full (none in these images). The floor is the same for every store:
// the read set comes from layerstore's runs of the same image, format, runtime and link.
type floor struct {
	LazyLayers int   // layers served lazily: a TOC request each
	TOCBytes   int64 // their TOCs, compressed
	ReadBytes  int64 // compressed bytes of the chunks the workload read
	ReadChunks int64 // how many chunks
	// PassthroughFiles is how many of the files read were opened with passthrough: counted
	// whole, their reads unseen.
	PassthroughFiles int64
	FullBytes        int64 // layers pulled in full
}

// roundTrips counts the round trips of the floor (see floor).
func (f floor) roundTrips() int {
	n := 2 + f.LazyLayers
	if f.ReadBytes > 0 || f.FullBytes > 0 {
		n++
	}
	return n
}

// bytes is what must cross the link.
func (f floor) bytes() int64 { return f.TOCBytes + f.ReadBytes + f.FullBytes }

// seconds is the floor over link l: its round trips at the link's RTT, its bytes at its rate
// (none over an unlimited link).
func (f floor) seconds(l shaper.Link) float64 {
	s := float64(f.roundTrips()) * l.RTT.Seconds()
	if l.Rate > 0 {
		s += float64(f.bytes()) / float64(l.Rate)
	}
	return s
}

// String shows how the floor is made, for the report.
func (f floor) String() string {
	s := fmt.Sprintf("%d RTT + %s (TOCs %s, %d chunks %s", f.roundTrips(), mb(f.bytes()), mb(f.TOCBytes), f.ReadChunks, mb(f.ReadBytes))
	if f.PassthroughFiles > 0 {
		s += fmt.Sprintf(", %d files of them whole, opened with passthrough", f.PassthroughFiles)
	}
	if f.FullBytes > 0 {
		s += ", layers in full " + mb(f.FullBytes)
	}
	return s + ")"
}

// tocBytes returns the compressed size of the TOC of a lazily pullable layer blob, from its
// footer: an eStargz (gzip media type) or zstd:chunked (zstd) blob at path, of size bytes.
// The tar-split of zstd:chunked is not counted: serving files does not need it.
func tocBytes(path, mediaType string, size int64) (int64, error) {
	format := chunked.EStargz
	if strings.Contains(mediaType, "zstd") {
		format = chunked.ZstdChunked
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := min(chunked.TailSize(format), size)
	tail := make([]byte, n)
	if _, err := f.ReadAt(tail, size-n); err != nil && err != io.EOF {
		return 0, err
	}
	ft, err := chunked.ParseFooter(format, tail, size)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return ft.TOC.Length, nil
}
