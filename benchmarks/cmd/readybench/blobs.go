package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// layerBlob is a compressed layer in the cache's blobs directory.
type layerBlob struct {
	Path        string            `json:"-"`
	Digest      digest.Digest     `json:"digest"`
	Size        int64             `json:"size"`
	MediaType   string            `json:"mediaType"`
	DiffID      digest.Digest     `json:"diffID"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Stamp       stamp             `json:"stamp"`
	Missed      int               `json:"missed,omitempty"` // prioritized files not in this layer
}

// layerBlob returns layer compressed in format f, building it if needed. estargz-prio blobs
// depend on the image's profile, the others only on the layer.
func (c *imageCache) layerBlob(ctx context.Context, layer, f, image string, profile []string) (layerBlob, stamp, error) {
	t := c.cat.Layers[layer]
	key := t.DiffID + " " + f
	stem := layer + "-" + f
	if f == fmtEStargzPri {
		h := sha256.Sum256([]byte(strings.Join(profile, "\n")))
		key += " " + hex.EncodeToString(h[:8])
		stem += "-" + image
	}
	p := filepath.Join(c.dir, "blobs", stem)
	var b layerBlob
	if js, err := os.ReadFile(p + ".json"); err == nil && json.Unmarshal(js, &b) == nil && b.Stamp.Key == key {
		if fi, err := os.Stat(p + ".blob"); err == nil && fi.Size() == b.Size {
			b.Path = p + ".blob"
			return b, b.Stamp, nil
		}
	}
	fmt.Fprintf(os.Stderr, "compressing layer %s as %s\n", layer, f)
	start := time.Now()
	tarPath := filepath.Join(c.dir, "layers", layer+".tar")
	var err error
	switch f {
	case fmtGzip:
		b, err = gzipBlob(tarPath, p+".blob")
	case fmtEStargz:
		b, err = estargzBlob(ctx, tarPath, p+".blob")
	case fmtEStargzPri:
		var missed []string
		b, err = estargzBlob(ctx, tarPath, p+".blob", estargz.WithPrioritizedFiles(profile), estargz.WithAllowPrioritizeNotFound(&missed))
		b.Missed = len(missed)
	default:
		err = fmt.Errorf("no blob builder for %s", f)
	}
	if err != nil {
		os.Remove(p + ".blob")
		return layerBlob{}, stamp{}, err
	}
	if b.DiffID != digest.Digest(t.DiffID) && f == fmtGzip {
		return layerBlob{}, stamp{}, fmt.Errorf("gzip blob of %s has DiffID %s, the tar is %s", layer, b.DiffID, t.DiffID)
	}
	b.Stamp = stamp{Key: key, Seconds: time.Since(start).Seconds(), Built: time.Now(), Size: b.Size, Digest: b.Digest.String()}
	js, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return layerBlob{}, stamp{}, err
	}
	b.Path = p + ".blob"
	return b, b.Stamp, os.WriteFile(p+".json", append(js, '\n'), 0o644)
}

// gzipBlob compresses a tar at gzip's default level, as podman and docker push do.
func gzipBlob(tarPath, out string) (layerBlob, error) {
	in, err := os.Open(tarPath)
	if err != nil {
		return layerBlob{}, err
	}
	defer in.Close()
	f, err := os.Create(out)
	if err != nil {
		return layerBlob{}, err
	}
	defer f.Close()
	bh, th := sha256.New(), sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, bh)}
	zw, err := gzip.NewWriterLevel(cw, gzip.DefaultCompression)
	if err != nil {
		return layerBlob{}, err
	}
	if _, err := io.Copy(zw, io.TeeReader(in, th)); err != nil {
		return layerBlob{}, err
	}
	if err := zw.Close(); err != nil {
		return layerBlob{}, err
	}
	if err := f.Close(); err != nil {
		return layerBlob{}, err
	}
	return layerBlob{
		Digest:    digest.NewDigestFromBytes(digest.SHA256, bh.Sum(nil)),
		Size:      cw.n,
		MediaType: string(types.OCILayer),
		DiffID:    digest.NewDigestFromBytes(digest.SHA256, th.Sum(nil)),
	}, nil
}

// estargzBlob converts a tar with estargz.Build (its defaults unless opts: 4 MiB chunks,
// gzip level 9, one worker per CPU), with the annotations podman needs to look the layer up.
func estargzBlob(ctx context.Context, tarPath, out string, opts ...estargz.Option) (layerBlob, error) {
	in, err := os.Open(tarPath)
	if err != nil {
		return layerBlob{}, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return layerBlob{}, err
	}
	eb, err := estargz.Build(io.NewSectionReader(in, 0, fi.Size()), append(opts, estargz.WithContext(ctx))...)
	if err != nil {
		return layerBlob{}, err
	}
	defer eb.Close()
	f, err := os.Create(out)
	if err != nil {
		return layerBlob{}, err
	}
	defer f.Close()
	bh := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, bh), eb)
	if err != nil {
		return layerBlob{}, err
	}
	if err := f.Close(); err != nil {
		return layerBlob{}, err
	}
	usize, err := eb.UncompressedSize()
	if err != nil {
		return layerBlob{}, err
	}
	return layerBlob{
		Digest:    digest.NewDigestFromBytes(digest.SHA256, bh.Sum(nil)),
		Size:      n,
		MediaType: string(types.OCILayer),
		DiffID:    eb.DiffID(),
		Annotations: map[string]string{
			chunked.AnnotationStargzTOCDigest:  eb.TOCDigest().String(),
			chunked.AnnotationUncompressedSize: strconv.FormatInt(usize, 10),
		},
	}, nil
}

// buildImage makes an OCI image of the host's platform from blobs (bottom first) whose
// config runs cmd.
func buildImage(blobs []layerBlob, cmd []string) (v1.Image, error) {
	layers := make([]testregistry.ImageLayer, len(blobs))
	for i, b := range blobs {
		layers[i] = testregistry.ImageLayer{CompressedLayer: &fileLayer{b}, Annotations: b.Annotations}
	}
	return testregistry.ImageOf(layers, func(cf *v1.ConfigFile) {
		cf.OS, cf.Architecture = runtime.GOOS, runtime.GOARCH
		cf.Config.Cmd = cmd
		cf.Config.Env = imageEnv
		cf.Config.WorkingDir = "/"
	})
}

// fileLayer is a compressed layer blob on disk whose DiffID is known.
type fileLayer struct{ b layerBlob }

var _ partial.CompressedLayer = (*fileLayer)(nil)

func (l *fileLayer) Digest() (v1.Hash, error)            { return v1.NewHash(l.b.Digest.String()) }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.b.Path) }
func (l *fileLayer) Size() (int64, error)                { return l.b.Size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return types.MediaType(l.b.MediaType), nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return v1.NewHash(l.b.DiffID.String()) }
