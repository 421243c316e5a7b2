// Command notarsplit regenerates ../fixtures/zstdchunked-notarsplit with an older c/storage
// zstd:chunked compressor (github.com/containers/storage v1.46, before tar-split was added),
// which writes io.github.containers.zstd-chunked.* annotations, a 40-byte footer and no tar-split.
// Run from this directory:
//
//	go run -tags "exclude_graphdriver_btrfs exclude_graphdriver_devicemapper" . ../../fixtures/zstdchunked-notarsplit
package main

import (
	"fmt"
	"os"

	"github.com/containers/storage/pkg/chunked/compressor"
	"github.com/layerstore/layerstore/chunked/testdata/gen/producer"
)

func main() {
	if err := producer.Run(os.Args[1:], "notarsplit", "github.com/containers/storage", " (MVS-selected above the v1.16.4 / v0.11.3 this c/storage requires; the stream format is c/storage's)", compressor.ZstdCompressor); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
