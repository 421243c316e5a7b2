package testregistry

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
)

// innerRegistry returns go-containerregistry's in-process registry, which serves everything
// but the blobs of Blobs: manifests, configs, uploads.
func innerRegistry() http.Handler {
	return registry.New(registry.Logger(log.New(io.Discard, "", 0)))
}

// pushImage pushes img as ref ("host/repo:tag") and returns its manifest digest.
func pushImage(ctx context.Context, ref string, img v1.Image) (digest.Digest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		return "", err
	}
	h, err := img.Digest()
	return digest.Digest(h.String()), err
}

// ImageLayer is a compressed layer (its DiffID known) of an image ImageOf builds, with its
// manifest annotations.
type ImageLayer struct {
	partial.CompressedLayer
	Annotations map[string]string
}

// ImageOf builds an OCI image of layers (bottom first); configure sets the config's platform,
// command and the like.
func ImageOf(layers []ImageLayer, configure func(*v1.ConfigFile)) (v1.Image, error) {
	var adds []mutate.Addendum
	for _, l := range layers {
		cl, err := partial.CompressedToLayer(l.CompressedLayer)
		if err != nil {
			return nil, err
		}
		mt, err := l.MediaType()
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: cl, Annotations: l.Annotations, MediaType: mt})
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	configure(cf)
	return mutate.ConfigFile(img, cf)
}

// imageOfBlobs builds an OCI image of layers (bottom first), as ImageOf does.
func imageOfBlobs(layers []LayerBlob, configure func(*v1.ConfigFile)) (v1.Image, error) {
	ils := make([]ImageLayer, len(layers))
	for i, l := range layers {
		ils[i] = ImageLayer{CompressedLayer: compressed{l}, Annotations: l.Annotations}
	}
	return ImageOf(ils, configure)
}

// compressed is a Blob as go-containerregistry reads it.
type compressed struct{ l LayerBlob }

var _ partial.CompressedLayer = compressed{}

func (c compressed) Digest() (v1.Hash, error) { return v1.NewHash(c.l.Digest().String()) }
func (c compressed) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(c.l.Blob)), nil
}
func (c compressed) Size() (int64, error)                { return int64(len(c.l.Blob)), nil }
func (c compressed) MediaType() (types.MediaType, error) { return types.MediaType(c.l.MediaType), nil }
func (c compressed) DiffID() (v1.Hash, error) {
	if c.l.DiffID == "" {
		return v1.Hash{}, fmt.Errorf("layer without DiffID")
	}
	return v1.NewHash(c.l.DiffID.String())
}
