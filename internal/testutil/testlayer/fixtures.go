package testlayer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/containerd/stargz-snapshotter/estargz/zstdchunked"
	"github.com/klauspost/compress/zstd"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/demo"
	digest "github.com/opencontainers/go-digest"
)

// Fixture is a layer blob made by a real producer from the reference layer.
type Fixture struct {
	Name   string
	Blob   []byte
	Desc   chunked.Descriptor
	DiffID digest.Digest
	Format chunked.Format
}

// committed lists the fixtures generated once by producers that are not dependencies of the
// module (see chunked/testdata/gen).
var committed = map[string]chunked.Format{
	"zstdchunked-modern":     chunked.ZstdChunked,
	"zstdchunked-notarsplit": chunked.ZstdChunked,
	"zstdchunked-legacy":     chunked.ZstdChunkedLegacy,
}

// FixtureDir returns the directory of the committed fixtures, in the source tree this file
// is in (below the module's internal/).
func FixtureDir() string {
	_, file, _, _ := runtime.Caller(0)
	root := file[:strings.LastIndex(file, string(filepath.Separator)+"internal"+string(filepath.Separator))]
	return filepath.Join(root, "chunked", "testdata", "fixtures")
}

// Fixtures returns every fixture: the committed zstd:chunked ones and eStargz variants built
// now with estargz.Build.
func Fixtures() ([]Fixture, error) {
	var fs []Fixture
	for _, name := range []string{"zstdchunked-modern", "zstdchunked-notarsplit", "zstdchunked-legacy"} {
		f, err := LoadFixture(filepath.Join(FixtureDir(), name))
		if err != nil {
			return nil, err
		}
		f.Format = committed[name]
		fs = append(fs, f)
	}
	tarBlob := Tar()
	for _, v := range []struct {
		name   string
		format chunked.Format
		opts   []estargz.Option
	}{
		{"estargz", chunked.EStargz, nil},
		{"estargz-prioritized", chunked.EStargz, []estargz.Option{estargz.WithPrioritizedFiles([]string{"usr/bin/tool", "etc/hostname"})}},
		{"estargz-minchunk", chunked.EStargz, []estargz.Option{estargz.WithMinChunkSize(16 << 10)}},
		{"estargz-zstd", chunked.StargzZstd, []estargz.Option{estargz.WithCompression(StargzZstd())}},
	} {
		f, err := BuildEStargz(v.name, tarBlob, v.opts...)
		if err != nil {
			return nil, err
		}
		f.Format = v.format
		fs = append(fs, f)
	}
	// stargz-flavoured zstd with the legacy checksum annotations, as ctr-remote writes it.
	meta := map[string]string{}
	f, err := BuildEStargz("estargz-zstd-annotated", tarBlob, estargz.WithCompression(zstdCompression{&zstdchunked.Compressor{CompressionLevel: zstd.SpeedDefault, Metadata: meta}, &zstdchunked.Decompressor{}}))
	if err != nil {
		return nil, err
	}
	for k, v := range meta {
		f.Desc.Annotations[k] = v
	}
	f.Format = chunked.StargzZstd
	return append(fs, f), nil
}

// BuildEStargz converts a tar stream with estargz.Build (see demo.EStargz); a name containing
// "zstd" gives the zstd layer media type.
func BuildEStargz(name string, tarBlob []byte, opts ...estargz.Option) (Fixture, error) {
	l, err := demo.EStargz(tarBlob, opts...)
	if err != nil {
		return Fixture{}, fmt.Errorf("%s: %w", name, err)
	}
	if strings.Contains(name, "zstd") {
		l.MediaType = "application/vnd.oci.image.layer.v1.tar+zstd"
	}
	return Fixture{
		Name:   name,
		Blob:   l.Blob,
		Desc:   chunked.Descriptor{MediaType: l.MediaType, Digest: l.Digest(), Size: int64(len(l.Blob)), Annotations: l.Annotations},
		DiffID: l.DiffID,
	}, nil
}

// LoadFixture reads a committed fixture directory (blob, descriptor.json, diffid).
func LoadFixture(dir string) (Fixture, error) {
	blob, err := os.ReadFile(filepath.Join(dir, "blob"))
	if err != nil {
		return Fixture{}, err
	}
	var d struct {
		MediaType   string            `json:"mediaType"`
		Digest      digest.Digest     `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations"`
	}
	js, err := os.ReadFile(filepath.Join(dir, "descriptor.json"))
	if err != nil {
		return Fixture{}, err
	}
	if err := json.Unmarshal(js, &d); err != nil {
		return Fixture{}, fmt.Errorf("%s: %w", dir, err)
	}
	diffID, err := os.ReadFile(filepath.Join(dir, "diffid"))
	if err != nil {
		return Fixture{}, err
	}
	return Fixture{
		Name:   filepath.Base(dir),
		Blob:   blob,
		Desc:   chunked.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size, Annotations: d.Annotations},
		DiffID: digest.Digest(strings.TrimSpace(string(diffID))),
	}, nil
}

// Decompress returns the tar stream a fixture's blob decompresses to.
func (f Fixture) Decompress() ([]byte, error) {
	if f.Format == chunked.EStargz {
		return gunzipAll(f.Blob)
	}
	d, err := zstd.NewReader(bytes.NewReader(f.Blob))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return io.ReadAll(d)
}

func gunzipAll(b []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

// StargzZstd is the compression of stargz-snapshotter's zstd flavour of eStargz, for
// estargz.WithCompression.
func StargzZstd() estargz.Compression {
	return zstdCompression{&zstdchunked.Compressor{CompressionLevel: zstd.SpeedDefault}, &zstdchunked.Decompressor{}}
}

// zstdCompression pairs the stargz zstd compressor with its decompressor, as estargz.Build
// wants them.
type zstdCompression struct {
	*zstdchunked.Compressor
	*zstdchunked.Decompressor
}
