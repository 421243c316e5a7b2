package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/benchmarks/internal/synth"
	"github.com/layerstore/layerstore/chunked"
)

// genFile is one regular file of a generated layer.
type genFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	Kind string `json:"kind"`
	seed uint64
}

// layerSpec describes a generated layer. The same spec always gives the same tar stream.
type layerSpec struct {
	Name  string
	Seed  uint64
	Files []genFile // in tar order
	Links int       // symlinks added among the files
	Empty int       // empty files
	// Level is the gzip level; 0 means estargz's default (BestCompression), which is what
	// ctr-remote and nerdctl produce.
	Level int
}

// rootfsSpec is a rootfs-like layer: many small text-ish files in a deep tree, a hundred
// library-sized binaries and a few large files of each kind.
func rootfsSpec(seed uint64, small, medium int, large int64) layerSpec {
	rng := rand.New(rand.NewPCG(seed, 1))
	s := layerSpec{Name: "rootfs", Seed: seed, Links: small / 30, Empty: small / 100}
	dirs := []string{"etc", "usr/share/doc", "usr/share/locale", "usr/lib/python3/site-packages",
		"usr/include", "usr/share/man/man1", "usr/lib/node_modules", "var/lib/dpkg/info", "opt/app/src"}
	exts := []string{".py", ".txt", ".h", ".conf", ".js", ".md", ".list", ".1", ".json"}
	n := 0
	next := func(kind string, size int64, dir, ext string) {
		n++
		s.Files = append(s.Files, genFile{Path: fmt.Sprintf("%s/f%05d%s", dir, n, ext), Size: size, Kind: kind, seed: rng.Uint64()})
	}
	for i := range small {
		top := dirs[rng.IntN(len(dirs))]
		dir := fmt.Sprintf("%s/pkg%03d/sub%d", top, rng.IntN(120), rng.IntN(4))
		next(synth.Text, 1<<10+rng.Int64N(49<<10), dir, exts[i%len(exts)])
	}
	for range medium {
		next(synth.Binary, 64<<10+rng.Int64N(3<<20-64<<10), fmt.Sprintf("usr/lib/x86_64-linux-gnu/lib%03d", rng.IntN(40)), ".so")
	}
	if large > 0 {
		// Roughly 3/8 text (a database dump, logs), 2/8 binary, 3/8 incompressible.
		next(synth.Text, large*3/8, "var/lib/db", ".sql")
		next(synth.Binary, large*2/8, "opt/app/bin", ".bin")
		next(synth.Random, large*3/8, "opt/app/models", ".dat")
	}
	// A rootfs tar lists a directory's entries together, sorted: so does this one.
	slices.SortFunc(s.Files, func(a, b genFile) int { return strings.Compare(a.Path, b.Path) })
	return s
}

// fioSpec is a layer holding one incompressible file, the target of the fio runs.
func fioSpec(seed uint64, size int64) layerSpec {
	return layerSpec{Name: "fio", Seed: seed, Level: gzip.BestSpeed,
		Files: []genFile{{Path: "data/fio.bin", Size: size, Kind: synth.Random, seed: seed ^ 0x5eed}}}
}

// key identifies the spec's content, for reusing built blobs.
func (s layerSpec) key() string {
	h := sha256.New()
	fmt.Fprintf(h, "v1 %s %d %d %d %d\n", s.Name, s.Seed, s.Links, s.Empty, s.Level)
	for _, f := range s.Files {
		fmt.Fprintf(h, "%s %d %s %d\n", f.Path, f.Size, f.Kind, f.seed)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func (s layerSpec) uncompressed() int64 {
	var n int64
	for _, f := range s.Files {
		n += f.Size
	}
	return n
}

// builtLayer is an eStargz blob with what its manifest descriptor and config say about it.
type builtLayer struct {
	Name        string            `json:"name"`
	MediaType   string            `json:"mediaType"`
	Digest      digest.Digest     `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	DiffID      digest.Digest     `json:"diffID"`
	TarSize     int64             `json:"tarSize"`
	BuildTime   float64           `json:"buildSeconds"`
	Blob        []byte            `json:"-"`
}

func (b *builtLayer) tocDigest() digest.Digest {
	return digest.Digest(b.Annotations[chunked.AnnotationStargzTOCDigest])
}

// build writes the spec's tar stream and converts it with estargz.Build (default chunk size,
// 4 MiB; one gzip member per file). With dir set, blobs are kept there and reused.
func (s layerSpec) build(dir string) (*builtLayer, error) {
	var stem string
	if dir != "" {
		stem = filepath.Join(dir, s.Name+"-"+s.key())
		if bl, err := loadBuilt(stem); err == nil {
			return bl, nil
		}
	}
	start := time.Now()
	tarBlob, err := s.tar()
	if err != nil {
		return nil, err
	}
	opts := []estargz.Option{}
	if s.Level != 0 {
		opts = append(opts, estargz.WithCompressionLevel(s.Level))
	}
	b, err := estargz.Build(io.NewSectionReader(bytes.NewReader(tarBlob), 0, int64(len(tarBlob))), opts...)
	if err != nil {
		return nil, fmt.Errorf("estargz: %w", err)
	}
	defer b.Close()
	blob, err := io.ReadAll(b)
	if err != nil {
		return nil, err
	}
	usize, err := b.UncompressedSize()
	if err != nil {
		return nil, err
	}
	bl := &builtLayer{
		Name: s.Name, MediaType: "application/vnd.oci.image.layer.v1.tar+gzip",
		Digest: digest.FromBytes(blob), Size: int64(len(blob)),
		Annotations: map[string]string{
			chunked.AnnotationStargzTOCDigest:  b.TOCDigest().String(),
			chunked.AnnotationUncompressedSize: strconv.FormatInt(usize, 10),
		},
		DiffID: b.DiffID(), TarSize: int64(len(tarBlob)), BuildTime: time.Since(start).Seconds(), Blob: blob,
	}
	if stem != "" {
		if err := saveBuilt(stem, bl); err != nil {
			return nil, err
		}
	}
	return bl, nil
}

func loadBuilt(stem string) (*builtLayer, error) {
	js, err := os.ReadFile(stem + ".json")
	if err != nil {
		return nil, err
	}
	var bl builtLayer
	if err := json.Unmarshal(js, &bl); err != nil {
		return nil, err
	}
	if bl.Blob, err = os.ReadFile(stem + ".blob"); err != nil {
		return nil, err
	}
	if digest.FromBytes(bl.Blob) != bl.Digest {
		return nil, fmt.Errorf("%s.blob: digest mismatch", stem)
	}
	return &bl, nil
}

func saveBuilt(stem string, bl *builtLayer) error {
	if err := os.MkdirAll(filepath.Dir(stem), 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(bl, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(stem+".blob", bl.Blob, 0o644); err != nil {
		return err
	}
	return os.WriteFile(stem+".json", js, 0o644)
}

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// tar writes the spec's tar stream: directories, files, empty files and symlinks.
func (s layerSpec) tar() ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(int(s.uncompressed()) + len(s.Files)*2048)
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	var mkdirs func(d string) error
	mkdirs = func(d string) error {
		if d == "." || d == "" || seen[d] {
			return nil
		}
		if err := mkdirs(path.Dir(d)); err != nil {
			return err
		}
		seen[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	rng := rand.New(rand.NewPCG(s.Seed, 2))
	for i, f := range s.Files {
		if err := mkdirs(path.Dir(f.Path)); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Size: f.Size, Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if err := synth.Write(tw, f.Kind, f.seed, f.Size); err != nil {
			return nil, err
		}
		if s.Links > 0 && i%(len(s.Files)/s.Links+1) == 0 {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: f.Path + ".link", Linkname: path.Base(f.Path), Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if s.Empty > 0 && i%(len(s.Files)/s.Empty+1) == 1 {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%s.empty%d", f.Path, rng.IntN(100)), Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
