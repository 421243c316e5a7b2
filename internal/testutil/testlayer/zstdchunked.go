package testlayer

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
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
	mtime := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	crcTable := crc64.MakeTable(crc64.ISO)

	var blob []byte               // the payload frames, then the metadata
	toc := make([]byte, 0, n*200) // the TOC's JSON
	var split []byte              // the tar-split's JSON lines
	var pending bytes.Buffer      // tar bytes written since the last segment record
	diff := sha256.New()          // the tar stream, for the DiffID
	tw := tar.NewWriter(&teeWriter{&pending, diff})
	position := 0
	record := func(typ int, name string, size int64, payload []byte) {
		split = append(split, `{"type":`...)
		split = strconv.AppendInt(split, int64(typ), 10)
		if name != "" {
			split = append(split, `,"name":`...)
			split = strconv.AppendQuote(split, name)
		}
		if size > 0 {
			split = append(split, `,"size":`...)
			split = strconv.AppendInt(split, size, 10)
		}
		if payload != nil {
			split = append(split, `,"payload":"`...)
			split = base64.StdEncoding.AppendEncode(split, payload)
			split = append(split, '"')
		}
		split = append(split, `,"position":`...)
		split = strconv.AppendInt(split, int64(position), 10)
		split = append(split, "}\n"...)
		position++
	}
	toc = append(toc, `{"version":1,"entries":[`...)
	dir := ""
	for i := range n {
		h := &tar.Header{Mode: 0o644, ModTime: mtime, Format: tar.FormatUSTAR}
		var content []byte
		switch {
		case i%40 == 0:
			dir = fmt.Sprintf("usr/lib/pkg%06d/", i/40)
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, dir, 0o755
		case i%10 == 0:
			h.Typeflag, h.Name, h.Linkname, h.Mode = tar.TypeSymlink, dir+"link"+strconv.Itoa(i), "../target.so", 0o777
		default:
			h.Typeflag, h.Name = tar.TypeReg, dir+"file"+strconv.Itoa(i)+".so"
			content = fmt.Appendf(nil, "content of file %d\n", i)
			h.Size = int64(len(content))
		}
		if i > 0 {
			toc = append(toc, ',')
		}
		toc = append(toc, `{"type":"`...)
		toc = append(toc, map[byte]string{tar.TypeDir: "dir", tar.TypeSymlink: "symlink", tar.TypeReg: "reg"}[h.Typeflag]...)
		toc = append(toc, `","name":`...)
		toc = strconv.AppendQuote(toc, h.Name)
		if h.Linkname != "" {
			toc = append(toc, `,"linkName":`...)
			toc = strconv.AppendQuote(toc, h.Linkname)
		}
		toc = fmt.Appendf(toc, `,"mode":%d`, h.Mode)
		if h.Size > 0 {
			off := int64(len(blob))
			blob = enc.EncodeAll(content, blob)
			toc = fmt.Appendf(toc, `,"size":%d,"digest":"%s","offset":%d,"endOffset":%d`,
				h.Size, digest.FromBytes(content), off, len(blob))
		}
		toc = append(toc, `,"modtime":"2024-03-01T12:00:00Z"}`...)

		if err := tw.WriteHeader(h); err != nil {
			return Fixture{}, err
		}
		record(chunked.TarSplitSegment, "", 0, pending.Bytes())
		pending.Reset()
		var crc []byte
		if len(content) > 0 {
			if _, err := tw.Write(content); err != nil {
				return Fixture{}, err
			}
			pending.Reset() // the content is a file record, not a segment
			crc = binary.BigEndian.AppendUint64(nil, crc64.Checksum(content, crcTable))
		}
		record(chunked.TarSplitFile, h.Name, h.Size, crc)
	}
	if err := tw.Close(); err != nil {
		return Fixture{}, err
	}
	record(chunked.TarSplitSegment, "", 0, pending.Bytes())

	tarSplit := enc.EncodeAll(split, nil)
	toc = fmt.Appendf(toc, `],"tarSplitDigest":"%s"}`, digest.FromBytes(tarSplit))
	if editTOC != nil {
		toc = editTOC(toc)
	}
	compressedTOC := enc.EncodeAll(toc, nil)
	skippable := func(b []byte) {
		blob = append(blob, 0x50, 0x2a, 0x4d, 0x18)
		blob = binary.LittleEndian.AppendUint32(blob, uint32(len(b)))
		blob = append(blob, b...)
	}
	tocOff := int64(len(blob)) + 8
	skippable(compressedTOC)
	tsOff := int64(len(blob)) + 8
	skippable(tarSplit)
	footer := make([]byte, 0, 64)
	for _, v := range []int64{tocOff, int64(len(compressedTOC)), int64(len(toc)), 1, tsOff, int64(len(tarSplit)), int64(len(split))} {
		footer = binary.LittleEndian.AppendUint64(footer, uint64(v))
	}
	skippable(append(footer, "GNUlInUx"...))
	return Fixture{
		Name:   fmt.Sprintf("zstdchunked-synthetic-%d", n),
		Blob:   blob,
		DiffID: digest.NewDigest(digest.SHA256, diff),
		Format: chunked.ZstdChunked,
		Desc: chunked.Descriptor{MediaType: "application/vnd.oci.image.layer.v1.tar+zstd", Digest: digest.FromBytes(blob),
			Size: int64(len(blob)), Annotations: map[string]string{
				chunked.AnnotationChecksum:         digest.FromBytes(compressedTOC).String(),
				chunked.AnnotationPosition:         fmt.Sprintf("%d:%d:%d:1", tocOff, len(compressedTOC), len(toc)),
				chunked.AnnotationTarSplitPosition: fmt.Sprintf("%d:%d:%d", tsOff, len(tarSplit), len(split)),
			}},
	}, nil
}

type teeWriter struct {
	a, b interface{ Write([]byte) (int, error) }
}

func (t *teeWriter) Write(p []byte) (int, error) {
	t.a.Write(p) //nolint:errcheck // a bytes.Buffer and a hash never fail
	return t.b.Write(p)
}
