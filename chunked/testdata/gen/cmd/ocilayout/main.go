// Command ocilayout writes an OCI image layout directory holding a single-layer image whose layer
// is the uncompressed reference tar (internal/testutil/testlayer). legacy.sh feeds it to skopeo.
//
//	go run ./cmd/ocilayout DIR TAG
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/layerstore/layerstore/chunked/testdata/gen/fixture"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: ocilayout DIR TAG")
		os.Exit(2)
	}
	if err := write(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func write(dir, tag string) error {
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return err
	}
	put := func(mediaType string, b []byte) (fixture.Descriptor, error) {
		d := fixture.Descriptor{MediaType: mediaType, Digest: fixture.Digest(b), Size: int64(len(b))}
		return d, os.WriteFile(filepath.Join(blobs, strings.TrimPrefix(d.Digest, "sha256:")), b, 0o644)
	}
	marshal := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return b
	}
	layer := testlayer.Tar()
	layerDesc, err := put("application/vnd.oci.image.layer.v1.tar", layer)
	if err != nil {
		return err
	}
	config := map[string]any{
		"created":      testlayer.Epoch,
		"architecture": "amd64",
		"os":           "linux",
		"config":       map[string]any{},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	}
	configDesc, err := put("application/vnd.oci.image.config.v1+json", marshal(config))
	if err != nil {
		return err
	}
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []fixture.Descriptor{layerDesc},
	}
	manifestDesc, err := put("application/vnd.oci.image.manifest.v1+json", marshal(manifest))
	if err != nil {
		return err
	}
	manifestDesc.Annotations = map[string]string{"org.opencontainers.image.ref.name": tag}
	index := map[string]any{"schemaVersion": 2, "manifests": []fixture.Descriptor{manifestDesc}}
	if err := os.WriteFile(filepath.Join(dir, "index.json"), marshal(index), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
}
