// Package producer runs a c/storage zstd:chunked compressor over the reference tar and writes the
// result as a fixture. The compressor is passed in by the per-version main packages (modern/,
// notarsplit/), which are separate modules because each pins a different c/storage version.
package producer

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/layerstore/layerstore/chunked/testdata/gen/fixture"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// Compressor has the signature of c/storage's pkg/chunked/compressor.ZstdCompressor.
type Compressor func(w io.Writer, metadata map[string]string, level *int) (io.WriteCloser, error)

// Run compresses the reference tar with compress (at its default level, as c/image calls it)
// and writes the fixture directory args[0]. gen names the generator directory and storageModule
// the module compress comes from, for producer.txt; note, if not empty, is appended to it.
func Run(args []string, gen, storageModule, note string, compress Compressor) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: go run . FIXTUREDIR")
	}
	ref := testlayer.Tar()
	var blob bytes.Buffer
	annotations := map[string]string{}
	w, err := compress(&blob, annotations, nil)
	if err != nil {
		return err
	}
	if _, err := w.Write(ref); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	versions := map[string]string{}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			versions[d.Path] = d.Version
		}
	}
	producer := fmt.Sprintf("%s %s pkg/chunked/compressor.ZstdCompressor(w, metadata, nil) (nil level = its default, 10; the way c/image calls it)\n"+
		"over internal/testlayer.Tar() by chunked/testdata/gen/%s; built with %s, github.com/klauspost/compress %s, github.com/vbatts/tar-split %s%s\n",
		storageModule, versions[storageModule], gen, runtime.Version(),
		versions["github.com/klauspost/compress"], versions["github.com/vbatts/tar-split"], note)
	desc := fixture.Descriptor{MediaType: fixture.LayerMediaType, Annotations: annotations}
	return fixture.Write(args[0], blob.Bytes(), desc, producer, ref)
}
