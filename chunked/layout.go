package chunked

import (
	"fmt"
	"strconv"
	"strings"

	digest "github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/byterange"
)

// Annotation keys that lazy-pullable layers carry in their descriptors.
const (
	// AnnotationStargzTOCDigest is the digest of the uncompressed TOC JSON of eStargz and
	// stargz-flavoured zstd layers.
	AnnotationStargzTOCDigest = "containerd.io/snapshot/stargz/toc.digest"
	// AnnotationUncompressedSize is the size of the uncompressed tar of an eStargz layer.
	AnnotationUncompressedSize = "io.containers.estargz.uncompressed-size"
	// AnnotationLegacyChecksum is the digest of the compressed TOC of legacy zstd:chunked
	// layers (c/storage <= 1.43), also written by stargz tools for stargz-flavoured zstd.
	AnnotationLegacyChecksum = "io.containers.zstd-chunked.manifest-checksum"
	// AnnotationLegacyPosition locates the TOC of legacy zstd:chunked layers.
	AnnotationLegacyPosition = "io.containers.zstd-chunked.manifest-position"
	// AnnotationChecksum is the digest of the compressed TOC of zstd:chunked layers.
	AnnotationChecksum = "io.github.containers.zstd-chunked.manifest-checksum"
	// AnnotationPosition locates the TOC of zstd:chunked layers.
	AnnotationPosition = "io.github.containers.zstd-chunked.manifest-position"
	// AnnotationTarSplitPosition locates the tar-split of zstd:chunked layers.
	AnnotationTarSplitPosition = "io.github.containers.zstd-chunked.tarsplit-position"
	// AnnotationTarSplitChecksum is the digest of the compressed tar-split, written by
	// c/storage 1.47 to 1.53 (later versions name it in the TOC instead).
	AnnotationTarSplitChecksum = "io.github.containers.zstd-chunked.tarsplit-checksum"
)

// Format is a lazy-pullable layer format.
type Format uint8

// The formats, in the order they appeared.
const (
	FormatUnknown     Format = iota
	EStargz                  // eStargz: gzip members, TOC digest over the uncompressed JSON
	StargzZstd               // eStargz layout with zstd frames (estargz/zstdchunked)
	ZstdChunkedLegacy        // c/storage <= 1.43: io.containers.* keys, 40-byte footer
	ZstdChunked              // c/storage >= 1.44: io.github.containers.* keys, tar-split from 1.50
)

func (f Format) String() string {
	switch f {
	case EStargz:
		return "estargz"
	case StargzZstd:
		return "estargz-zstd"
	case ZstdChunkedLegacy:
		return "zstd:chunked-legacy"
	case ZstdChunked:
		return "zstd:chunked"
	}
	return "unknown"
}

// Zstd reports whether the format's frames are zstd (otherwise gzip).
func (f Format) Zstd() bool { return f != EStargz }

// StargzTOC reports whether the TOC digest is taken over the uncompressed JSON (eStargz
// family) rather than over the compressed bytes (zstd:chunked family).
func (f Format) StargzTOC() bool { return f == EStargz || f == StargzZstd }

// Descriptor is what a manifest says about a layer.
type Descriptor struct {
	MediaType   string
	Digest      digest.Digest
	Size        int64
	Annotations map[string]string
}

// Layout says where the parts of a lazy-pullable blob are. It starts from the descriptor
// ([Classify]) and is completed and cross-checked by the footer ([Layout.ApplyFooter]).
type Layout struct {
	Format     Format
	BlobDigest digest.Digest
	BlobSize   int64
	// TOCDigest is the digest anchored in the manifest: over the uncompressed JSON for the
	// eStargz family, over the compressed TOC bytes for zstd:chunked.
	TOCDigest digest.Digest
	// LegacyChecksum is the digest of the compressed TOC that stargz tools also write for
	// stargz-flavoured zstd layers; empty when absent.
	LegacyChecksum digest.Digest
	// TOC is where the TOC is in the blob: for eStargz the gzip member holding the
	// stargz.index.json tar entry, otherwise the zstd frame after the skippable-frame header.
	// Its Length is zero until known.
	TOC             byterange.Range
	TOCUncompressed int64 // 0 when unknown
	// TarSplit is where the tar-split is (zstd:chunked >= 1.50); zero Length when absent.
	TarSplit             byterange.Range
	TarSplitUncompressed int64
	// TarSplitChecksum is the tar-split digest from the annotation; empty when absent.
	TarSplitChecksum digest.Digest
}

// mediaTypes maps the layer media types a lazy format can use to whether they are zstd.
var mediaTypes = map[string]bool{
	"application/vnd.oci.image.layer.v1.tar+gzip":                  false,
	"application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": false,
	"application/vnd.docker.image.rootfs.diff.tar.gzip":            false,
	"application/vnd.docker.image.rootfs.foreign.diff.tar.gzip":    false,
	"application/vnd.oci.image.layer.v1.tar+zstd":                  true,
	"application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": true,
}

func notLazy(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotLazy, fmt.Sprintf(format, args...))
}

// Classify decides from a layer descriptor whether the layer is lazily pullable and in which
// format. Errors wrap [ErrNotLazy] and say why; a malformed annotation also wraps [ErrInvalid].
func Classify(d Descriptor) (*Layout, error) {
	zstd, ok := mediaTypes[d.MediaType]
	if !ok {
		return nil, notLazy("media type %q is not a gzip or zstd layer", d.MediaType)
	}
	if err := d.Digest.Validate(); err != nil || d.Digest.Algorithm() != digest.SHA256 {
		return nil, notLazy("blob digest %q is not a valid sha256 digest", d.Digest)
	}
	if d.Size <= 0 {
		return nil, notLazy("blob size %d", d.Size)
	}
	a := d.Annotations
	l := &Layout{BlobDigest: d.Digest, BlobSize: d.Size}
	modern, hasModern := a[AnnotationChecksum]
	stargz, hasStargz := a[AnnotationStargzTOCDigest]
	legacy, hasLegacy := a[AnnotationLegacyChecksum]
	var tocDigest string
	switch {
	case hasModern && hasStargz:
		return nil, notLazy("both %s and %s are set", AnnotationChecksum, AnnotationStargzTOCDigest)
	case hasModern:
		if !zstd {
			return nil, notLazy("zstd:chunked annotations on a %s layer", d.MediaType)
		}
		l.Format, tocDigest = ZstdChunked, modern
	case hasStargz && zstd:
		l.Format, tocDigest = StargzZstd, stargz
		if hasLegacy {
			dg, err := parseDigest(legacy)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrNotLazy, AnnotationLegacyChecksum, err)
			}
			l.LegacyChecksum = dg
		}
	case hasStargz:
		l.Format, tocDigest = EStargz, stargz
	case hasLegacy:
		if !zstd {
			return nil, notLazy("zstd:chunked annotations on a %s layer", d.MediaType)
		}
		l.Format, tocDigest = ZstdChunkedLegacy, legacy
	default:
		return nil, notLazy("no TOC digest annotation")
	}
	dg, err := parseDigest(tocDigest)
	if err != nil {
		return nil, fmt.Errorf("%w: TOC digest: %w", ErrNotLazy, err)
	}
	l.TOCDigest = dg

	posKey := AnnotationLegacyPosition
	if l.Format == ZstdChunked {
		posKey = AnnotationPosition
	}
	if p, ok := a[posKey]; ok && l.Format != EStargz {
		r, u, err := ParsePosition(p, true, d.Size)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrNotLazy, posKey, err)
		}
		l.TOC, l.TOCUncompressed = r, u
	}
	if c, ok := a[AnnotationTarSplitChecksum]; ok && l.Format == ZstdChunked {
		dg, err := parseDigest(c)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrNotLazy, AnnotationTarSplitChecksum, err)
		}
		l.TarSplitChecksum = dg
	}
	if p, ok := a[AnnotationTarSplitPosition]; ok && l.Format == ZstdChunked {
		r, u, err := ParsePosition(p, false, d.Size)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrNotLazy, AnnotationTarSplitPosition, err)
		}
		l.TarSplit, l.TarSplitUncompressed = r, u
	}
	return l, nil
}

func parseDigest(s string) (digest.Digest, error) {
	d, err := digest.Parse(s)
	if err != nil {
		return "", invalidf("digest %q: %v", s, err)
	}
	if d.Algorithm() != digest.SHA256 {
		return "", invalidf("digest %q: only sha256 is supported", s)
	}
	return d, nil
}

// ParsePosition parses a position annotation: "offset:length:uncompressedLength:type" for a
// TOC (manifest), where type must be 1, or "offset:length:uncompressedLength" for a tar-split.
// The range must lie inside a blob of blobSize bytes.
func ParsePosition(s string, manifest bool, blobSize int64) (byterange.Range, int64, error) {
	fields := strings.Split(s, ":")
	want := 3
	if manifest {
		want = 4
	}
	if len(fields) != want {
		return byterange.Range{}, 0, invalidf("position %q: want %d fields", s, want)
	}
	var v [4]int64
	for i, f := range fields {
		if f == "" || len(f) > 19 || strings.TrimLeft(f, "0123456789") != "" {
			return byterange.Range{}, 0, invalidf("position %q: field %d is not a decimal number", s, i+1)
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return byterange.Range{}, 0, invalidf("position %q: %v", s, err)
		}
		v[i] = n
	}
	if manifest && v[3] != 1 {
		return byterange.Range{}, 0, invalidf("position %q: manifest type %d is not a TOC", s, v[3])
	}
	r := byterange.Range{Offset: v[0], Length: v[1]}
	if r.Length <= 0 || r.Offset > blobSize || r.Length > blobSize-r.Offset {
		return byterange.Range{}, 0, invalidf("position %q: range outside the %d-byte blob", s, blobSize)
	}
	return r, v[2], nil
}
