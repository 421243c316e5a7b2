package e2e

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testfuse"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"

	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
)

// image is an image pushed for the tests, as the registry describes it for this host's platform.
type image struct {
	name    string
	ref     string                          // registry/repository:tag
	ref0    string                          // the image whose normal pull is the reference content
	layers  []digest.Digest                 // blob digests, bottom first
	lazy    map[digest.Digest]digest.Digest // lazily pullable layer blob -> its TOC digest
	modern  map[digest.Digest]bool          // lazy layers modern runtimes look up (by TOC digest)
	legacy  map[digest.Digest]bool          // lazy layers served to legacy runtimes (by blob digest)
	diffIDs []digest.Digest
}

// The images of the tests. Each lazy image has the content of its reference (ref0).
const (
	imgGzip         = "gzip"
	imgEStargz      = "estargz"
	imgStargzZstd   = "stargz-zstd"
	imgZstdLegacy   = "zstdchunked-legacy" // Debian's skopeo (c/storage 1.43)
	imgZstdModern   = "zstdchunked-modern" // the modern c/storage compressor
	imgWhiteoutGzip = "whiteout-gzip"
	imgWhiteout     = "whiteout" // upper layers whiteout and opaque-replace lower content
	imgIndex        = "multiarch"
	imgMixed        = "mixed" // a plain gzip base under a lazy layer
)

// lazyImages are the images every runtime pulls through the store.
var lazyImages = []string{imgEStargz, imgStargzZstd, imgZstdLegacy, imgZstdModern, imgWhiteout, imgIndex, imgMixed}

// tarEntry is one member of a test layer.
type tarEntry = testlayer.Entry

// rootfsLayers returns the test layers: a static busybox, the reference layer of the unit
// tests moved under /t (every kind of entry) with a large incompressible file, and the two
// layers of the whiteout image.
func rootfsLayers(busybox string) (base, content, lower, upper []byte, err error) {
	if base, err = baseLayer(busybox); err != nil {
		return nil, nil, nil, nil, err
	}
	dir, file := tarDir, tarFile

	es := []tarEntry{dir("t")}
	for _, e := range testlayer.Entries() {
		e.Header.Name = "t/" + e.Header.Name
		if e.Header.Typeflag == tar.TypeLink {
			e.Header.Linkname = "t/" + e.Header.Linkname
		}
		es = append(es, e)
	}
	random := make([]byte, 6<<20)
	rand.Read(random)
	content = testlayer.Build(append(es, file("t/random.bin", random)))

	lower = testlayer.Build([]tarEntry{dir("w"), file("w/a", []byte("a\n")), file("w/b", []byte("b\n")),
		dir("w/dir"), file("w/dir/x", []byte("x\n")), dir("w/dir/sub"), file("w/dir/sub/y", []byte("y\n"))})
	upper = testlayer.Build([]tarEntry{dir("w"), file("w/.wh.a", nil), dir("w/dir"),
		file("w/dir/.wh..wh..opq", nil), file("w/dir/z", []byte("z\n"))})
	return base, content, lower, upper, nil
}

// baseLayer returns the base layer of the test images: a static busybox as /bin/busybox and
// /bin/sh.
func baseLayer(busybox string) ([]byte, error) {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	exe := tarFile("bin/busybox", bb)
	exe.Header.Mode = 0o755
	sh := tarEntry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/sh", Linkname: "busybox", Mode: 0o777,
		ModTime: testlayer.Epoch, Format: tar.FormatPAX}}
	return testlayer.Build([]tarEntry{tarDir("bin"), exe, sh}), nil
}

// tarDir and tarFile are a directory and a regular file of a test layer.
func tarDir(n string) tarEntry {
	return tarEntry{Header: tar.Header{Typeflag: tar.TypeDir, Name: n + "/", Mode: 0o755, ModTime: testlayer.Epoch, Format: tar.FormatPAX}}
}

func tarFile(n string, data []byte) tarEntry {
	return tarEntry{Header: tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(data)),
		ModTime: testlayer.Epoch, Format: tar.FormatPAX}, Data: data}
}

// isStatic tells whether path is an ELF executable without an interpreter, as the images need.
func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

type layerMaker func(name string, tarStream []byte) (testregistry.LayerBlob, error)

func gzipLayer(_ string, t []byte) (testregistry.LayerBlob, error) { return testregistry.GzipLayer(t) }

func stargzLayer(opts ...estargz.Option) layerMaker {
	return func(name string, t []byte) (testregistry.LayerBlob, error) {
		f, err := testlayer.BuildEStargz(name, t, opts...)
		if err != nil {
			return testregistry.LayerBlob{}, err
		}
		return testregistry.LayerBlob{Blob: f.Blob, MediaType: f.Desc.MediaType, Annotations: f.Desc.Annotations, DiffID: f.DiffID}, nil
	}
}

// builder pushes the test images.
type builder struct {
	dir     string
	env     []string // for skopeo and the harness: registries.conf marking the registries insecure
	harness string
}

// pushAll builds every test image and pushes it to reg under e2e/NAME:v1.
func (b *builder) pushAll(ctx context.Context, reg *dockerregistry.Registry, busybox string) (map[string]*image, error) {
	base, content, lower, upper, err := rootfsLayers(busybox)
	if err != nil {
		return nil, err
	}
	host := v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
	layers := func(kind string, mk layerMaker, tars ...[]byte) ([]testregistry.LayerBlob, error) {
		var ls []testregistry.LayerBlob
		for i, t := range tars {
			l, err := mk(fmt.Sprintf("%s-layer%d", kind, i), t)
			if err != nil {
				return nil, err
			}
			ls = append(ls, l)
		}
		return ls, nil
	}
	images := map[string]*image{}
	push := func(label string, p ...testregistry.Platform) error {
		ref := reg.Host + "/e2e/" + label + ":v1"
		r, err := name.ParseReference(ref, name.Insecure)
		if err != nil {
			return err
		}
		if len(p) == 1 {
			img, err := testregistry.Image(p[0])
			if err != nil {
				return err
			}
			err = remote.Write(r, img, remote.WithContext(ctx))
		} else {
			idx, err := testregistry.Index(p)
			if err != nil {
				return err
			}
			err = remote.WriteIndex(r, idx, remote.WithContext(ctx))
		}
		return err
	}
	plat := func(ls []testregistry.LayerBlob) testregistry.Platform {
		return testregistry.Platform{OS: host.OS, Architecture: host.Architecture, Layers: ls}
	}
	specs := []struct {
		name  string
		mk    layerMaker
		tars  [][]byte
		other bool // also an arm64 (or amd64) image in an index
	}{
		{imgGzip, gzipLayer, [][]byte{base, content}, false},
		{imgEStargz, stargzLayer(), [][]byte{base, content}, false},
		{imgStargzZstd, stargzLayer(estargz.WithCompression(testlayer.StargzZstd())), [][]byte{base, content}, false},
		{imgWhiteoutGzip, gzipLayer, [][]byte{base, lower, upper}, false},
		{imgWhiteout, stargzLayer(), [][]byte{base, lower, upper}, false},
		{imgIndex, stargzLayer(), [][]byte{base, content}, true},
	}
	for _, s := range specs {
		ls, err := layers(s.name, s.mk, s.tars...)
		if err != nil {
			return nil, err
		}
		ps := []testregistry.Platform{plat(ls)}
		if s.other {
			other, err := layers(s.name, s.mk, testlayer.Build([]tarEntry{{Header: tar.Header{Typeflag: tar.TypeReg,
				Name: "other-platform", Mode: 0o644, Size: 6, ModTime: testlayer.Epoch, Format: tar.FormatPAX}, Data: []byte("other\n")}}))
			if err != nil {
				return nil, err
			}
			p := plat(other)
			p.Architecture = map[string]string{"amd64": "arm64"}[host.Architecture]
			if p.Architecture == "" {
				p.Architecture = "amd64"
			}
			ps = append(ps, p)
		}
		if err := push(s.name, ps...); err != nil {
			return nil, fmt.Errorf("push %s: %w", s.name, err)
		}
	}
	gz, err := layers("gzip", gzipLayer, base)
	if err != nil {
		return nil, err
	}
	sg, err := layers("estargz", stargzLayer(), content)
	if err != nil {
		return nil, err
	}
	if err := push(imgMixed, plat(append(gz, sg...))); err != nil {
		return nil, err
	}

	// zstd:chunked by the real producers, from an OCI layout of the gzip image.
	src, err := b.ociLayout(reg.Host + "/e2e/" + imgGzip + ":v1")
	if err != nil {
		return nil, err
	}
	if err := b.skopeoZstdChunked(ctx, src, "docker://"+reg.Host+"/e2e/"+imgZstdLegacy+":v1"); err != nil {
		return nil, err
	}
	if out, err := run(ctx, b.env, b.harness, "convert", "--compress", "zstd:chunked", src, "docker://"+reg.Host+"/e2e/"+imgZstdModern+":v1"); err != nil {
		return nil, fmt.Errorf("harness convert: %v\n%s", err, out)
	}

	for _, n := range append([]string{imgGzip, imgWhiteoutGzip}, lazyImages...) {
		ref0 := imgGzip
		if strings.HasPrefix(n, "whiteout") {
			ref0 = imgWhiteoutGzip
		}
		img, err := describe(ctx, n, reg.Host+"/e2e/"+n+":v1", nil)
		if err != nil {
			return nil, err
		}
		img.ref0 = ref0
		images[n] = img
	}
	return images, nil
}

// ociLayout writes the image at ref to an OCI layout and returns its c/image reference.
func (b *builder) ociLayout(ref string) (string, error) {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return "", err
	}
	img, err := remote.Image(r)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(b.dir, "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		return "", err
	}
	return "oci:" + dir + ":v1", nil
}

// skopeoZstdChunked converts with Debian's skopeo, which writes the legacy zstd:chunked format.
// c/image 5.23 would reuse a blob recorded in its cache in another compression, so skopeo runs
// in a private mount namespace with an empty /var/lib/containers (and none of the FUSE mounts
// of tests running beside, which it would keep alive: DetachScript).
func (b *builder) skopeoZstdChunked(ctx context.Context, src, dst string) error {
	// Where /var/lib/containers does not exist yet (no container tool ran), an empty /var/lib
	// stands in for the namespace's life: the host's is left as it is.
	script := testfuse.DetachScript() + `{ [ -d /var/lib/containers ] || { mount -t tmpfs layerstore-e2e /var/lib && mkdir /var/lib/containers; }; } && ` +
		`mount -t tmpfs layerstore-e2e /var/lib/containers && exec skopeo copy --dest-tls-verify=false --dest-compress --dest-compress-format zstd:chunked "$0" "$1"`
	out, err := run(ctx, b.env, "unshare", "--mount", "--propagation", "private", "sh", "-c", script, src, dst)
	if err != nil {
		return fmt.Errorf("skopeo: %v\n%s", err, out)
	}
	return nil
}

// describe reads what the registry says of ref for this host's platform.
func describe(ctx context.Context, label, ref string, auth authn.Authenticator) (*image, error) {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return nil, err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH})}
	if auth != nil {
		opts = append(opts, remote.WithAuth(auth))
	}
	img, err := remote.Image(r, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	out := &image{name: label, ref: ref, lazy: map[digest.Digest]digest.Digest{}, modern: map[digest.Digest]bool{}, legacy: map[digest.Digest]bool{}}
	for i, l := range m.Layers {
		d := digest.Digest(l.Digest.String())
		out.layers = append(out.layers, d)
		out.diffIDs = append(out.diffIDs, digest.Digest(cf.RootFS.DiffIDs[i].String()))
		// Modern runtimes look up only the annotations of current producers; the legacy
		// zstd:chunked one is served to legacy runtimes, which look up every layer.
		for _, k := range []string{chunked.AnnotationStargzTOCDigest, chunked.AnnotationChecksum, chunked.AnnotationLegacyChecksum} {
			if toc := l.Annotations[k]; toc != "" {
				out.lazy[d] = digest.Digest(toc)
				out.modern[d] = k != chunked.AnnotationLegacyChecksum
				// Legacy runtimes need the tar's size, known from a tar-split or an annotation.
				out.legacy[d] = l.Annotations[chunked.AnnotationTarSplitPosition] != "" || l.Annotations[chunked.AnnotationUncompressedSize] != ""
			}
		}
	}
	return out, nil
}

// run runs a command, bounded in time, and returns its combined output.
func run(ctx context.Context, env []string, name string, args ...string) (string, error) {
	stdout, _, err := output(ctx, env, true, name, args...)
	return stdout, err
}

// output runs a command, bounded in time, and returns its stdout and stderr; with combined,
// stderr goes to stdout too.
func output(ctx context.Context, env []string, combined bool, name string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if combined {
		cmd.Stderr = &stdout
	}
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}
