package demo

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
)

// Epoch is the modification time of every entry that does not set its own.
var Epoch = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

// Entry is one member of a tar stream.
type Entry struct {
	Header tar.Header
	Data   []byte
}

// Entries returns the reference layer's members in tar order: nested directories, empty and
// multi-chunk files, long zero runs, long and non-ASCII names, symlinks, hardlinks, special
// mode bits, owners, xattrs, whiteouts, opaque directories, FIFOs and devices.
func Entries() []Entry {
	rng := rand.New(rand.NewPCG(1, 2))
	var es []Entry
	dir := func(name string, mode int64, uid, gid int) {
		es = append(es, Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: gid}})
	}
	file := func(name string, mode int64, data []byte) {
		es = append(es, Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, Data: data})
	}
	dir("etc", 0o755, 0, 0)
	file("etc/hostname", 0o644, []byte("layerstore\n"))
	file("etc/empty", 0o644, nil)
	dir("usr", 0o755, 0, 0)
	dir("usr/bin", 0o755, 0, 0)
	file("usr/bin/tool", 0o4755, text(rng, 3000))
	file("usr/bin/group-tool", 0o2711, text(rng, 1500))
	dir("usr/share", 0o755, 0, 0)
	dir("usr/share/doc", 0o755, 0, 0)
	dir("usr/share/doc/deep", 0o755, 0, 0)
	dir("usr/share/doc/deep/er", 0o755, 0, 0)
	file("usr/share/doc/deep/er/README", 0o644, text(rng, 200))
	file("usr/share/big.bin", 0o644, text(rng, 900<<10))
	sparse := append(append(text(rng, 70<<10), make([]byte, 300<<10)...), text(rng, 50<<10)...)
	file("usr/share/sparse.img", 0o600, sparse)
	file("usr/share/zeros", 0o644, make([]byte, 128<<10))
	long := strings.Repeat("long-name-", 20) + "end"
	file("usr/share/"+long, 0o644, []byte("long\n"))
	file("usr/share/ünïcødé-名前.txt", 0o644, []byte("unicode\n"))
	dir("tmp", 0o1777, 0, 0)
	dir("home", 0o755, 0, 0)
	dir("home/user", 0o750, 1000, 2000)
	es = append(es, Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: "home/user/notes.txt", Mode: 0o640,
		Uid: 1000, Gid: 2000, Uname: "user", Gname: "staff", Size: 6}, Data: []byte("notes\n")})
	es = append(es, Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/ping", Mode: 0o755, Size: 4,
		PAXRecords: map[string]string{
			"SCHILY.xattr.security.capability": string([]byte{1, 0, 0, 2, 0x00, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}),
			"SCHILY.xattr.user.comment":        "pings",
		}}, Data: []byte("ping")})
	es = append(es, Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: "xdir/", Mode: 0o755,
		PAXRecords: map[string]string{"SCHILY.xattr.user.dirattr": "yes"}}})
	link := func(typ byte, name, target string) {
		es = append(es, Entry{Header: tar.Header{Typeflag: typ, Name: name, Linkname: target, Mode: 0o777}})
	}
	link(tar.TypeSymlink, "usr/bin/rel", "tool")
	link(tar.TypeSymlink, "usr/bin/abs", "/usr/bin/tool")
	link(tar.TypeSymlink, "usr/bin/dangling", "../nowhere/at/all")
	link(tar.TypeLink, "usr/bin/tool-hardlink", "usr/bin/tool")
	link(tar.TypeLink, "etc/hostname-link", "etc/hostname")
	link(tar.TypeLink, "etc/empty-link", "etc/empty")
	es = append(es, Entry{Header: tar.Header{Typeflag: tar.TypeFifo, Name: "tmp/fifo", Mode: 0o644}})
	es = append(es, Entry{Header: tar.Header{Typeflag: tar.TypeChar, Name: "etc/null", Mode: 0o666, Devmajor: 1, Devminor: 3}})
	es = append(es, Entry{Header: tar.Header{Typeflag: tar.TypeBlock, Name: "etc/loop0", Mode: 0o660, Devmajor: 7, Devminor: 0, Gid: 6}})
	// Overlay markers: a whiteout for a file of a lower layer and an opaque directory.
	file("etc/.wh.removed", 0o644, nil)
	dir("opaque", 0o755, 0, 0)
	file("opaque/.wh..wh..opq", 0o644, nil)
	file("opaque/kept", 0o644, []byte("kept\n"))
	for i := range es {
		h := &es[i].Header
		if h.ModTime.IsZero() {
			h.ModTime = Epoch.Add(time.Duration(i) * time.Second)
		}
		h.Format = tar.FormatPAX
	}
	return es
}

// Tar returns the reference layer as an uncompressed tar stream.
func Tar() []byte {
	return BuildTar(Entries())
}

// BuildTar writes entries as a tar stream. It panics on an entry archive/tar rejects: the
// entries are the program's own.
func BuildTar(es []Entry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := e.Header
		if err := tw.WriteHeader(&h); err != nil {
			panic(fmt.Sprintf("demo: header %q: %v", h.Name, err))
		}
		if _, err := tw.Write(e.Data); err != nil {
			panic(fmt.Sprintf("demo: data %q: %v", h.Name, err))
		}
	}
	if err := tw.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// text returns n bytes of compressible pseudo-random text.
func text(rng *rand.Rand, n int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 \n"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return b
}

// LayerBlob is a layer blob with what its descriptor and the image config say about it.
type LayerBlob struct {
	Blob        []byte
	MediaType   string
	Annotations map[string]string
	DiffID      digest.Digest
}

// Digest returns the digest of the blob.
func (b LayerBlob) Digest() digest.Digest { return digest.FromBytes(b.Blob) }

const mediaTypeGzip = "application/vnd.oci.image.layer.v1.tar+gzip"

// EStargz converts a tar stream with estargz.Build (64 KiB chunks, so that large files have
// several, and one worker, so that blobs are reproducible; opts come after these). The layer
// carries the TOC digest and uncompressed size annotations; its media type is gzip's, which
// the caller changes for another compression.
func EStargz(tarBlob []byte, opts ...estargz.Option) (LayerBlob, error) {
	opts = append([]estargz.Option{estargz.WithChunkSize(64 << 10), estargz.WithParallelism(1)}, opts...)
	b, err := estargz.Build(io.NewSectionReader(bytes.NewReader(tarBlob), 0, int64(len(tarBlob))), opts...)
	if err != nil {
		return LayerBlob{}, err
	}
	defer b.Close()
	blob, err := io.ReadAll(b)
	if err != nil {
		return LayerBlob{}, err
	}
	usize, err := b.UncompressedSize()
	if err != nil {
		return LayerBlob{}, err
	}
	return LayerBlob{
		Blob:      blob,
		MediaType: mediaTypeGzip,
		Annotations: map[string]string{
			chunked.AnnotationStargzTOCDigest:  b.TOCDigest().String(),
			chunked.AnnotationUncompressedSize: strconv.FormatInt(usize, 10),
		},
		DiffID: b.DiffID(),
	}, nil
}

// Gzip is a plain (not lazily pullable) gzip layer of a tar stream.
func Gzip(tarBlob []byte) (LayerBlob, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(tarBlob); err != nil {
		return LayerBlob{}, err
	}
	if err := zw.Close(); err != nil {
		return LayerBlob{}, err
	}
	return LayerBlob{Blob: b.Bytes(), MediaType: mediaTypeGzip, DiffID: digest.FromBytes(tarBlob)}, nil
}

// The reference layer as c/storage's zstd:chunked compressor writes it: a copy of the
// committed fixture chunked/testdata/fixtures/zstdchunked-modern (see chunked/testdata/gen).
// The compressor is not a dependency of the daemon: it would bring c/storage's archive and
// re-exec machinery into it.
var (
	//go:embed zstdchunked/blob
	zstdChunkedBlob []byte
	//go:embed zstdchunked/descriptor.json
	zstdChunkedDescriptor []byte
)

// ZstdChunked returns the reference layer in zstd:chunked, with the annotations c/storage
// gives it.
func ZstdChunked() (LayerBlob, error) {
	var d struct {
		MediaType   string            `json:"mediaType"`
		Digest      digest.Digest     `json:"digest"`
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(zstdChunkedDescriptor, &d); err != nil {
		return LayerBlob{}, fmt.Errorf("demo: zstd:chunked descriptor: %w", err)
	}
	l := LayerBlob{Blob: zstdChunkedBlob, MediaType: d.MediaType, Annotations: d.Annotations, DiffID: digest.FromBytes(Tar())}
	if l.Digest() != d.Digest {
		return LayerBlob{}, fmt.Errorf("demo: the zstd:chunked blob is %s, its descriptor says %s", l.Digest(), d.Digest)
	}
	return l, nil
}
