package main

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/benchmarks/internal/harness"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// Formats of the soak's images.
const (
	fmtEStargz = "estargz"
	fmtZstd    = "zstd:chunked"
	fmtGzip    = "gzip" // the source of the zstd:chunked conversion; not soaked
)

// workload prints the sha256 of every regular file under /data, sorted by path, with the
// image's own busybox; pipefail: a failed find or sort fails the container too.
const workload = `set -o pipefail; cd /data && /bin/busybox find . -type f | /bin/busybox sort | /bin/busybox xargs -r /bin/busybox sha256sum`

// content is the data layer of a family of images: files of random bytes under /data.
type content struct {
	Name  string
	Files int
	Bytes int64
	tar   []byte
	// Expected is what workload prints for it.
	Expected string
}

// soakImage is one image on the registry.
type soakImage struct {
	Content  *content
	Format   string
	Repo     string // "soak/a-estargz"
	Ref      string // registry/repo:v1
	Manifest digest.Digest
	Config   digest.Digest
	Layers   []v1.Descriptor
	// Reference is the workload's output in a container of this image pulled normally.
	Reference string
}

func (i *soakImage) Name() string { return i.Content.Name + " " + i.Format }

// lazyLayers counts the layers a store can serve (those with a TOC annotation).
func (i *soakImage) lazyLayers() int {
	n := 0
	for _, l := range i.Layers {
		for _, k := range []string{chunked.AnnotationStargzTOCDigest, chunked.AnnotationChecksum} {
			if l.Annotations[k] != "" {
				n++
				break
			}
		}
	}
	return n
}

func (i *soakImage) compressed() int64 {
	var n int64
	for _, l := range i.Layers {
		n += l.Size
	}
	return n
}

// makeContent generates the data layer of family name: files files under /data/dNN/, 80% of
// them of 1-64 KiB and 20% of 64 KiB to maxSize (sizes log-uniform), random bytes, all from
// seed.
func makeContent(name string, files int, maxSize int64, seed uint64) *content {
	rnd := rand.New(rand.NewPCG(seed, 0xda7a))
	fill := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), 's', 'o', 'a', 'k'})
	logUniform := func(lo, hi int64) int64 {
		if hi <= lo {
			return lo
		}
		return int64(math.Exp(math.Log(float64(lo)) + rnd.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
	}
	c := &content{Name: name, Files: files}
	es := []testlayer.Entry{tarDir("data")}
	dirs := max(1, files/25)
	for d := range dirs {
		es = append(es, tarDir(fmt.Sprintf("data/d%02d", d)))
	}
	var lines []string
	for i := range files {
		size := logUniform(1<<10, 64<<10)
		if rnd.IntN(5) == 0 {
			size = logUniform(64<<10, maxSize)
		}
		data := make([]byte, size)
		_, _ = fill.Read(data)
		p := fmt.Sprintf("data/d%02d/f%03d", i%dirs, i)
		es = append(es, tarFile(p, data))
		sum := sha256.Sum256(data)
		lines = append(lines, hex.EncodeToString(sum[:])+"  ./"+strings.TrimPrefix(p, "data/"))
		c.Bytes += size
	}
	// busybox sort compares bytes; so does slices.Sort on the paths, which start each line
	// after the 64 hex digits and two spaces.
	slices.SortFunc(lines, func(a, b string) int { return strings.Compare(a[66:], b[66:]) })
	c.Expected = strings.Join(lines, "\n") + "\n"
	c.tar = testlayer.Build(es)
	return c
}

// baseLayer is a static busybox as /bin/busybox and /bin/sh.
func baseLayer(busybox string) ([]byte, error) {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	exe := tarFile("bin/busybox", bb)
	exe.Header.Mode = 0o755
	sh := testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/sh", Linkname: "busybox", Mode: 0o777,
		ModTime: testlayer.Epoch, Format: tar.FormatPAX}}
	return testlayer.Build([]testlayer.Entry{tarDir("bin"), exe, sh}), nil
}

func tarDir(n string) testlayer.Entry {
	return testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: n + "/", Mode: 0o755, ModTime: testlayer.Epoch, Format: tar.FormatPAX}}
}

func tarFile(n string, data []byte) testlayer.Entry {
	return testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(data)),
		ModTime: testlayer.Epoch, Format: tar.FormatPAX}, Data: data}
}

// pushImages builds and pushes, for every content, an eStargz image (estargz.Build, 64 KiB
// chunks) and a zstd:chunked one (the e2e harness converting a gzip image, i.e. the current
// c/storage compressor, with a tar-split), both over the busybox base layer.
func pushImages(ctx context.Context, reg *dockerregistry.Registry, modDir, dir, busybox string, contents []*content) ([]*soakImage, error) {
	base, err := baseLayer(busybox)
	if err != nil {
		return nil, err
	}
	push := func(repo string, ls []testregistry.LayerBlob) error {
		img, err := testregistry.Image(testregistry.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH, Layers: ls})
		if err != nil {
			return err
		}
		r, err := name.ParseReference(reg.Host+"/"+repo+":v1", name.Insecure)
		if err != nil {
			return err
		}
		return remote.Write(r, img, remote.WithContext(ctx))
	}
	harnessBin := filepath.Join(dir, "harness")
	fmt.Fprintln(os.Stderr, "building the e2e harness (zstd:chunked conversions)")
	if err := harness.Build(ctx, modDir, harnessBin); err != nil {
		return nil, err
	}
	regConf := filepath.Join(dir, "harness-registries.conf")
	if err := os.WriteFile(regConf, []byte(testregistry.RegistriesConf(reg.Host)), 0o644); err != nil {
		return nil, err
	}
	var out []*soakImage
	for _, c := range contents {
		fmt.Fprintf(os.Stderr, "building image %s (%d files, %.1f MB)\n", c.Name, c.Files, float64(c.Bytes)/1e6)
		var es []testregistry.LayerBlob
		for i, t := range [][]byte{base, c.tar} {
			f, err := testlayer.BuildEStargz(fmt.Sprintf("%s-layer%d", c.Name, i), t)
			if err != nil {
				return nil, err
			}
			es = append(es, testregistry.LayerBlob{Blob: f.Blob, MediaType: f.Desc.MediaType, Annotations: f.Desc.Annotations, DiffID: f.DiffID})
		}
		if err := push("soak/"+c.Name+"-estargz", es); err != nil {
			return nil, fmt.Errorf("push %s eStargz: %w", c.Name, err)
		}
		var gz []testregistry.LayerBlob
		for _, t := range [][]byte{base, c.tar} {
			b, err := testregistry.GzipLayer(t)
			if err != nil {
				return nil, err
			}
			gz = append(gz, b)
		}
		if err := push("soak/"+c.Name+"-gzip", gz); err != nil {
			return nil, fmt.Errorf("push %s gzip: %w", c.Name, err)
		}
		src, dst := "docker://"+reg.Host+"/soak/"+c.Name+"-gzip:v1", "docker://"+reg.Host+"/soak/"+c.Name+"-zstdchunked:v1"
		if out, err := command(ctx, []string{"CONTAINERS_REGISTRIES_CONF=" + regConf}, harnessBin, "convert", "--timeout", "10m",
			"--compress", "zstd:chunked", "--src-tls-verify=false", "--dest-tls-verify=false", src, dst); err != nil {
			return nil, fmt.Errorf("zstd:chunked conversion of %s: %v\n%s", c.Name, err, out)
		}
		for _, f := range []struct{ format, repo string }{{fmtEStargz, "-estargz"}, {fmtZstd, "-zstdchunked"}} {
			img := &soakImage{Content: c, Format: f.format, Repo: "soak/" + c.Name + f.repo}
			img.Ref = reg.Host + "/" + img.Repo + ":v1"
			if err := describe(ctx, img); err != nil {
				return nil, err
			}
			if img.lazyLayers() != len(img.Layers) {
				return nil, fmt.Errorf("%s: %d of its %d layers lazily pullable", img.Name(), img.lazyLayers(), len(img.Layers))
			}
			out = append(out, img)
		}
		c.tar = nil
	}
	return out, nil
}

// describe reads the image's manifest from the registry.
func describe(ctx context.Context, img *soakImage) error {
	r, err := name.ParseReference(img.Ref, name.Insecure)
	if err != nil {
		return err
	}
	ri, err := remote.Image(r, remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}))
	if err != nil {
		return fmt.Errorf("%s: %w", img.Ref, err)
	}
	m, err := ri.Manifest()
	if err != nil {
		return err
	}
	h, err := ri.Digest()
	if err != nil {
		return err
	}
	img.Manifest, img.Config, img.Layers = digest.Digest(h.String()), digest.Digest(m.Config.Digest.String()), m.Layers
	return nil
}
