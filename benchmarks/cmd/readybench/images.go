package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/benchmarks/internal/harness"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// imageCache owns the -images directory: the root filesystems, layer tars, file profiles and
// layer blobs of every format, and the registry's storage holding the pushed images. Each
// step is redone only when its recipe changed or its output is missing.
//
//	rootfs/<layer>/       the tree (the base system, or what apt-get added)
//	layers/<layer>.tar    the layer's tar
//	profiles/<image>.txt  the files the workload opens, in order
//	blobs/                one compressed blob per layer and format
//	registry/             docker-registry's storage
//	build.log             output of debootstrap, apt-get, strace, the harness
type imageCache struct {
	dir     string
	modDir  string // the layerstore module, for building the e2e harness
	binDir  string // where the harness binary goes
	steps   []buildStep
	cat     catalogue
	need    needSet // what ensure built and pushed in this run
	harness string
}

// buildStep is one step of making the images, for the report.
type buildStep struct {
	What    string
	Seconds float64
	Built   time.Time // when it ran; before this run means it came from the cache
	Cached  bool
}

// catalogue describes the pushed images; it is written to the cache as catalogue.json.
type catalogue struct {
	Layers map[string]layerTar                `json:"layers"`
	Images map[string]map[string]*pushedImage `json:"images"` // image, format
}

// layerTar is a layer's uncompressed tar.
type layerTar struct {
	Size    int64  `json:"size"`
	DiffID  string `json:"diffID"`
	Entries int    `json:"entries"`
}

// pushedImage is one image in one format on the registry.
type pushedImage struct {
	Repo     string        `json:"repo"` // repository:tag, without the host
	Manifest digest.Digest `json:"manifest"`
	Layers   []pushedLayer `json:"layers"`
	From     digest.Digest `json:"from,omitempty"` // zstd:chunked: the gzip manifest it was converted from
}

// pushedLayer is a layer as the manifest describes it.
type pushedLayer struct {
	Digest    digest.Digest `json:"digest"`
	Size      int64         `json:"size"`
	MediaType string        `json:"mediaType"`
	TOC       digest.Digest `json:"toc,omitempty"` // set for lazily pullable layers
}

func (p *pushedImage) compressed() int64 {
	var n int64
	for _, l := range p.Layers {
		n += l.Size
	}
	return n
}

func (c *imageCache) step(what string, s stamp, start time.Time) {
	c.steps = append(c.steps, buildStep{What: what, Seconds: s.Seconds, Built: s.Built, Cached: s.Built.Before(start)})
}

// imageFormat is an image in one format, as the registry holds it (bench/<image>:<format>).
type imageFormat struct{ image, format string }

// madeFrom names the format a format is made from on the registry: zstd:chunked is a
// conversion of the pushed gzip image. The other formats are made from the layer tars.
var madeFrom = map[string]string{fmtZstd: fmtGzip}

// needSet is what ensure builds and pushes: images in formats.
type needSet map[imageFormat]bool

// needed is the set of images and formats the cells pull, with the formats those are made
// from. A cell uses nothing else, whatever its mode and cache: a full or lazy pull is of its
// own image in its own format, a warm store cache is filled by a run of that same pull, and a
// warm full pull reads that image's blobs on the registry's side.
func needed(cells []cell) needSet {
	need := needSet{}
	for _, c := range cells {
		for f := c.format; f != ""; f = madeFrom[f] {
			need[imageFormat{c.image.name, f}] = true
		}
	}
	return need
}

// formats lists the formats of image in the set, in allFormats order (a format after the
// one it is made from).
func (n needSet) formats(image string) []string {
	var out []string
	for _, f := range allFormats {
		if n[imageFormat{image, f}] {
			out = append(out, f)
		}
	}
	return out
}

// images lists the images with a format in the set, in imageSpecs order.
func (n needSet) images() []imageSpec {
	var out []imageSpec
	for _, img := range imageSpecs {
		if len(n.formats(img.name)) > 0 {
			out = append(out, img)
		}
	}
	return out
}

// layers lists the layer recipes the set's images are built from, their parents included,
// in layerRecipes order (parents first).
func (n needSet) layers() []string {
	want := map[string]bool{}
	for _, img := range n.images() {
		for _, l := range img.layers {
			for _, p := range chain(l) {
				want[p] = true
			}
		}
	}
	var out []string
	for _, r := range layerRecipes {
		if want[r.name] {
			out = append(out, r.name)
		}
	}
	return out
}

// ensure builds what is missing for the images and formats in need (and nothing else: no
// layer, profile or blob of an image or format outside it) and pushes them to reg.
func (c *imageCache) ensure(ctx context.Context, reg *dockerregistry.Registry, need needSet) error {
	start := time.Now()
	c.need = need
	for _, d := range []string{"rootfs", "layers", "profiles", "blobs"} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o755); err != nil {
			return err
		}
	}
	c.cat = catalogue{Layers: map[string]layerTar{}, Images: map[string]map[string]*pushedImage{}}
	if b, err := os.ReadFile(filepath.Join(c.dir, "catalogue.json")); err == nil {
		var old catalogue
		if json.Unmarshal(b, &old) == nil && old.Images != nil {
			c.cat.Images = old.Images
		}
	}
	for _, name := range need.layers() {
		r, _ := recipeByName(name)
		if r.generate != nil {
			t, s, err := c.writeTar(r.name, r.key(), r.generate)
			if err != nil {
				return fmt.Errorf("layer %s: %w", r.name, err)
			}
			c.cat.Layers[r.name] = t
			c.step(fmt.Sprintf("layer %s: generated tar (%s, %d entries)", r.name, mb(t.Size), t.Entries), s, start)
			continue
		}
		s, err := c.buildRootfs(ctx, r)
		if err != nil {
			return fmt.Errorf("layer %s: %w", r.name, err)
		}
		what := "apt-get install " + strings.Join(r.packages, " ")
		if r.parent == "" {
			what = "debootstrap --variant=minbase " + suite
		}
		c.step(fmt.Sprintf("layer %s: %s", r.name, what), s, start)
		t, s, err := c.layerTar(r)
		if err != nil {
			return fmt.Errorf("layer %s: %w", r.name, err)
		}
		c.cat.Layers[r.name] = t
		c.step(fmt.Sprintf("layer %s: tar (%s, %d entries)", r.name, mb(t.Size), t.Entries), s, start)
	}
	for _, img := range need.images() {
		formats := need.formats(img.name)
		var files []string // the profile, for estargz-prio only
		if slices.Contains(formats, fmtEStargzPri) {
			var s stamp
			var err error
			if files, s, err = c.recordProfile(ctx, img); err != nil {
				return err
			}
			c.step(fmt.Sprintf("image %s: strace profile (%d files)", img.name, len(files)), s, start)
		}
		if c.cat.Images[img.name] == nil {
			c.cat.Images[img.name] = map[string]*pushedImage{}
		}
		for _, f := range formats {
			if f == fmtZstd {
				if err := c.zstdChunked(ctx, reg, img, start); err != nil {
					return err
				}
				continue
			}
			var blobs []layerBlob
			for _, l := range img.layers {
				b, s, err := c.layerBlob(ctx, l, f, img.name, files)
				if err != nil {
					return fmt.Errorf("%s %s %s: %w", img.name, l, f, err)
				}
				c.step(fmt.Sprintf("image %s: layer %s as %s (%s)", img.name, l, f, mb(b.Size)), s, start)
				blobs = append(blobs, b)
			}
			p, err := c.push(ctx, reg, img, f, blobs)
			if err != nil {
				return fmt.Errorf("pushing %s as %s: %w", img.name, f, err)
			}
			c.cat.Images[img.name][f] = p
		}
		if err := c.writeCatalogue(); err != nil { // after each image: a failed run keeps what it pushed
			return err
		}
	}
	return nil
}

func (c *imageCache) writeCatalogue() error {
	b, err := json.MarshalIndent(c.cat, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.dir, "catalogue.json"), append(b, '\n'), 0o644)
}

// layerTar writes the tar of layer r once its tree is built.
func (c *imageCache) layerTar(r layerRecipe) (layerTar, stamp, error) {
	rs, ok := readStamp(filepath.Join(c.dir, "rootfs", r.name+".json"), r.key())
	if !ok {
		return layerTar{}, stamp{}, errors.New("tree not built")
	}
	root := filepath.Join(c.dir, "rootfs", r.name)
	return c.writeTar(r.name, r.key()+" "+rs.Built.UTC().Format(time.RFC3339Nano), func(w io.Writer) (int64, string, int, error) {
		return writeLayerTar(w, root, map[string]bool{"dev": true, "proc": true, "sys": true})
	})
}

// writeTar writes layers/<name>.tar with write, unless its stamp says it was written from key.
func (c *imageCache) writeTar(name, key string, write func(io.Writer) (size int64, diffID string, entries int, err error)) (layerTar, stamp, error) {
	p := filepath.Join(c.dir, "layers", name+".tar")
	if s, ok := readStamp(p+".json", key); ok {
		if fi, err := os.Stat(p); err == nil && fi.Size() == s.Size {
			return layerTar{Size: s.Size, DiffID: s.Digest, Entries: s.Files}, s, nil
		}
	}
	fmt.Fprintf(os.Stderr, "writing the tar of layer %s\n", name)
	start := time.Now()
	f, err := os.Create(p)
	if err != nil {
		return layerTar{}, stamp{}, err
	}
	size, diffID, n, err := write(f)
	if err == nil {
		err = f.Close()
	} else {
		f.Close()
	}
	if err != nil {
		os.Remove(p)
		return layerTar{}, stamp{}, err
	}
	s := stamp{Key: key, Seconds: time.Since(start).Seconds(), Built: time.Now(), Size: size, Digest: diffID, Files: n}
	return layerTar{Size: size, DiffID: diffID, Entries: n}, s, writeStamp(p+".json", s)
}

// push writes img in format f, made of blobs, to the registry as bench/<image>:<format>.
func (c *imageCache) push(ctx context.Context, reg *dockerregistry.Registry, img imageSpec, f string, blobs []layerBlob) (*pushedImage, error) {
	repo := "bench/" + img.name + ":" + f
	i, err := buildImage(blobs, img.cmd)
	if err != nil {
		return nil, err
	}
	ref, err := name.ParseReference(reg.Host+"/"+repo, name.Insecure)
	if err != nil {
		return nil, err
	}
	if err := remote.Write(ref, i, remote.WithContext(ctx)); err != nil {
		return nil, err
	}
	return describe(ctx, reg, repo)
}

// zstdChunked converts the gzip image to zstd:chunked with the e2e harness (the current
// c/storage compressor), unless the registry holds a conversion of the same gzip image.
func (c *imageCache) zstdChunked(ctx context.Context, reg *dockerregistry.Registry, img imageSpec, start time.Time) error {
	if !c.need[imageFormat{img.name, fmtGzip}] {
		return fmt.Errorf("%s: zstd:chunked is converted from the gzip image, which is not built in this run", img.name)
	}
	return c.convertZstd(ctx, reg, img, fmtGzip, fmtZstd, start)
}

// convertZstd converts img as catalogued under the key (and tag) from to zstd:chunked,
// pushed and catalogued as to, unless the registry holds a conversion of the same image.
func (c *imageCache) convertZstd(ctx context.Context, reg *dockerregistry.Registry, img imageSpec, from, to string, start time.Time) error {
	src := c.cat.Images[img.name][from]
	if src == nil {
		return fmt.Errorf("%s: no %s image to convert to zstd:chunked", img.name, from)
	}
	repo := "bench/" + img.name + ":" + to
	if old := c.cat.Images[img.name][to]; old != nil && old.From == src.Manifest {
		if p, err := describe(ctx, reg, repo); err == nil && p.Manifest == old.Manifest {
			return nil
		}
	}
	if c.harness == "" {
		if err := c.buildHarness(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "converting %s:%s to zstd:chunked (e2e harness)\n", img.name, from)
	t0 := time.Now()
	regConf := filepath.Join(c.binDir, "registries.conf")
	if err := os.WriteFile(regConf, []byte(testregistry.RegistriesConf(reg.Host)), 0o644); err != nil {
		return err
	}
	logPath := filepath.Join(c.dir, "build.log")
	cmd := []string{c.harness, "convert", "--timeout", "30m", "--compress", "zstd:chunked", "--src-tls-verify=false", "--dest-tls-verify=false",
		"docker://" + reg.Host + "/" + src.Repo, "docker://" + reg.Host + "/" + repo}
	if err := command(ctx, logPath, "env", append([]string{"CONTAINERS_REGISTRIES_CONF=" + regConf}, cmd...)...); err != nil {
		return fmt.Errorf("zstd:chunked conversion of %s:%s: %w", img.name, from, err)
	}
	p, err := describe(ctx, reg, repo)
	if err != nil {
		return err
	}
	p.From = src.Manifest
	c.cat.Images[img.name][to] = p
	c.step(fmt.Sprintf("image %s: zstd:chunked conversion of %s (harness convert)", img.name, from),
		stamp{Seconds: time.Since(t0).Seconds(), Built: time.Now()}, start)
	return nil
}

func (c *imageCache) buildHarness(ctx context.Context) error {
	fmt.Fprintln(os.Stderr, "building the e2e harness (c/image, c/storage)")
	c.harness = filepath.Join(c.binDir, "harness")
	if err := harness.Build(ctx, c.modDir, c.harness); err != nil {
		c.harness = ""
		return err
	}
	return nil
}

// describe reads what the registry says of repo for this host's platform.
func describe(ctx context.Context, reg *dockerregistry.Registry, repo string) (*pushedImage, error) {
	ref, err := name.ParseReference(reg.Host+"/"+repo, name.Insecure)
	if err != nil {
		return nil, err
	}
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}))
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	h, err := img.Digest()
	if err != nil {
		return nil, err
	}
	p := &pushedImage{Repo: repo, Manifest: digest.Digest(h.String())}
	for _, l := range m.Layers {
		pl := pushedLayer{Digest: digest.Digest(l.Digest.String()), Size: l.Size, MediaType: string(l.MediaType)}
		for _, k := range []string{chunked.AnnotationStargzTOCDigest, chunked.AnnotationChecksum} {
			if toc := l.Annotations[k]; toc != "" {
				pl.TOC = digest.Digest(toc)
			}
		}
		p.Layers = append(p.Layers, pl)
	}
	return p, nil
}

// uncompressed is the size of img's layer tars.
func (c *imageCache) uncompressed(img imageSpec) int64 {
	var n int64
	for _, l := range img.layers {
		n += c.cat.Layers[l].Size
	}
	return n
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
