// Command zstdchunked compresses a tar stream read from stdin into a zstd:chunked blob with
// c/storage's compressor (the producer podman and buildah use), writes the blob to the file
// named by its argument and prints the annotations the compressor returns as JSON. It is its
// own module so that the layerstore module does not depend on c/storage; scalebench builds and
// runs it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"go.podman.io/storage/pkg/chunked/compressor"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "zstdchunked:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: zstdchunked BLOBFILE < TAR")
	}
	f, err := os.Create(os.Args[1])
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	annotations := map[string]string{}
	// A nil level is the compressor's default, as c/image calls it.
	w, err := compressor.ZstdCompressor(bw, annotations, nil)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, bufio.NewReaderSize(os.Stdin, 1<<20)); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(annotations)
}
