package testlayer

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc64"
	"strconv"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/layerstore/layerstore/chunked"
	digest "github.com/opencontainers/go-digest"
)

// SyntheticZstdChunked builds a zstd:chunked layer of n entries laid out as c/storage writes
// one (payload frames, then the TOC, the tar-split and the footer, each in a skippable frame):
// directories of 40 entries, small regular files of one chunk each, every 10th entry a
// symlink. editTOC, when not nil, changes the TOC's JSON before it is compressed and anchored
// in the annotations, as a producer lying about the metadata would: the tar-split and the
// DiffID stay those of the real tar.
func SyntheticZstdChunked(n int, editTOC func([]byte) []byte) (Fixture, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return Fixture{}, err
	}
	defer enc.Close()
	b := &zstdChunkedBuilder{enc: enc, toc: make([]byte, 0, n*200), diff: sha256.New(), crcTable: crc64.MakeTable(crc64.ISO)}
	b.tw = tar.NewWriter(&teeWriter{&b.pending, b.diff})
	b.toc = append(b.toc, `{"version":1,"entries":[`...)
	for i := range n {
		h, content := syntheticEntry(i)
		if i > 0 {
			b.toc = append(b.toc, ',')
		}
		b.appendTOCEntry(h, content)
		if err := b.writeTar(h, content); err != nil {
			return Fixture{}, err
		}
	}
	if err := b.tw.Close(); err != nil {
		return Fixture{}, err
	}
	b.record(chunked.TarSplitSegment, "", 0, b.pending.Bytes())
	return b.finish(n, editTOC), nil
}

// zstdChunkedBuilder is SyntheticZstdChunked's layer under construction.
type zstdChunkedBuilder struct {
	enc      *zstd.Encoder
	crcTable *crc64.Table

	blob     []byte       // the payload frames, then the metadata
	toc      []byte       // the TOC's JSON
	split    []byte       // the tar-split's JSON lines
	pending  bytes.Buffer // tar bytes written since the last segment record
	diff     hash.Hash    // the tar stream, for the DiffID
	tw       *tar.Writer  // writes to pending and diff
	position int          // of the next tar-split entry
}

var syntheticMtime = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

// syntheticEntry returns the header and content of entry i: entries 40k to 40k+39 are a
// directory and what it holds, small files, every 10th entry a symlink.
func syntheticEntry(i int) (*tar.Header, []byte) {
	h := &tar.Header{Mode: 0o644, ModTime: syntheticMtime, Format: tar.FormatUSTAR}
	dir := fmt.Sprintf("usr/lib/pkg%06d/", i/40)
	var content []byte
	switch {
	case i%40 == 0:
		h.Typeflag, h.Name, h.Mode = tar.TypeDir, dir, 0o755
	case i%10 == 0:
		h.Typeflag, h.Name, h.Linkname, h.Mode = tar.TypeSymlink, dir+"link"+strconv.Itoa(i), "../target.so", 0o777
	default:
		h.Typeflag, h.Name = tar.TypeReg, dir+"file"+strconv.Itoa(i)+".so"
		content = fmt.Appendf(nil, "content of file %d\n", i)
		h.Size = int64(len(content))
	}
	return h, content
}

// appendTOCEntry appends h's TOC entry and, for a regular file, its content as one payload
// frame, the chunk the entry points at.
func (b *zstdChunkedBuilder) appendTOCEntry(h *tar.Header, content []byte) {
	b.toc = append(b.toc, `{"type":"`...)
	b.toc = append(b.toc, map[byte]string{tar.TypeDir: "dir", tar.TypeSymlink: "symlink", tar.TypeReg: "reg"}[h.Typeflag]...)
	b.toc = append(b.toc, `","name":`...)
	b.toc = strconv.AppendQuote(b.toc, h.Name)
	if h.Linkname != "" {
		b.toc = append(b.toc, `,"linkName":`...)
		b.toc = strconv.AppendQuote(b.toc, h.Linkname)
	}
	b.toc = fmt.Appendf(b.toc, `,"mode":%d`, h.Mode)
	if h.Size > 0 {
		off := int64(len(b.blob))
		b.blob = b.enc.EncodeAll(content, b.blob)
		b.toc = fmt.Appendf(b.toc, `,"size":%d,"digest":"%s","offset":%d,"endOffset":%d`,
			h.Size, digest.FromBytes(content), off, len(b.blob))
	}
	b.toc = append(b.toc, `,"modtime":"2024-03-01T12:00:00Z"}`...)
}

// writeTar writes h and content to the tar stream and records them in the tar-split: the
// header's bytes as a segment, the content as a file record with its CRC-64.
func (b *zstdChunkedBuilder) writeTar(h *tar.Header, content []byte) error {
	if err := b.tw.WriteHeader(h); err != nil {
		return err
	}
	b.record(chunked.TarSplitSegment, "", 0, b.pending.Bytes())
	b.pending.Reset()
	var crc []byte
	if len(content) > 0 {
		if _, err := b.tw.Write(content); err != nil {
			return err
		}
		b.pending.Reset() // the content is a file record, not a segment
		crc = binary.BigEndian.AppendUint64(nil, crc64.Checksum(content, b.crcTable))
	}
	b.record(chunked.TarSplitFile, h.Name, h.Size, crc)
	return nil
}

// record appends a tar-split entry.
func (b *zstdChunkedBuilder) record(typ int, name string, size int64, payload []byte) {
	b.split = append(b.split, `{"type":`...)
	b.split = strconv.AppendInt(b.split, int64(typ), 10)
	if name != "" {
		b.split = append(b.split, `,"name":`...)
		b.split = strconv.AppendQuote(b.split, name)
	}
	if size > 0 {
		b.split = append(b.split, `,"size":`...)
		b.split = strconv.AppendInt(b.split, size, 10)
	}
	if payload != nil {
		b.split = append(b.split, `,"payload":"`...)
		b.split = base64.StdEncoding.AppendEncode(b.split, payload)
		b.split = append(b.split, '"')
	}
	b.split = append(b.split, `,"position":`...)
	b.split = strconv.AppendInt(b.split, int64(b.position), 10)
	b.split = append(b.split, "}\n"...)
	b.position++
}

// finish closes the TOC (editTOC changes it then, when not nil), appends the TOC, the
// tar-split and the footer to the blob, each in a skippable frame, and returns the layer of
// the n entries with the annotations that anchor them.
func (b *zstdChunkedBuilder) finish(n int, editTOC func([]byte) []byte) Fixture {
	tarSplit := b.enc.EncodeAll(b.split, nil)
	b.toc = fmt.Appendf(b.toc, `],"tarSplitDigest":"%s"}`, digest.FromBytes(tarSplit))
	if editTOC != nil {
		b.toc = editTOC(b.toc)
	}
	compressedTOC := b.enc.EncodeAll(b.toc, nil)
	tocOff := int64(len(b.blob)) + 8
	b.appendSkippable(compressedTOC)
	tsOff := int64(len(b.blob)) + 8
	b.appendSkippable(tarSplit)
	footer := make([]byte, 0, 64)
	for _, v := range []int64{tocOff, int64(len(compressedTOC)), int64(len(b.toc)), 1, tsOff, int64(len(tarSplit)), int64(len(b.split))} {
		footer = binary.LittleEndian.AppendUint64(footer, uint64(v))
	}
	b.appendSkippable(append(footer, "GNUlInUx"...))
	return Fixture{
		Name:   fmt.Sprintf("zstdchunked-synthetic-%d", n),
		Blob:   b.blob,
		DiffID: digest.NewDigest(digest.SHA256, b.diff),
		Format: chunked.ZstdChunked,
		Desc: chunked.Descriptor{MediaType: "application/vnd.oci.image.layer.v1.tar+zstd", Digest: digest.FromBytes(b.blob),
			Size: int64(len(b.blob)), Annotations: map[string]string{
				chunked.AnnotationChecksum:         digest.FromBytes(compressedTOC).String(),
				chunked.AnnotationPosition:         fmt.Sprintf("%d:%d:%d:1", tocOff, len(compressedTOC), len(b.toc)),
				chunked.AnnotationTarSplitPosition: fmt.Sprintf("%d:%d:%d", tsOff, len(tarSplit), len(b.split)),
			}},
	}
}

// appendSkippable appends p to the blob in a zstd skippable frame.
func (b *zstdChunkedBuilder) appendSkippable(p []byte) {
	b.blob = append(b.blob, 0x50, 0x2a, 0x4d, 0x18)
	b.blob = binary.LittleEndian.AppendUint32(b.blob, uint32(len(p)))
	b.blob = append(b.blob, p...)
}

type teeWriter struct {
	a, b interface{ Write([]byte) (int, error) }
}

func (t *teeWriter) Write(p []byte) (int, error) {
	t.a.Write(p) //nolint:errcheck // a bytes.Buffer and a hash never fail
	return t.b.Write(p)
}
