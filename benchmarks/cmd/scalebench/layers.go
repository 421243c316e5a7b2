package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/benchmarks/internal/harness"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// Layer formats built here.
const (
	formatEStargz     = "estargz"      // estargz.Build defaults: gzip level 9, 4 MiB chunks
	formatZstdChunked = "zstd:chunked" // c/storage's compressor (harness compress), with tar-split
)

// perDir is how many entries a directory of a generated tree holds, itself included.
const perDir = 100

// treeSpec is a generated layer: a tree of groups of directories of perDir-1 entries each,
// mostly small text files (4 B to 4 KiB, log-uniform), some empty files and symlinks; or, with
// Random set, Entries files of random bytes (incompressible) at the root. The same spec always
// gives the same tar stream.
type treeSpec struct {
	Name    string
	Entries int // tar entries in all: directories, files, symlinks
	Seed    uint64
	// Random, when not 0, makes the layer Entries files of random bytes, Random bytes in all:
	// one file holds them all, several have sizes uniform around the mean.
	Random int64
}

// treeVersion changes whenever the generator's output does, so that cached blobs are rebuilt.
const treeVersion = "v1"

func (s treeSpec) key(format string) string {
	b := fmt.Appendf(nil, "%s %s %d %d %s", treeVersion, s.Name, s.Entries, s.Seed, format)
	if s.Random != 0 {
		b = fmt.Appendf(b, " random %d", s.Random)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])[:16]
}

var words = []string{"alpha", "beta", "config", "data", "util", "core", "http", "json", "test",
	"parse", "index", "cache", "model", "view", "main", "types", "errors", "client", "server", "io"}

var exts = []string{"py", "txt", "h", "conf", "js", "md", "json", "so.1", "pyc", "html"}

// writeTar writes the spec's tar stream to w and returns its size and digest (the DiffID of
// a blob that decompresses to it).
func (s treeSpec) writeTar(ctx context.Context, w io.Writer) (int64, digest.Digest, error) {
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, h)}
	tw := tar.NewWriter(cw)
	if s.Random != 0 {
		if err := s.writeRandom(ctx, tw); err != nil {
			return 0, "", err
		}
		if err := tw.Close(); err != nil {
			return 0, "", err
		}
		return cw.n, digest.NewDigest(digest.SHA256, h), nil
	}
	rng := rand.New(rand.NewPCG(s.Seed, 1))
	mtime := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	buf := make([]byte, 4096)
	n := 0
	dir := func(name string) error {
		n++
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: mtime})
	}
	for g := 0; n < s.Entries; g++ {
		if err := ctx.Err(); err != nil {
			return 0, "", err
		}
		gdir := fmt.Sprintf("g%03d_site-packages/", g)
		if err := dir(gdir); err != nil {
			return 0, "", err
		}
		for p := 0; p < perDir-1 && n < s.Entries; p++ {
			ldir := fmt.Sprintf("%spkg%05d_%s/", gdir, g*perDir+p, words[rng.IntN(len(words))])
			if err := dir(ldir); err != nil {
				return 0, "", err
			}
			for f := 0; f < perDir-1 && n < s.Entries; f++ {
				n++
				name := fmt.Sprintf("%sf%03d_%s.%s", ldir, f, words[rng.IntN(len(words))], exts[rng.IntN(len(exts))])
				hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, ModTime: mtime}
				switch r := rng.IntN(100); {
				case r < 6:
					hdr.Typeflag, hdr.Mode = tar.TypeSymlink, 0o777
					hdr.Linkname = fmt.Sprintf("../pkg%05d_module/f%03d.py", g*perDir+rng.IntN(perDir-1), rng.IntN(perDir-1))
				case r < 9: // empty
				default:
					hdr.Size = int64(math.Exp(math.Log(4) + rng.Float64()*(math.Log(4096)-math.Log(4))))
				}
				if err := tw.WriteHeader(hdr); err != nil {
					return 0, "", err
				}
				if hdr.Size > 0 {
					text(rng, buf[:hdr.Size])
					if _, err := tw.Write(buf[:hdr.Size]); err != nil {
						return 0, "", err
					}
				}
			}
		}
	}
	if err := tw.Close(); err != nil {
		return 0, "", err
	}
	return cw.n, digest.NewDigest(digest.SHA256, h), nil
}

// writeRandom writes the files of a Random spec: f0000.bin, f0001.bin, ... of random bytes,
// sizes uniform in [mean/2, 3*mean/2) except the last, which completes the total.
func (s treeSpec) writeRandom(ctx context.Context, tw *tar.Writer) error {
	rng := rand.New(rand.NewPCG(s.Seed, 2))
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(rng.Uint32())
	}
	src := rand.NewChaCha8(seed)
	mtime := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	buf := make([]byte, 1<<20)
	mean, left := s.Random/int64(s.Entries), s.Random
	for i := range s.Entries {
		size := left
		if i < s.Entries-1 {
			size = min(left, mean/2+rng.Int64N(max(mean, 1)))
		}
		left -= size
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("f%04d.bin", i), Mode: 0o644, Size: size, ModTime: mtime}); err != nil {
			return err
		}
		for size > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			p := buf[:min(size, int64(len(buf)))]
			_, _ = src.Read(p) // never fails
			if _, err := tw.Write(p); err != nil {
				return err
			}
			size -= int64(len(p))
		}
	}
	return nil
}

// text fills p with lines of words (compresses about 3-4x, like sources and docs).
func text(rng *rand.Rand, p []byte) {
	col := 0
	for i := 0; i < len(p); {
		w := words[rng.IntN(len(words))]
		i += copy(p[i:], w)
		col += len(w)
		if i < len(p) {
			if col > 70 {
				p[i], col = '\n', 0
			} else {
				p[i] = ' '
				col++
			}
			i++
		}
	}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// builtLayer is a layer blob with what its manifest descriptor and the image config say
// about it, and figures of its build.
type builtLayer struct {
	Name         string            `json:"name"`
	Format       string            `json:"format"`
	Entries      int               `json:"entries"`
	MediaType    string            `json:"mediaType"`
	Digest       digest.Digest     `json:"digest"`
	Size         int64             `json:"size"`
	Annotations  map[string]string `json:"annotations"`
	DiffID       digest.Digest     `json:"diffID"`
	TarSize      int64             `json:"tarSize"`
	TOCSize      int64             `json:"tocSize"`             // compressed, as fetched
	TOCJSONSize  int64             `json:"tocUncompressedSize"` // the JSON the daemon parses
	TarSplitSize int64             `json:"tarSplitSize"`        // compressed; zstd:chunked only
	BuildTime    float64           `json:"buildSeconds"`
	Cached       bool              `json:"-"` // loaded from -blobs, not built by this run
	Blob         []byte            `json:"-"`
}

// key is the layer key a modern runtime looks the layer up by: its TOC digest.
func (l *builtLayer) key() digest.Digest {
	if d := l.Annotations[chunked.AnnotationStargzTOCDigest]; d != "" {
		return digest.Digest(d)
	}
	return digest.Digest(l.Annotations[chunked.AnnotationChecksum])
}

func (l *builtLayer) registryLayer() testregistry.LayerBlob {
	return testregistry.LayerBlob{Blob: l.Blob, MediaType: l.MediaType, Annotations: l.Annotations, DiffID: l.DiffID}
}

// builder builds layers into a directory and reuses what it built before.
type builder struct {
	dir     string // the blob cache (-blobs)
	modDir  string // the module, for building the zstd:chunked helper
	helper  string // the helper binary, once built
	workDir string // where the helper binary goes
	logf    func(format string, args ...any)
}

// build returns the layer of spec in format, from the cache or built now.
func (b *builder) build(ctx context.Context, s treeSpec, format string) (*builtLayer, error) {
	stem := filepath.Join(b.dir, fmt.Sprintf("%s-%s-%s", s.Name, map[string]string{formatEStargz: "estargz", formatZstdChunked: "zstdchunked"}[format], s.key(format)))
	if l, err := loadBuilt(stem); err == nil {
		l.Cached = true
		return l, nil
	}
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return nil, err
	}
	start := time.Now()
	tarPath := stem + ".tar.tmp"
	defer os.Remove(tarPath)
	tf, err := os.Create(tarPath)
	if err != nil {
		return nil, err
	}
	bw := bufio.NewWriterSize(tf, 1<<20)
	tarSize, diffID, err := s.writeTar(ctx, bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		tf.Close()
		return nil, fmt.Errorf("%s: tar: %w", s.Name, err)
	}
	l := &builtLayer{Name: s.Name, Format: format, Entries: s.Entries, TarSize: tarSize}
	switch format {
	case formatEStargz:
		err = b.buildEStargz(ctx, tf, l, stem+".blob")
	case formatZstdChunked:
		err = b.buildZstdChunked(ctx, tf, l, stem+".blob")
		l.DiffID = diffID // the blob decompresses to the tar as it is
	default:
		err = fmt.Errorf("unknown format %q", format)
	}
	tf.Close()
	if err != nil {
		os.Remove(stem + ".blob")
		return nil, fmt.Errorf("%s (%s): %w", s.Name, format, err)
	}
	if l.Blob, err = os.ReadFile(stem + ".blob"); err != nil {
		return nil, err
	}
	l.Digest, l.Size = digest.FromBytes(l.Blob), int64(len(l.Blob))
	if err := l.measureTOC(); err != nil {
		return nil, fmt.Errorf("%s (%s): %w", s.Name, format, err)
	}
	l.BuildTime = time.Since(start).Seconds()
	js, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return nil, err
	}
	return l, os.WriteFile(stem+".json", js, 0o644)
}

// buildEStargz converts the tar with estargz.Build and its defaults (what ctr-remote and
// nerdctl produce).
func (b *builder) buildEStargz(ctx context.Context, tf *os.File, l *builtLayer, out string) error {
	st, err := tf.Stat()
	if err != nil {
		return err
	}
	eb, err := estargz.Build(io.NewSectionReader(tf, 0, st.Size()), estargz.WithContext(ctx), estargz.WithCompression(newPooledGzip()))
	if err != nil {
		return fmt.Errorf("estargz: %w", err)
	}
	defer eb.Close()
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, eb); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	usize, err := eb.UncompressedSize()
	if err != nil {
		return err
	}
	l.MediaType = "application/vnd.oci.image.layer.v1.tar+gzip"
	l.Annotations = map[string]string{
		chunked.AnnotationStargzTOCDigest:  eb.TOCDigest().String(),
		chunked.AnnotationUncompressedSize: strconv.FormatInt(usize, 10),
	}
	l.DiffID = eb.DiffID()
	return nil
}

// gzipLevel is estargz's default, what ctr-remote and nerdctl write.
const gzipLevel = gzip.BestCompression

// pooledGzip is estargz's gzip compression at its default level (9) with the writers reused:
// estargz.Build makes a gzip member per file, and a new compress/flate writer for each of a
// million files spends most of the build allocating. The blob is the same, byte for byte.
type pooledGzip struct {
	*estargz.GzipCompressor
	*estargz.GzipDecompressor
	pool sync.Pool
}

func newPooledGzip() *pooledGzip {
	return &pooledGzip{GzipCompressor: estargz.NewGzipCompressorWithLevel(gzipLevel), GzipDecompressor: &estargz.GzipDecompressor{}}
}

func (p *pooledGzip) Writer(w io.Writer) (estargz.WriteFlushCloser, error) {
	if z, ok := p.pool.Get().(*gzip.Writer); ok {
		z.Reset(w)
		return &pooledWriter{z, p}, nil
	}
	z, err := gzip.NewWriterLevel(w, gzipLevel)
	if err != nil {
		return nil, err
	}
	return &pooledWriter{z, p}, nil
}

// pooledWriter returns its gzip writer to the pool when closed (estargz drops it then).
type pooledWriter struct {
	*gzip.Writer
	p *pooledGzip
}

func (w *pooledWriter) Close() error {
	err := w.Writer.Close()
	w.p.pool.Put(w.Writer)
	return err
}

// buildZstdChunked pipes the tar through `harness compress`: c/storage's own compressor, in the
// e2e harness's module (the layerstore module does not depend on c/storage).
func (b *builder) buildZstdChunked(ctx context.Context, tf *os.File, l *builtLayer, out string) error {
	if b.helper == "" {
		bin := filepath.Join(b.workDir, "harness")
		b.logf("building the e2e harness (c/storage's zstd:chunked compressor)")
		if err := harness.Build(ctx, b.modDir, bin); err != nil {
			return err
		}
		b.helper = bin
	}
	if _, err := tf.Seek(0, io.SeekStart); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, b.helper, "compress", "--timeout", "30m", out)
	cmd.Stdin, cmd.Stderr = tf, os.Stderr
	js, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("harness compress: %w", err)
	}
	var res struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(js, &res); err != nil {
		return fmt.Errorf("harness compress: %w", err)
	}
	l.Annotations = res.Annotations
	if l.Annotations[chunked.AnnotationChecksum] == "" {
		return errors.New("harness compress: no TOC checksum annotation")
	}
	l.MediaType = "application/vnd.oci.image.layer.v1.tar+zstd"
	return nil
}

// measureTOC finds the TOC as the daemon does (descriptor, footer) and records its
// compressed and uncompressed sizes, decompressing it without the parser's size limit.
func (l *builtLayer) measureTOC() error {
	lay, err := chunked.Classify(chunked.Descriptor{MediaType: l.MediaType, Digest: l.Digest, Size: l.Size, Annotations: l.Annotations})
	if err != nil {
		return fmt.Errorf("classify: %w", err)
	}
	if err := lay.ApplyFooter(l.Blob[max(0, l.Size-chunked.TailSize(lay.Format)):]); err != nil {
		return fmt.Errorf("footer: %w", err)
	}
	toc := lay.TOC
	js, err := chunked.ExtractTOC(lay, l.Blob[toc.Offset:toc.End()], chunked.Limits{MaxTOCSize: 1 << 40})
	if err != nil {
		return fmt.Errorf("TOC: %w", err)
	}
	l.TarSplitSize = lay.TarSplit.Length
	l.TOCSize, l.TOCJSONSize = toc.Length, int64(len(js))
	return nil
}

func loadBuilt(stem string) (*builtLayer, error) {
	js, err := os.ReadFile(stem + ".json")
	if err != nil {
		return nil, err
	}
	var l builtLayer
	if err := json.Unmarshal(js, &l); err != nil {
		return nil, err
	}
	if l.Blob, err = os.ReadFile(stem + ".blob"); err != nil {
		return nil, err
	}
	if int64(len(l.Blob)) != l.Size || digest.FromBytes(l.Blob) != l.Digest {
		return nil, fmt.Errorf("%s.blob: not the blob recorded", stem)
	}
	return &l, nil
}
