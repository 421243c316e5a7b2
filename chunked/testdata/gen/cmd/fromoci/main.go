// Command fromoci turns the single layer of the image TAG in the OCI layout DIR into a fixture:
// the layer blob and its descriptor exactly as the manifest states it.
//
//	go run ./cmd/fromoci DIR TAG FIXTUREDIR PRODUCER-TEXT
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/layerstore/layerstore/chunked/testdata/gen/fixture"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: fromoci DIR TAG FIXTUREDIR PRODUCER-TEXT")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3], os.Args[4]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(dir, tag, out, producer string) error {
	readBlob := func(d fixture.Descriptor) ([]byte, error) {
		return os.ReadFile(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d.Digest, "sha256:")))
	}
	strict := func(b []byte, v any) error {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		return dec.Decode(v)
	}
	indexJSON, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return err
	}
	var index struct {
		Manifests []fixture.Descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(indexJSON, &index); err != nil {
		return err
	}
	var manifestDesc *fixture.Descriptor
	for i, m := range index.Manifests {
		if m.Annotations["org.opencontainers.image.ref.name"] == tag {
			manifestDesc = &index.Manifests[i]
		}
	}
	if manifestDesc == nil {
		return fmt.Errorf("no manifest tagged %q in %s", tag, dir)
	}
	manifestJSON, err := readBlob(*manifestDesc)
	if err != nil {
		return err
	}
	var manifest struct {
		SchemaVersion int                  `json:"schemaVersion"`
		MediaType     string               `json:"mediaType"`
		Config        fixture.Descriptor   `json:"config"`
		Layers        []fixture.Descriptor `json:"layers"`
	}
	// Strict, so that a descriptor field the fixture would drop is noticed.
	if err := strict(manifestJSON, &manifest); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if len(manifest.Layers) != 1 {
		return fmt.Errorf("manifest has %d layers", len(manifest.Layers))
	}
	layer := manifest.Layers[0]
	blob, err := readBlob(layer)
	if err != nil {
		return err
	}
	configJSON, err := readBlob(manifest.Config)
	if err != nil {
		return err
	}
	var config struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(configJSON, &config); err != nil {
		return err
	}
	ref := testlayer.Tar()
	if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != fixture.Digest(ref) {
		return fmt.Errorf("config diff_ids %v, reference tar is %s", config.RootFS.DiffIDs, fixture.Digest(ref))
	}
	fmt.Printf("manifest layer descriptor: %+v\n", layer)
	return fixture.Write(out, blob, layer, producer, ref)
}
