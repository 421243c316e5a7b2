// Command modern regenerates ../fixtures/zstdchunked-modern with the current c/storage
// zstd:chunked compressor (go.podman.io/storage/pkg/chunked/compressor), which writes the 64-byte
// footer and the tar-split frame. Run from this directory:
//
//	go run -tags "exclude_graphdriver_btrfs exclude_graphdriver_devicemapper" . ../../fixtures/zstdchunked-modern
package main

import (
	"fmt"
	"os"

	"github.com/layerstore/layerstore/chunked/testdata/gen/producer"
	"go.podman.io/storage/pkg/chunked/compressor"
)

func main() {
	if err := producer.Run(os.Args[1:], "modern", "go.podman.io/storage", "", compressor.ZstdCompressor); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
